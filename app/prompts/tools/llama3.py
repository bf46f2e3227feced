"""Llama 3.x's bare JSON call, ``{"name": NAME, "parameters": {...}}``, as the whole answer."""
from __future__ import annotations

import json

from ...engine.grammar import Grammar
from .base import Format, json_rule


class Llama3(Format):
    """``{"name": NAME, "parameters": {...}}`` as the whole answer, one call (Llama 3.1/3.2/3.3): no marker, so
    with ``auto`` nothing is constrained and the answer is read afterwards, as llama.cpp does."""

    name = "Llama 3.x (JSON with parameters)"
    open = '{"name"'
    parallel = False

    def grammar(self, tools, choice, vocab, thinking=False):
        if choice.mode != "required":
            return None
        usable = choice.usable(tools)
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                           "required": ["name", "parameters"], "additionalProperties": False} for t in usable]}
        return Grammar.lark(f"start: call\ncall: {json_rule(call)}", "tools")

    def read(self, text, tools):
        obj = json.loads(text.strip())
        if not isinstance(obj.get("name"), str) or obj["name"] not in {t.name for t in tools}:
            raise ValueError("not a call")
        return [(obj["name"], obj.get("parameters", obj.get("arguments", {})))]

    def write(self, name, arguments):
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
