"""An OpenAI request body read into what the engine runs: messages or prompt, sampling, stop strings and the
per-request speculation llama-server names (``speculative.n_max`` 0 = off, ``speculative.n_min``, ``.p_min``)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from ..chat.settings import Settings
from ..engine import DRAFTERS, OFF, EngineError, GenerationParams, drafter_for
from ..engine.grammar import Grammar
from ..engine.grammar_limits import check_schema
from ..prompts.tools import Tool, ToolChoice


class ApiError(Exception):
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Job:
    """What one request asks the engine for."""

    model: str | None
    messages: list[dict] | None  # chat
    prompt: str | None  # completion
    params: GenerationParams
    drafter: str
    stream: bool
    include_usage: bool
    timings_per_token: bool
    template_variables: dict  # chat_template_kwargs (e.g. {"enable_thinking": false}), as llama-server and vLLM take
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)


def _number(body: dict, name: str, kind: type, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ApiError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}.",
                       param=name)
    return kind(value)


def _speculative(body: dict, name: str):
    """llama-server's flat key ("speculative.n_max"), or the same nested under "speculative"."""
    nested = body.get("speculative")
    if isinstance(nested, dict) and name in nested:
        return {f"speculative.{name}": nested[name]}
    return body


def _spec_type(body: dict) -> str | None:
    """llama-server's "speculative.type" (draft-simple, draft-mtp, ngram-...), as the drafter it names."""
    name = _speculative(body, "type").get("speculative.type")
    if name is None:
        return None
    try:
        return drafter_for(name)
    except EngineError as exc:
        raise ApiError(400, str(exc), param="speculative.type") from None


def _text(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text is understood here."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: only text content is supported (got a {part.get('type') if isinstance(part, dict) else type(part).__name__!r} part).",
                               param="messages")
            parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise ApiError(400, f"{where}: 'content' must be a string or a list of text parts.", param="messages")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, f"messages[{i}]: 'role' must be system, user, assistant or tool.", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]  # OpenAI's newer name for the system role
        msg = {"role": role, "content": _text(m.get("content"), f"messages[{i}]")}
        if role == "tool":  # a tool's result (templates that know tools render the id or the name)
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_past_call(c, f"messages[{i}].tool_calls[{j}]")
                                 for j, c in enumerate(_list(m["tool_calls"], f"messages[{i}].tool_calls"))]
        out.append(msg)
    return out


def _list(value, where: str) -> list:
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a list.", param="messages")
    return value


def _past_call(call, where: str) -> dict:
    """An earlier call as templates take it: arguments as an object (OpenAI sends them as a JSON string)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}: give {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}.",
                       param="messages")
    args = fn.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        raise ApiError(400, f"{where}: 'arguments' is not valid JSON.", param="messages") from None
    if not isinstance(args, dict):
        raise ApiError(400, f"{where}: 'arguments' must be a JSON object.", param="messages")
    return {"id": str(call.get("id") or ""), "name": fn["name"], "arguments": args}


def _tools(body: dict, chat: bool) -> tuple[list[Tool], ToolChoice]:
    """OpenAI's tools, tool_choice and parallel_tool_calls."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' needs 'tools'.", param="tool_choice")
        return [], ToolChoice(mode="none")
    if not chat:
        raise ApiError(400, "'tools' are for /v1/chat/completions.", param="tools")
    out = []
    for i, t in enumerate(_list(tools, "'tools'")):
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ApiError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                "\"parameters\": {...}}}} with a name of letters, digits, _ . or -.", param="tools")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object.", param="tools")
        try:  # (deep or huge, before any format turns it into a grammar)
            check_schema(params, f"tools[{i}].function.parameters")
        except EngineError as exc:
            raise ApiError(400, str(exc), param="tools", code="invalid_schema") from None
        out.append(Tool(name, str(fn.get("description") or ""), params))
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false.", param="parallel_tool_calls")
    if choice in (None, "auto", "none", "required"):
        return out, ToolChoice(mode=choice or "auto", parallel=parallel)
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if name not in [t.name for t in out]:
        raise ApiError(400, "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": "
                            "{\"name\": NAME}} naming one of the tools.", param="tool_choice")
    return out, ToolChoice(mode="required", name=name, parallel=parallel)


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (one prompt per request).", param="prompt")
    return prompt


