"""The ``specchat`` command and its subcommands."""
from .main import main

__all__ = ["main"]
