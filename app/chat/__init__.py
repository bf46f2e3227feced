"""The chat session below any UI: the loaded pair, answers and comparisons as snapshot streams, conversations,
settings and how they are saved."""
