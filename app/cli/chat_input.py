"""What `specchat chat` reads: lines edited with readline (arrows, Ctrl-A/E, Up for an earlier message, history
kept across sessions in the data dir), and the slash commands, which never go to the model."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ..paths import data_dir

HELP = """Commands:
  /help          this list
  /reset         start the conversation over (/clear too)
  /quit          leave (/exit, /bye, Ctrl-D)
Ctrl-C stops an answer and keeps what came. Up and Down recall earlier messages. A message that starts with '/'
is sent as '//...'."""
_COMMANDS = {"/help": "help", "/?": "help", "/reset": "reset", "/clear": "reset",
             "/quit": "quit", "/exit": "quit", "/bye": "quit"}
HISTORY_LINES = 1000


@dataclass(frozen=True)
class Line:
    """One line typed: a message for the model (``text``), or a command (``command``: help, reset, quit)."""
    text: str = ""
    command: str = ""
    unknown: str = ""  # a slash word that is no command: said so, sent nowhere

    @property
    def reply(self) -> str:
        """What the chat itself answers (help, an unknown command, a reset), printed instead of sending."""
        if self.unknown:
            return f"Unknown command {self.unknown}: /help lists them ('//' sends a message that starts with '/')."
        return HELP if self.command == "help" else "(a new conversation)" if self.command == "reset" else ""


def parse(raw: str) -> Line:
    line = raw.strip()
    if line.startswith("//"):
        return Line(text=line[1:])
    if line.startswith("/"):
        word = line.split()[0].lower()
        return Line(command=_COMMANDS[word]) if word in _COMMANDS else Line(unknown=word)
    return Line(text=line)


class LineReader:
    """``input()`` with readline's editing where the terminal has it (not Windows' plain console, not a pipe)."""

    def __init__(self):
        self._readline = None
        self._history = data_dir() / "chat_history"
        if not sys.stdin.isatty():
            return
        try:
            import readline
        except ImportError:  # (Windows without pyreadline: plain input, still usable)
            return
        self._readline = readline
        try:
            readline.read_history_file(self._history)
        except OSError:  # (none yet, or unreadable: start a new one)
            pass
        readline.set_history_length(HISTORY_LINES)

    def read(self, prompt: str = "> ") -> str:
        """The next line; EOFError at Ctrl-D."""
        line = input(prompt)
        if self._readline is not None and line.strip():
            try:
                self._history.parent.mkdir(parents=True, exist_ok=True)
                self._readline.write_history_file(self._history)  # at once: a killed chat keeps its history
            except OSError:
                pass
        return line
