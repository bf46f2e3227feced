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

import ast
import json
import re
import secrets
import string
import warnings
from dataclasses import dataclass

from ..engine.errors import EngineError
from ..engine.grammar import JSON_LAYOUT, Grammar


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


def _json(schema) -> str:
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
        return (f'{block} ("\\n" {op} {block})*' if parallel else block), f"call: {_json(call)}"

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
                    rules.append(f"v{i}_{j}: {_json(props[key])}")
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


class Mistral(Format):
    """``[TOOL_CALLS]NAME[ARGS]{...}``, the marker before each call (Ministral 3, Magistral, Devstral): control
    tokens in Mistral's vocabulary, named by id in the grammar and written out in the answer's text to be read."""

    name = "Mistral ([TOOL_CALLS]name[ARGS])"
    open, args = "[TOOL_CALLS]", "[ARGS]"
    markers = (open, args)

    def calls(self, tools, parallel, vocab):
        rules = [f"f{i}: {json.dumps(t.name)} {vocab.lit(self.args)} {_json(t.parameters)}"
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
        self.rules += _sequence(a, b, items, set(schema.get("required", [])), '","')
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
            rules += _sequence(f"a{i}", f"b{i}", items, set(t.parameters.get("required", [])), '", "')
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
            kind, _json(schema))

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


def _sequence(a: str, b: str, items: list[tuple[str, str]], required: set, sep: str) -> list[str]:
    """Rules for items in order, the optional ones left out with their separator: a_j (nothing written yet) and
    b_j (something written, a separator first) derive the items from the j-th on."""
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
        fns = [f"f{i}: {json.dumps(t.name)} tail {lit('<|message|>')} {_json(t.parameters)}"
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
        return Grammar.lark(f"start: call\ncall: {_json(call)}", "tools")

    def read(self, text, tools):
        obj = json.loads(text.strip())
        if not isinstance(obj.get("name"), str) or obj["name"] not in {t.name for t in tools}:
            raise ValueError("not a call")
        return [(obj["name"], obj.get("parameters", obj.get("arguments", {})))]

    def write(self, name, arguments):
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# Formats told by their template's markers (llama.cpp's own checks, common/chat.cpp), most specific first; the
# families SpecChat does not read yet are refused by name rather than answered in another family's format.
FORMATS: list[tuple[tuple[str, ...], Format | str]] = [
    (("[TOOL_CALLS]", "[CALL_ID]"), "Mistral Small 3.2 ([TOOL_CALLS]name[CALL_ID]id[ARGS])"),
    (("[TOOL_CALLS]", "[ARGS]"), Mistral()),
    (("[TOOL_CALLS]",), "Mistral Nemo ([TOOL_CALLS][{...}])"),
    (("<|channel|>",), GptOss()),
    (("List of tools: [",), Lfm2()),
    (("<|tool_list_start|>",), Lfm2()),
    (("<|tool_call>",), Gemma4()),
    (("<tool_call>", "<function=", "<parameter="), QwenXml()),
    (("<tool_call>",), Hermes()),
    (('"parameters": ', "ipython"), Llama3()),
]


def knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def tool_format(template: str | None) -> Format:
    """The format a model writes calls in, from its template's markers (Hermes where the template knows none)."""
    for markers, fmt in FORMATS:
        if template and all(m in template for m in markers):
            if isinstance(fmt, str):
                raise EngineError(f"This model writes tool calls in the {fmt} format, which SpecChat does not read "
                                  "yet: use a model of the Qwen2.5/Qwen3/Qwen3.5/Granite, Ministral 3, Gemma 4, LFM2, "
                                  "gpt-oss or Llama 3.x families, or one whose template knows no tools.")
            return fmt
    return Hermes()


def prepare_messages(messages: list[dict], tools: list[Tool], template: str | None) -> tuple[list[dict], dict]:
    """Messages and template variables for a conversation with tools. Arguments of earlier calls become objects
    (templates write them with tojson or iterate them). A template that knows no tools gets them taught in the
    system message, earlier calls written into the assistant's text and results as user turns (Hermes)."""
    taught = Hermes()
    if template and "tool_calls[0]" in template:  # (gpt-oss's renders only an answer's first call)
        messages = _one_call_each(messages)
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if knows_tools(template):
            if calls and "tool_calls" not in template:  # (LFM2.5-Instruct's lists tools but writes no calls)
                own = tool_format(template)
                m["content"] += "".join(own.write(c["name"], c["arguments"]) for c in calls)
            elif calls:
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            out.append(m)
            continue
        if calls:
            text = "\n".join(taught.write(c["name"], c["arguments"]) for c in calls)
            m["content"] = (m["content"] + "\n" if m["content"] else "") + text
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if knows_tools(template):
        return out, {"tools": [t.as_openai() for t in tools]} if tools else {}
    if tools:
        teach = taught.teach(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + teach}
        else:
            out.insert(0, {"role": "system", "content": teach})
    return out, {}


def _one_call_each(messages: list[dict]) -> list[dict]:
    """An answer with several calls as answers of one call each, every one followed by its result."""
    out, i = [], 0
    while i < len(messages):
        m, calls = messages[i], messages[i].get("tool_calls") or []
        j = i + 1
        if m["role"] != "assistant" or len(calls) < 2:
            out.append(m)
            i = j
            continue
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        results = messages[i + 1:j]
        by_id = {r.get("tool_call_id"): r for r in results}
        for k, call in enumerate(calls):
            out.append({**m, "content": m["content"] if k == 0 else "", "tool_calls": [call]})
            result = by_id.get(call["id"]) or (results[k] if k < len(results) else None)
            if result is not None:
                out.append(result)
        i = j
    return out
