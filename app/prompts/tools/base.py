"""What every tool-call format shares: the tools, calls and choice an API request gives, what a grammar needs of
the vocabulary (``Vocab``), the ``Format`` a family's writing follows, and the Lark helpers the formats build on."""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from ...engine.grammar import JSON_LAYOUT, Grammar


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"  # auto, none, required
    name: str | None = None  # a named function (mode "required")
    parallel: bool = True

    def usable(self, tools: list[Tool]) -> list[Tool]:
        """The tools a call may name: the named function's, or all."""
        return [t for t in tools if self.name in (None, t.name)]


def call_id() -> str:
    """Nine letters and digits: the length Mistral's templates require of an id (others ignore ids)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


@dataclass(frozen=True)
class Vocab:
    """What a grammar needs of the vocabulary: which markers are one special token (named by id: llguidance reads
    such a token as a token, never as the bytes of its text) and the end-of-generation tokens."""

    specials: dict[str, int]
    eog: tuple[int, ...]

    def lit(self, text: str) -> str:
        return f"<[{self.specials[text]}]>" if text in self.specials else json.dumps(text)


def json_rule(schema) -> str:
    """A Lark rule body for JSON following ``schema`` (any JSON where it is no object), in ``JSON_LAYOUT``."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT}) if isinstance(schema, dict) else "%json {}"


class Format:
    """How a family writes calls: a marker that opens them (``open``), the grammar of what follows it
    (``calls``), a parser, and how a call is written back into a conversation."""

    name = ""
    open = ""
    close = ""
    markers: tuple[str, ...] = ()  # texts a vocabulary may hold as one special token
    parallel = True  # the family can make several calls in one answer

    def grammar(self, tools: list[Tool], choice: ToolChoice, vocab: Vocab, thinking: bool = False) -> Grammar | None:
        """``thinking``: the prompt leaves the model inside an open reasoning block (Qwen3.5's template opens
        <think>): a required call comes after what it writes first."""
        usable = choice.usable(tools)
        calls, rules = self.calls(usable, choice.parallel and self.parallel, vocab)
        op = vocab.lit(self.open)
        if choice.mode == "required" and not thinking:  # the call from the first token
            start = f"start: {op} {calls}"
        elif self.open in vocab.specials:  # free text is any token but the marker; it ends where the marker comes
            free = ",".join(map(str, (vocab.specials[self.open], *vocab.eog)))
            first = "free" if choice.mode == "required" else "free | free"
            start = f"start: {first} {op} {calls}\nfree: <[^{free}]>*"
        elif choice.mode == "required":
            start = f"start: text {calls}\ntext[suffix={json.dumps(self.open)}]: /(.|\\n)*/"
        else:  # free text without the marker, or text up to and with the marker, then calls
            start = (f"start: FREE | text {calls}\n"
                     f"text[suffix={json.dumps(self.open)}]: /(.|\\n)*/\n"
                     f"FREE: /(.|\\n)*/ & ~/(.|\\n)*{re.escape(self.open)}(.|\\n)*/")
        return Grammar.lark(f"{start}\n{rules}", "tools")

    def calls(self, tools: list[Tool], parallel: bool, vocab: Vocab) -> tuple[str, str]:
        """The Lark of what follows the marker (all the calls), and the rules it uses."""
        raise NotImplementedError

    def parse(self, text: str, tools: list[Tool]) -> tuple[str, list[ToolCall]]:
        """The text before the first call, and the calls; an answer whose calls do not parse is all text."""
        start = text.find(self.open)
        if start < 0:
            return text, []
        try:
            calls = [ToolCall(call_id(), name, json.dumps(args, ensure_ascii=False))
                     for name, args in self.read(text[start:], tools)]
        except (ValueError, KeyError, TypeError):
            return text, []
        return (text[:start], calls) if calls else (text, [])  # (whitespace before a call kept, as llama.cpp)

    def read(self, text: str, tools: list[Tool]) -> list[tuple[str, dict]]:
        raise NotImplementedError

    def visible(self, text: str) -> str:
        """What a stream shows of the answer so far: the text before a call (and before what may begin one)."""
        at = text.find(self.open)
        if at >= 0:
            return text[:at]
        keep = next((n for n in range(min(len(self.open) - 1, len(text)), 0, -1) if self.open.startswith(text[-n:])),
                    0)
        return text[: len(text) - keep]

    def write(self, name: str, arguments: dict) -> str:
        raise NotImplementedError


def sequence_rules(a: str, b: str, items: list[tuple[str, str]], required: set, sep: str) -> list[str]:
    """Rules for items in order, the optional ones left out with their separator (Gemma 4's object keys, LFM2's
    keyword arguments): a_j (nothing written yet) and b_j (something written, a separator first) derive the items
    from the j-th on."""
    rules = []
    for j, (key, item) in enumerate(items):
        last = j + 1 == len(items)
        if key in required:
            first = item if last else f"{item} {b}_{j + 1}"
            then = f"{sep} {item}" if last else f"{sep} {item} {b}_{j + 1}"
        else:
            first = f"({item})?" if last else f"{item} {b}_{j + 1} | {a}_{j + 1}"
            then = f"({sep} {item})?" if last else f"({sep} {item})? {b}_{j + 1}"
        rules += [f"{a}_{j}: {first}", f"{b}_{j}: {then}"]
    return rules
