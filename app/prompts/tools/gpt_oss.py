"""gpt-oss's harmony messages: a call is a commentary message addressed ``to=functions.NAME``."""
from __future__ import annotations

import json
import re

from ...engine.grammar import Grammar
from .base import Format, ToolCall, call_id, json_rule


class GptOss(Format):
    """gpt-oss's harmony messages: a call is a commentary message addressed ``to=functions.NAME`` with JSON after
    ``<|message|>``, ended by ``<|call|>`` (an end of generation); the answer is the ``final`` channel's message,
    the reasoning the ``analysis`` channel's. One call per answer, as its template renders only the first."""

    name = "gpt-oss (harmony)"
    open = " to=functions."
    markers = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")
    parallel = False

    def grammar(self, tools, choice, vocab, thinking=False):
        """Any harmony messages, or messages up to ``to=functions.`` and then one call: the function's name, the
        content type either way gpt-oss writes it, and the arguments of its schema."""
        lit = vocab.lit
        usable = choice.usable(tools)
        fns = [f"f{i}: {json.dumps(t.name)} tail {lit('<|message|>')} {json_rule(t.parameters)}"
               for i, t in enumerate(usable)]
        rules = [
            "fn: " + " | ".join(f"f{i}" for i in range(len(usable))),
            f'tail: " " {lit("<|constrain|>")} "json" | {lit("<|channel|>")} "commentary" '
            f'(" json" | " " {lit("<|constrain|>")} "json")',
            "sp: " + " | ".join(lit(m) for m in self.markers),
            "free: FT? (sp FT?)*",
            "lead: (FT? sp)* lt",
            f"lt[suffix={json.dumps(self.open)}]: /(.|\\n)*/",
            f"FT: /(.|\\n)+/ & ~/(.|\\n)*{re.escape(self.open.strip())}(.|\\n)*/",
        ]
        # (required: the call at once, on the commentary channel)
        start = (f'start: {lit("<|channel|>")} "commentary to=functions." fn' if choice.mode == "required"
                 else "start: free | lead fn")
        return Grammar.lark("\n".join([start, *fns, *rules]), "tools")

    def parse(self, text, tools):
        final = self.visible(text)
        found = re.search(r"to=functions\.([^\s<]+).*?<\|message\|>(.*)$", text, flags=re.S)
        if not found:
            return final, []
        try:
            args = json.loads(found.group(2))
        except json.JSONDecodeError:
            return final, []
        return final, [ToolCall(call_id(), found.group(1), json.dumps(args, ensure_ascii=False))]

    @staticmethod
    def visible(text: str) -> str:
        """What the person is shown: the final channel's message (so far)."""
        found = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", text, flags=re.S)
        return found.group(1) if found else ""

    def write(self, name, arguments):
        return (f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>"
                f"{json.dumps(arguments, ensure_ascii=False)}<|call|>")
