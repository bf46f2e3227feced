"""Errors the engine raises for problems a user can fix (bad file, bad setting, full context)."""


class EngineError(Exception):
    """A problem explained in plain words; the CLI and UI show the message as-is, without a traceback."""


class ModelsUnloaded(EngineError):
    """The models were freed (another pair was loaded) while a generation waited for its turn."""
