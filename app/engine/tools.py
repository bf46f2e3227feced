"""Tool calls (OpenAI's ``tools``): how a model family writes a call, the grammar that keeps every call it writes
valid, and the parser that reads the calls back out of the answer.

The grammar constrains the whole answer, so it is exact under speculation like any other (see ``constraint``):
with ``tool_choice: auto`` it allows free text that never contains the call marker, or free text ending in the
marker followed by calls (the lazy grammar llama-server builds: nothing is constrained until the marker); with
``required`` or a named function the answer is calls from its first token. After the marker the keys, quotes and
function names are forced, so they are drafted free.

Formats are told apart by the markers in the chat template, as llama.cpp does. A template that knows no tools
(SmolLM2, Gemma 3, plain ChatML) gets them described in a system message and answers in the Hermes format.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from .errors import EngineError
from .grammar import JSON_LAYOUT, Grammar


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


def call_id() -> str:
    """Nine letters and digits: the length Mistral's templates require of an id (others ignore ids)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


class Hermes:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one after another (Qwen2.5, Qwen3,
    Granite 4, and the format taught to templates without tools)."""

    name = "hermes"
    open, close = "<tool_call>", "</tool_call>"

    def grammar(self, tools: list[Tool], choice: ToolChoice, specials: dict[str, int]) -> Grammar:
        """``specials``: the markers that are one special token in this vocabulary (Qwen's ``<tool_call>``), which
        the grammar names by id: as bytes the model never writes them."""
        usable = [t for t in tools if choice.name in (None, t.name)]
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                           "required": ["name", "arguments"], "additionalProperties": False} for t in usable],
                "x-guidance": JSON_LAYOUT}
        op, cl = (f"<[{specials[m]}]>" if m in specials else json.dumps(m) for m in (self.open, self.close))
        block = f'call "\\n" {cl}'
        calls = f'{block} ("\\n" {op} "\\n" {block})*' if choice.parallel else block
        if choice.mode == "required":
            start = f'start: {op} "\\n" {calls}'
        elif self.open in specials:  # free text cannot hold the special token: it ends where the marker comes
            start = f'start: FREE | FREE {op} "\\n" {calls}\nFREE: /(.|\\n)*/'
        else:  # free text without the marker, or text up to and with the marker, then calls
            start = (f'start: FREE | text "\\n" {calls}\n'
                     f'text[suffix={json.dumps(self.open)}]: /(.|\\n)*/\n'
                     f'FREE: /(.|\\n)*/ & ~/(.|\\n)*{re.escape(self.open)}(.|\\n)*/')
        return Grammar.lark(f"{start}\ncall: %json {json.dumps(call)}", "tools")

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text before the first call, and the calls (a block that is not a JSON call stays in the text)."""
        start = text.find(self.open)
        if start < 0:
            return text, []
        calls = []
        for block in re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text[start:], flags=re.S):
            try:
                obj = json.loads(block)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return text, []
            calls.append(ToolCall(call_id(), obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
        return text[:start], calls  # (the whitespace before the call kept, as llama.cpp keeps it)

    def write(self, name: str, arguments: dict) -> str:
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n</tool_call>'

    def teach(self, tools: list[Tool]) -> str:
        """The system text for a template that knows no tools (Qwen2.5's own wording)."""
        listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each "
                "function call, return a json object with function name and arguments within <tool_call></tool_call> "
                'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


# llama.cpp's own markers for the families it parses with hand-written code (common/chat.cpp); SpecChat does not
# write or read these formats yet, and says so rather than answering in the wrong one.
OTHER_FORMATS = [("Qwen3.5 / Qwen3-Coder (<function=...>)", ("<tool_call>", "<function=", "<parameter=")),
                 ("Mistral ([TOOL_CALLS])", ("[TOOL_CALLS]",)), ("gpt-oss (harmony)", ("<|channel|>",)),
                 ("Gemma 4 (<|tool_call>)", ("<|tool_call>",)), ("LFM2 (<|tool_call_start|>)", ("List of tools: [",)),
                 ("LFM2 (<|tool_call_start|>)", ("<|tool_list_start|>",)),
                 ("Llama 3.x (JSON with parameters)", ('"parameters": ', "ipython"))]


def knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def tool_format(template: str | None) -> Hermes:
    """The format a model writes calls in, from its template's markers."""
    for family, markers in OTHER_FORMATS:
        if template and all(m in template for m in markers):
            raise EngineError(f"This model writes tool calls in the {family} format, which SpecChat does not read "
                              "yet: use a model of the Qwen2.5/Qwen3/Granite family, or one whose template knows "
                              "no tools.")
    return Hermes()


def prepare_messages(messages: list[dict], tools: list[Tool], template: str | None) -> tuple[list[dict], dict]:
    """Messages and template variables for a conversation with tools. Arguments of earlier calls become objects
    (templates write them with tojson or iterate them). A template that knows no tools gets them taught in the
    system message, earlier calls written into the assistant's text and results as user turns."""
    fmt = tool_format(template)
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if knows_tools(template):
            if calls:
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            out.append(m)
            continue
        if calls:
            text = "\n".join(fmt.write(c["name"], c["arguments"]) for c in calls)
            m["content"] = (m["content"] + "\n" if m["content"] else "") + text
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if knows_tools(template):
        return out, {"tools": [t.as_openai() for t in tools]} if tools else {}
    if tools:
        teach = fmt.teach(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + teach}
        else:
            out.insert(0, {"role": "system", "content": teach})
    return out, {}
