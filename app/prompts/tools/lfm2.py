"""LFM2's ``<|tool_call_start|>[NAME(key='value')]<|tool_call_end|>`` calls, written as Python."""
from __future__ import annotations

import ast
import json
import re
import warnings

from .base import Format, json_rule, sequence_rules


class Lfm2(Format):
    """``<|tool_call_start|>[NAME(key='value', n=3), ...]<|tool_call_end|>`` (LFM2, LFM2.5): Python calls, strings
    in single quotes, keys in the schema's order."""

    name = "LFM2 (<|tool_call_start|>)"
    open, close = "<|tool_call_start|>", "<|tool_call_end|>"
    markers = (open, close)

    def calls(self, tools, parallel, vocab):
        rules = ["PSTR: /'([^'\\\\\\n]|\\\\.)*'/", "PINT: /-?[0-9]+/",
                 "PNUM: /-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/"]
        for i, t in enumerate(tools):
            props = t.parameters.get("properties") or {}
            items = [(k, f"{json.dumps(k + '=')} {self._value(v)}") for k, v in props.items()]
            rules += sequence_rules(f"a{i}", f"b{i}", items, set(t.parameters.get("required", [])), '", "')
            rules.append(f"f{i}: {json.dumps(t.name + '(')} {f'a{i}_0 ' if items else ''}\")\"")
        rules.append("fn: " + " | ".join(f"f{i}" for i in range(len(tools))))
        more = '(", " fn)*' if parallel else ""
        return f'"[" fn {more} "]" {vocab.lit(self.close)}', "\n".join(rules)

    @staticmethod
    def _value(schema) -> str:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(schema, dict) and all(isinstance(v, str) for v in schema.get("enum", [None])):
            return "(" + " | ".join(json.dumps(repr(v)) for v in schema["enum"]) + ")"
        if kind == "string" and isinstance(schema.get("maxLength"), int):
            return f"/'([^'\\\\\\n]|\\\\.){{0,{schema['maxLength']}}}'/"
        return {"string": "PSTR", "integer": "PINT", "number": "PNUM", "boolean": '("True" | "False")'}.get(
            kind, json_rule(schema))

    def read(self, text, tools):
        out = []
        for body in re.findall(r"<\|tool_call_start\|>(.*?)(?:<\|tool_call_end\|>|$)", text, flags=re.S):
            with warnings.catch_warnings():  # (a model's "\\Z" in a string is an invalid escape to Python)
                warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
                calls = ast.parse(body.strip(), mode="eval").body
            for call in calls.elts if isinstance(calls, ast.List) else [calls]:
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                    raise ValueError("not a call")
                out.append((call.func.id, {kw.arg: _literal(kw.value) for kw in call.keywords}))
        return out

    def write(self, name, arguments):
        args = ", ".join(f"{k}={repr(v) if isinstance(v, str) else json.dumps(v) if isinstance(v, dict) else v}"
                         for k, v in arguments.items())
        return f"{self.open}[{name}({args})]{self.close}"


def _literal(node):
    """A Python literal, or JSON's true/false/null written as names."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)
