"""The OpenAI-compatible HTTP API over the chat session (FastAPI): what other tools talk to."""
