"""Mistral's ``[TOOL_CALLS]NAME[ARGS]{...}`` calls (Ministral 3, Magistral, Devstral)."""
from __future__ import annotations

import json

from .base import Format, json_rule


class Mistral(Format):
    """``[TOOL_CALLS]NAME[ARGS]{...}``, the marker before each call (Ministral 3, Magistral, Devstral): control
    tokens in Mistral's vocabulary, named by id in the grammar and written out in the answer's text to be read."""

    name = "Mistral ([TOOL_CALLS]name[ARGS])"
    open, args = "[TOOL_CALLS]", "[ARGS]"
    markers = (open, args)

    def calls(self, tools, parallel, vocab):
        rules = [f"f{i}: {json.dumps(t.name)} {vocab.lit(self.args)} {json_rule(t.parameters)}"
                 for i, t in enumerate(tools)]
        rules.append("fn: " + " | ".join(f"f{i}" for i in range(len(tools))))
        return (f"fn ({vocab.lit(self.open)} fn)*" if parallel else "fn"), "\n".join(rules)

    def read(self, text, tools):
        out = []
        for part in text.split(self.open)[1:]:
            name, args = part.split(self.args, 1)
            out.append((name.strip(), json.loads(args)))
        return out

    def write(self, name, arguments):
        return f"{self.open}{name}{self.args}{json.dumps(arguments, ensure_ascii=False)}"
