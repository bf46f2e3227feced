"""The Gradio chat app (imports Gradio; nothing below app.engine may import this package)."""