def _grammar(body: dict) -> Grammar | None:
    """What the answer must follow: OpenAI's ``response_format`` (json_object, json_schema), or llama-server's
    ``json_schema`` (a schema) or ``grammar`` (GBNF). A schema or grammar the library cannot use is a 400."""
    fmt, schema, gbnf = body.get("response_format"), body.get("json_schema"), body.get("grammar")
    given = [name for name, v in (("response_format", fmt), ("json_schema", schema), ("grammar", gbnf))
             if v is not None and not (name == "response_format" and isinstance(v, dict) and v.get("type") == "text")]
    if len(given) > 1:
        raise ApiError(400, f"Give one of {' or '.join(given)}, not both.", param=given[1])
    try:
        if schema is not None:
            return Grammar.json_schema(schema)
        if gbnf is not None:
            if not isinstance(gbnf, str):
                raise ApiError(400, "'grammar' must be a string (llama.cpp's GBNF).", param="grammar")
            return Grammar.gbnf(gbnf)
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":  # (llama-server also takes a "schema" beside it)
            return Grammar.json_schema(fmt["schema"]) if fmt.get("schema") is not None else Grammar.json_object()
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict):
                raise ApiError(400, "'response_format.json_schema' must be an object with the schema under 'schema'.",
                               param="response_format")
            return Grammar.json_schema(spec.get("schema", {}))  # (no schema: any JSON value, as llama-server)
        raise ApiError(400, "'response_format.type' must be text, json_object or json_schema.", param="response_format")
    except EngineError as exc:
        raise ApiError(400, str(exc), param=given[0], code="invalid_schema" if given[0] != "grammar" else
                       "invalid_grammar") from None


def parse(body, chat: bool, defaults: Settings, drafters: tuple[str, ...]) -> Job:
    """Read and validate a request body; any mistake is an ApiError (400) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    if _number(body, "n", int, 1) != 1:
        raise ApiError(400, "Only n = 1 is supported.", param="n")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise ApiError(400, "'stop' must be a string or a list of strings.", param="stop")
    max_tokens = _number(body, "max_completion_tokens", int) or _number(body, "max_tokens", int, defaults.max_tokens)
    s = replace(
        defaults,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", float, defaults.temperature),
        top_p=_number(body, "top_p", float, defaults.top_p),
        top_k=_number(body, "top_k", int, defaults.top_k),
        min_p=_number(body, "min_p", float, defaults.min_p),
        seed=_number(body, "seed", int, defaults.seed),
        draft_max=_number(_speculative(body, "n_max"), "speculative.n_max", int, defaults.draft_max),
        draft_min=_number(_speculative(body, "n_min"), "speculative.n_min", int, defaults.draft_min),
        draft_p_min=_number(_speculative(body, "p_min"), "speculative.p_min", float, defaults.draft_p_min),
    )
    drafter = body.get("drafter") or _spec_type(body) or (
        defaults.drafter if defaults.drafter in drafters else drafters[0])
    if drafter not in DRAFTERS:
        raise ApiError(400, f"'drafter' must be one of {', '.join(DRAFTERS)}.", param="drafter")
    if s.draft_max == 0:  # llama-server's way to turn speculation off for one request
        drafter, s = OFF, replace(s, draft_min=0)
    try:
        params = replace(s.generation(), stop=tuple(stop or ()), grammar=_grammar(body))
    except EngineError as exc:
        raise ApiError(400, str(exc)) from None
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    variables = body.get("chat_template_kwargs") or {}
    reserved = {"messages", "add_generation_prompt", "bos_token", "eos_token", "builtin", "model", "tools"}
    if not isinstance(variables, dict) or reserved & set(variables):
        raise ApiError(400, "'chat_template_kwargs' must be an object of template variables other than "
                            f"{', '.join(sorted(reserved))}.", param="chat_template_kwargs")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string.", param="model")
    tools, choice = _tools(body, chat)
    if tools and choice.mode != "none" and params.grammar is not None:
        raise ApiError(400, "Give tools or a response format / grammar, not both.", param="tools")
    return Job(model=model or None, messages=_messages(body) if chat else None, prompt=None if chat else _prompt(body),
               params=params, drafter=drafter, stream=bool(body.get("stream")),
               include_usage=bool(options.get("include_usage")), timings_per_token=bool(body.get("timings_per_token")),
               template_variables={"enable_thinking": defaults.enable_thinking, **variables},
               tools=tools, tool_choice=choice)
