"""Gemma 4's ``<|tool_call>call:NAME{...}<tool_call|>`` calls, in Gemma's own object syntax."""
from __future__ import annotations

import json
import re

from .base import Format, Vocab, sequence_rules


class Gemma4(Format):
    """``<|tool_call>call:NAME{key:value,...}<tool_call|>`` (Gemma 4): Gemma's own object syntax, keys bare and in
    sorted order as its template writes them, strings between ``<|"|>`` tokens. Unlike llama.cpp's grammar for it,
    this one follows each tool's schema."""

    name = "Gemma 4 (<|tool_call>)"
    open, close, quote = "<|tool_call>", "<tool_call|>", '<|"|>'
    markers = (open, close, quote)

    def calls(self, tools, parallel, vocab):
        rules = _GemmaRules(vocab, self.quote)
        fns = [f"f{i}: {json.dumps('call:' + t.name)} {rules.value(t.parameters)}" for i, t in enumerate(tools)]
        fns.append("fn: " + " | ".join(f"f{i}" for i in range(len(tools))))
        block = f"fn {vocab.lit(self.close)}"
        calls = f"{block} ({vocab.lit(self.open)} {block})*" if parallel else block
        return calls, "\n".join(fns + rules.rules)

    def read(self, text, tools):
        found = re.findall(r"<\|tool_call>call:([^{]+)(\{.*?\})<tool_call\|>", text, flags=re.S)
        if not found:
            raise ValueError("no call")
        return [(name.strip(), _gemma_to_json(body)) for name, body in found]

    def write(self, name, arguments):
        return f"{self.open}call:{name}{_gemma(arguments, self.quote)}{self.close}"


class _GemmaRules:
    """Lark rules for values in Gemma 4's syntax, one per schema (objects' keys in sorted order, optional ones
    left out with their comma)."""

    def __init__(self, vocab: Vocab, quote: str):
        self.rules: list[str] = []
        self.n = 0
        q = vocab.lit(quote)
        if quote in vocab.specials:  # any token but the quote (and the end) inside a string
            self.rules.append(f"gs: <[^{','.join(map(str, (vocab.specials[quote], *vocab.eog)))}]>*")
            self.string = f"{q} gs {q}"
        else:
            self.rules.append(f"gs[suffix={json.dumps(quote)}]: /(.|\\n)*/")
            self.string = f"{q} gs"
        self.q = q
        self.rules += ['gv: gstr | GNUM | "true" | "false" | "null" | gd | gl', f"gstr: {self.string}",
                       'gd: "{" (GKEY ":" gv ("," GKEY ":" gv)*)? "}"', 'gl: "[" (gv ("," gv)*)? "]"',
                       "GKEY: /[A-Za-z_][A-Za-z0-9_.-]*/", "GNUM: /-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/",
                       "GINT: /-?[0-9]+/"]

    def _name(self) -> str:
        self.n += 1
        return f"g{self.n}"

    def value(self, schema) -> str:
        if not isinstance(schema, dict):
            return "gv"
        kind = schema.get("type")
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            return f"{self.q} ({' | '.join(json.dumps(v) for v in schema['enum'])}) {self.q}"
        if kind == "string":
            return "gstr"
        if kind == "integer":
            return "GINT"
        if kind == "number":
            return "GNUM"
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            item = self.value(schema.get("items"))
            return f'("[" ({item} ("," {item})*)? "]")'
        if kind == "object" and isinstance(schema.get("properties"), dict):
            return self._object(schema)
        return "gv"

    def _object(self, schema) -> str:
        """``{`` the keys in sorted order ``}``, a comma between those written."""
        props = schema["properties"]
        if not props:
            return '("{" "}")'
        a, b = self._name(), self._name()
        items = [(k, f"{json.dumps(k + ':')} {self.value(props[k])}") for k in sorted(props)]
        self.rules += sequence_rules(a, b, items, set(schema.get("required", [])), '","')
        return f'("{{" {a}_0 "}}")'


def _gemma(value, quote: str) -> str:
    if isinstance(value, str):
        return f"{quote}{value}{quote}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma(v, quote)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma(v, quote) for v in value) + "]"
    return json.dumps(value)


def _gemma_to_json(text: str):
    """Gemma's object syntax as JSON: strings out of the way, bare keys quoted, strings back."""
    strings: list[str] = []

    def keep(m):
        strings.append(m.group(1))
        return f"\x00{len(strings) - 1}\x00"

    text = re.sub(r'<\|"\|>(.*?)<\|"\|>', keep, text, flags=re.S)
    text = re.sub(r'([{,])\s*([^\s:{},\[\]\x00]+)\s*:', r'\1"\2":', text)
    return json.loads(re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))]), text))
