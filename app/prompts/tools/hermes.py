"""The ``<tool_call>`` formats: Hermes's JSON call (Qwen2.5, Qwen3, Granite 4, and the format taught to templates
without tools) and the XML call Qwen3.5/3.6, Qwen3-Coder and Nemotron 3 write inside the same tags."""
from __future__ import annotations

import json
import re

from .base import Format, Tool, json_rule


class Hermes(Format):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one after another (Qwen2.5,
    Qwen3, Granite 4, and the format taught to templates without tools)."""

    name = "Hermes (<tool_call>)"
    open, close = "<tool_call>", "</tool_call>"
    markers = (open, close)

    def calls(self, tools, parallel, vocab):
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                           "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
        op, cl = vocab.lit(self.open), vocab.lit(self.close)
        block = f'"\\n" call "\\n" {cl}'
        return (f'{block} ("\\n" {op} {block})*' if parallel else block), f"call: {json_rule(call)}"

    def read(self, text, tools):
        out = []
        for block in re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, flags=re.S):
            obj = json.loads(block)
            if not isinstance(obj.get("name"), str):
                raise ValueError("no name")
            out.append((obj["name"], obj.get("arguments", {})))
        return out

    def write(self, name, arguments):
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n</tool_call>'

    def teach(self, tools: list[Tool]) -> str:
        """The system text for a template that knows no tools (Qwen2.5's own wording)."""
        listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each "
                "function call, return a json object with function name and arguments within <tool_call></tool_call> "
                'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class QwenXml(Format):
    """``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
    (Qwen3.5/3.6, Qwen3-Coder, Nemotron 3): string values written raw, others as JSON."""

    name = "Qwen3.5 / Qwen3-Coder (<function=...>)"
    open, close = "<tool_call>", "</tool_call>"
    markers = (open, close)

    def calls(self, tools, parallel, vocab):
        rules = []
        for i, t in enumerate(tools):
            props = t.parameters.get("properties") or {}
            required = [k for k in t.parameters.get("required", []) if k in props]
            parts = []
            for j, key in enumerate(required + [k for k in props if k not in required]):
                head = json.dumps(f"<parameter={key}>\n")
                if props[key].get("type") == "string":  # raw text up to the closing tag
                    rules.append(f"v{i}_{j}{_raw_string(props[key])}")
                    part = f"{head} v{i}_{j}"
                else:
                    rules.append(f"v{i}_{j}: {json_rule(props[key])}")
                    part = f'{head} v{i}_{j} "\\n</parameter>\\n"'
                parts.append(part if key in required else f"({part})?")
            rules.append(f'f{i}: {json.dumps(f"<function={t.name}>{chr(10)}")} {" ".join(parts)} "</function>\\n"')
        rules.append("fn: " + " | ".join(f"f{i}" for i in range(len(tools))))
        op, cl = vocab.lit(self.open), vocab.lit(self.close)
        block = f'"\\n" fn {cl}'
        return (f'{block} ("\\n" {op} {block})*' if parallel else block), "\n".join(rules)

    def read(self, text, tools):
        schemas = {t.name: t.parameters.get("properties") or {} for t in tools}
        out = []
        for name, body in re.findall(r"<function=([^>\n]+)>\n?(.*?)</function>", text, flags=re.S):
            args = {}
            for key, value in re.findall(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>", body, flags=re.S):
                kind = schemas.get(name, {}).get(key, {}).get("type")
                args[key] = value if kind == "string" else _value(value)
            out.append((name, args))
        return out

    def write(self, name, arguments):
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                         for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _raw_string(schema: dict) -> str:
    """The Lark rule body (after its name) for a string parameter written raw, up to Qwen's closing tag: one of its
    ``enum``/``const`` values, or any text within its ``minLength``/``maxLength`` (counted in characters, as JSON
    Schema counts them; the text is the value, JSON's escapes do not apply)."""
    close = json.dumps("\n</parameter>\n")
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return f": ({' | '.join(json.dumps(v) for v in values)}) {close}"
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    lo = lo if isinstance(lo, int) and lo > 0 else 0
    hi = hi if isinstance(hi, int) and hi >= lo else None
    count = "*" if not lo and hi is None else f"{{{lo},{'' if hi is None else hi}}}"
    return f"[suffix={close}]: /(.|\\n){count}/"


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
