"""`specchat chat`'s conversation: the lines it reads, edited with readline (arrows, Ctrl-A/E, Up for an earlier
message, history kept across sessions in the data dir), the slash commands, which never go to the model, and the
loop that sends each message and prints its answer as it streams."""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

from ..engine import Done, EngineError, Stats, TextDelta
from ..paths import data_dir

HELP = """Commands:
  /help          this list
  /reset         start the conversation over (/clear too)
  /continue      go on with the last answer, where the token limit or Ctrl-C cut it
  /quit          leave (/exit, /bye, Ctrl-D)
Ctrl-C stops an answer and keeps what came. Up and Down recall earlier messages. A message that starts with '/'
is sent as '//...'."""
_COMMANDS = {"/help": "help", "/?": "help", "/reset": "reset", "/clear": "reset",
             "/continue": "continue", "/quit": "quit", "/exit": "quit", "/bye": "quit"}
HISTORY_LINES = 1000


@dataclass(frozen=True)
class Line:
    """One line typed: a message for the model (``text``), or a command (``command``: help, reset, continue,
    quit)."""
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


def converse(answer: Callable[[list[dict], threading.Event], Iterator], summary: Callable[[Stats], str],
             system: str = "", content: Callable[[str, bool], str | list[dict]] = lambda text, first: text) -> int:
    """Read, answer, print, until /quit or Ctrl-D. ``answer(messages, cancel)`` streams the engine's events (a
    last message of the assistant's is continued: /continue); ``summary(stats)`` is each answer's last line;
    ``content(text, first)`` makes a message's content (the first may carry images)."""
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    print("SpecChat — type a message, /help for commands, Ctrl-D to quit.", file=sys.stderr)
    reader = LineReader()
    while True:
        try:
            line = parse(reader.read("> "))
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.command == "quit":
            return 0
        if line.command == "reset":
            messages = messages[:1] if system else []
        if line.reply:
            print(line.reply, file=sys.stderr)
        going_on = line.command == "continue"
        if going_on and not (messages and messages[-1]["role"] == "assistant"):
            print("Nothing to continue yet: /continue goes on with the last answer.", file=sys.stderr)
            continue
        if not (line.text or going_on):
            continue
        if not going_on:
            first = not any(m["role"] == "user" for m in messages)
            messages.append({"role": "user", "content": content(line.text, first)})
        cancel = threading.Event()
        reply = ""
        try:
            for ev in answer(messages, cancel):
                if isinstance(ev, TextDelta):
                    reply += ev.text
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
                elif isinstance(ev, Done):
                    print("\n" + summary(ev.stats), file=sys.stderr)
                    if ev.stats.error:
                        print(f"specchat: {ev.stats.error}; the partial answer is kept.", file=sys.stderr)
        except KeyboardInterrupt:  # stop this answer, keep the conversation
            cancel.set()
            print("\n[stopped]", file=sys.stderr)
        except EngineError as exc:
            if not going_on:
                messages.pop()
            print(f"\nspecchat: error: {exc}", file=sys.stderr)
            continue
        if going_on:
            messages[-1] = {"role": "assistant", "content": messages[-1]["content"] + reply}
        else:
            messages.append({"role": "assistant", "content": reply})
