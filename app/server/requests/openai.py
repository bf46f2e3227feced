"""An OpenAI request body read into the one job every API runs (``Job``): messages or prompt, sampling, stop strings,
tools, a grammar and the per-request speculation llama-server names (``speculative.n_max`` 0 = off,
``speculative.n_min``, ``.p_min``). Every field is checked for its type and range: a mistake is a 400 naming it."""
from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Callable

from ...chat.settings import Settings
from ...engine import DRAFTERS, OFF, EngineError, GenerationParams, drafter_for
from ...engine.drafters import NgramParams, registry
from ...engine.grammar import Grammar
from ...engine.grammar_limits import check_schema
from ...engine.logprobs import MAX_TOP
from ...prompts.tools import Tool, ToolChoice
from ..http import ApiError, decode

NO_LIMIT = 2 ** 31 - 1  # max_tokens for n_predict -1: the context ends the answer
INT_LIMIT = 2 ** 63  # integers beyond int64 are refused: llama.cpp and numpy take no more


def _shown(value, width: int = 60) -> str:
    """A value for an error message: its repr, cut (a client's 10 MB string is not echoed back)."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "…"


@dataclass(frozen=True)
class Job:
    """What one request asks the engine for."""

    model: str | None
    messages: list[dict] | None  # chat
    prompt: str | list | None  # completion: text, or token ids with strings mixed in (as llama-server takes them)
    params: GenerationParams
    drafter: str
    stream: bool
    include_usage: bool
    timings_per_token: bool
    # chat_template_kwargs (e.g. {"enable_thinking": false}), as llama-server and vLLM take, and (chat) how the
    # answer's turn begins: add_generation_prompt, continue_final_message (render_chat's)
    template_variables: dict
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    verbose: bool | None = None  # llama-server's debug object (``__verbose``) asked for; None: the server's default


def _number(body: dict, name: str, kind: type, default=None):
    """A number field: finite, an integer where ``kind`` is int (2.0 is), within int64 (any kind)."""
    value = body.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and (kind is float or value.is_integer())
    if not ok or abs(value) >= INT_LIMIT:
        what = "an integer" if kind is int else "a number"
        raise ApiError(400, f"'{name}' must be {what} (finite, of magnitude below 2^63), got {_shown(value)}.",
                       param=name)
    return kind(value)


def _flag(body: dict, name: str) -> bool:
    """A true/false field (absent or null: false)."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {_shown(value)}.", param=name)
    return bool(value)


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


# The n-gram kinds' settings a request may set: "speculative.ngram_" + NgramParams' field (the CLI's flag with
# underscores: ngram_mod_n_match), and llama-server's own three, which set ngram-simple's. Not the cache files: a
# request does not get to name files on the server.
NGRAM_FIELDS = {"ngram_" + f.name: f.name for f in fields(NgramParams) if not f.name.startswith("lookup_cache")}
NGRAM_FIELDS |= {"ngram_size_n": "simple_size_n", "ngram_size_m": "simple_size_m", "ngram_min_hits": "simple_min_hits"}


def _ngram(body: dict, defaults: dict) -> dict:
    """The request's n-gram settings over the server's."""
    given = {f: _number(_speculative(body, name), "speculative." + name, int) for name, f in NGRAM_FIELDS.items()}
    return {**defaults, **{f: v for f, v in given.items() if v is not None}}


def _content(content, where: str, joint: str = "") -> str | list[dict]:
    """A message's content: a string, or OpenAI's list of parts: text (joined by ``joint``), and images as
    ``image_url`` parts holding a data URL (``data:image/png;base64,...``), read into ``{"type": "image", "image":
    bytes}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                parts.append({"type": "image", "image": _image(part.get("image_url"), where)})
            else:
                raise ApiError(400, f"{where}: only text and image_url content parts are supported (got a "
                                    f"{kind if kind else type(part).__name__!r} part).", param="messages")
        return parts if any(p["type"] == "image" for p in parts) else joint.join(p["text"] for p in parts)
    if content is None:
        return ""
    raise ApiError(400, f"{where}: 'content' must be a string or a list of text and image_url parts.",
                   param="messages")


def _image(value, where: str) -> bytes:
    """An image_url part's image: only inline data URLs; a remote URL is not fetched (nothing leaves the machine)."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise ApiError(400, f"{where}: an image_url part needs {{\"url\": \"data:image/png;base64,...\"}}.",
                       param="messages")
    if url.lower().startswith(("http://", "https://")):
        raise ApiError(400, f"{where}: remote image URLs are not fetched (nothing leaves this machine): send the "
                            "image inline as a data URL (data:image/png;base64,...).", param="messages",
                       code="remote_image_refused")
    head, comma, data = url.partition(",")
    if not (head.lower().startswith("data:") and head.lower().endswith(";base64") and comma):
        raise ApiError(400, f"{where}: an image URL must be a base64 data URL (data:image/png;base64,...).",
                       param="messages")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}: the image's data URL is not valid base64.", param="messages") from None


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, f"messages[{i}]: 'role' must be system, user, assistant or tool.", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]  # OpenAI's newer name for the system role
        # (a last message that is the assistant's is continued: llama.cpp joins its text parts with a blank line)
        joint = "\n\n" if role == "assistant" and i == len(messages) - 1 else ""
        msg = {"role": role, "content": _content(m.get("content"), f"messages[{i}]", joint)}
        if role == "tool":  # a tool's result (templates that know tools render the id or the name)
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_past_call(c, f"messages[{i}].tool_calls[{j}]")
                                 for j, c in enumerate(_list(m["tool_calls"], f"messages[{i}].tool_calls"))]
        out.append(msg)
    if len(out) > 1 and out[-1]["role"] == out[-2]["role"] == "assistant":  # (as llama-server)
        raise ApiError(400, "Cannot have 2 or more assistant messages at the end of the list.", param="messages")
    return out


def _list(value, where: str, param: str = "messages") -> list:
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a list.", param=param)
    return value


def _past_call(call, where: str) -> dict:
    """An earlier call as templates take it: arguments as an object (OpenAI sends them as a JSON string)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}: give {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}.",
                       param="messages")
    args = fn.get("arguments") or "{}"
    args = decode(args, f"{where}: 'arguments'", "messages") if isinstance(args, str) else args
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
    for i, t in enumerate(_list(tools, "'tools'", "tools")):
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


def prompts(value) -> list:
    """The prompts a ``prompt`` field holds, as llama-server reads it: a string, ``{"prompt_string": …}``, or a
    sequence starting with a token id (ids and strings mixed) is one; any other list is a list of those."""
    if isinstance(value, (str, dict)) or (isinstance(value, list) and value and type(value[0]) is int):
        return [value]
    if isinstance(value, list) and value:
        return value
    raise ApiError(400, "'prompt' must be a string, token ids (with strings mixed in), {\"prompt_string\": ...}, or a "
                        "list of those.", param="prompt")


def _prompt(body: dict) -> str | list:
    """One prompt: text, or a sequence of token ids and strings (tokenized when it is rendered)."""
    given = prompts(body.get("prompt"))
    if len(given) != 1:
        raise ApiError(400, f"'prompt' holds {len(given)} prompts: give one per request (llama-server's /completion "
                            "takes several, not streamed).", param="prompt")
    prompt = given[0]
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise ApiError(400, "'multimodal_data' needs a model with a multimodal projector; this pair has none.",
                           param="prompt")
        prompt = prompt.get("prompt_string")
    if isinstance(prompt, list) and prompt and all(type(t) in (int, str) for t in prompt):
        return prompt
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string or token ids (one prompt per request).", param="prompt")
    return prompt


def logprobs_asked(body: dict, chat: bool, tools: bool) -> tuple[int | None, bool]:
    """What a request asks of token probabilities (see ``token_probs``): (alternatives per token, or None when
    none are asked for; post_sampling_probs)."""
    post = _flag(body, "post_sampling_probs")
    if chat:
        on = _flag(body, "logprobs")
        n = _top(body, "top_logprobs")
        if n is not None and not on:
            raise ApiError(400, "'top_logprobs' requires 'logprobs' to be set to true.", param="top_logprobs")
        if on and tools and body.get("stream"):
            raise ApiError(400, "'logprobs' is not supported with tools and 'stream' (as llama-server).",
                           param="logprobs")
        if on:
            return n or 0, post
    if body.get("n_probs") is not None:  # (llama-server's own name, on any endpoint; 0 reports nothing)
        return _top(body, "n_probs") or None, post
    legacy = None if chat else body.get("logprobs")
    if legacy is None or legacy is False:
        return None, post
    return _top(body, "logprobs"), post


def _top(body: dict, name: str) -> int | None:
    n = _number(body, name, int)
    if n is not None and not 0 <= n <= MAX_TOP:
        raise ApiError(400, f"'{name}' must be a whole number from 0 to {MAX_TOP}, got {n}.", param=name)
    return n


def _logit_bias(body: dict, tokenize: Callable[[str], list[int]] | None) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as OpenAI sends it ({"15043": -100}) or llama-server ([[15043, -1.0]], false to ban a token); a
    text in a token's place stands for each of its tokens (``tokenize``: the model's, no special tokens), as in
    llama-server."""
    value = body.get("logit_bias")
    if value in (None, {}, []):
        return ()
    pairs = list(value.items()) if isinstance(value, dict) else value
    out = []
    for pair in pairs if isinstance(pairs, list) else [None]:
        token, bias = pair if isinstance(pair, (list, tuple)) and len(pair) == 2 else (None, None)
        if isinstance(token, str) and token.strip().lstrip("-").isdigit():
            token = int(token)
        bias = -math.inf if bias is False else bias
        texts = isinstance(token, str) and token != "" and tokenize is not None
        if not texts and (isinstance(token, bool) or not isinstance(token, int)) or isinstance(bias, bool) \
                or not isinstance(bias, (int, float)):
            raise ApiError(400, "'logit_bias' must map token ids or texts to numbers ({\"15043\": -100}, or "
                                "[[15043, -1.0]], or [[\" hello\", -100]]; false bans a token).", param="logit_bias")
        out += [(t, float(bias)) for t in (tokenize(token) if texts else [token])]
    return tuple(out)


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


def _n_predict(body: dict) -> int | None:
    """llama-server's ``n_predict``: a ``max_tokens`` by its own name; negative (-1) is no limit but the context's."""
    n = _number(body, "n_predict", int)
    return None if n is None else n if n >= 0 else NO_LIMIT


def parse(body, chat: bool, defaults: Settings, drafters: tuple[str, ...],
          tokenize: Callable[[str], list[int]] | None = None) -> Job:
    """Read and validate a request body; any mistake is an ApiError (400) naming the field. ``tokenize``: the
    model's, for texts in ``logit_bias``."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    if _number(body, "n", int, 1) != 1:  # (the chat and completions endpoints answer n > 1 one at a time)
        raise ApiError(400, "Only n = 1 is supported here.", param="n")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise ApiError(400, "'stop' must be a string or a list of strings.", param="stop")
    max_tokens = _number(body, "max_completion_tokens", int) or _number(body, "max_tokens", int, _n_predict(body))
    max_tokens = defaults.max_tokens if max_tokens is None else max_tokens
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
        ngram=_ngram(body, defaults.ngram),
    )
    drafter = body.get("drafter") or _spec_type(body) or (
        defaults.drafter if registry.runs_on(defaults.drafter, drafters) else drafters[0])
    if not registry.is_drafter(drafter):
        raise ApiError(400, f"'drafter' must be one of {', '.join(DRAFTERS)}, an n-gram kind "
                            f"({', '.join(registry.KINDS)}), or several joined by commas.", param="drafter")
    if s.draft_max == 0:  # llama-server's way to turn speculation off for one request
        drafter, s = OFF, replace(s, draft_min=0)
    try:
        params = replace(s.generation(), stop=tuple(stop or ()), grammar=_grammar(body))
        params = replace(params, sampling=replace(params.sampling, logit_bias=_logit_bias(body, tokenize),
                                                  ignore_eos=_flag(body, "ignore_eos")))
        params.sampling.validate()
    except EngineError as exc:
        raise ApiError(400, str(exc)) from None
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    variables = body.get("chat_template_kwargs") or {}
    # (what the template and the functions that render it name themselves)
    reserved = {"messages", "add_generation_prompt", "continue_final_message", "bos_token", "eos_token", "builtin",
                "model", "tools", "template", "choice"}
    if not isinstance(variables, dict) or reserved & set(variables):
        raise ApiError(400, "'chat_template_kwargs' must be an object of template variables other than "
                            f"{', '.join(sorted(reserved))}.", param="chat_template_kwargs")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string.", param="model")
    tools, choice = _tools(body, chat)
    if tools and choice.mode != "none" and params.grammar is not None:
        raise ApiError(400, "Give tools or a response format / grammar, not both.", param="tools")
    n_top, post = logprobs_asked(body, chat, bool(tools) and choice.mode != "none")
    params = replace(params, logprobs=n_top, post_sampling_probs=post,
                     prompt_progress=_flag(body, "return_progress") and _flag(body, "stream"))  # (as llama-server)
    messages = _messages(body) if chat else None
    return Job(model=model or None, messages=messages, prompt=None if chat else _prompt(body),
               params=params, drafter=drafter, stream=_flag(body, "stream"),
               include_usage=_flag(options, "include_usage"), timings_per_token=_flag(body, "timings_per_token"),
               template_variables={"enable_thinking": defaults.enable_thinking, **variables,
                                   **(_turn_options(body, messages) if chat else {})},
               tools=tools, tool_choice=choice, verbose=_flag(body, "verbose") if "verbose" in body else None)


def _turn_options(body: dict, messages: list[dict]) -> dict:
    """How the answer's turn begins, as llama-server reads it: a new assistant turn opened (``add_generation_prompt``,
    true unless given), or the last message continued (``continue_final_message``; a last message that is the
    assistant's is continued unless told otherwise, llama-server's assistant prefill). Both at once are refused; the
    renderer refuses to continue a message that is not the assistant's."""
    add = body.get("add_generation_prompt", True)
    if not isinstance(add, bool):
        raise ApiError(400, f"'add_generation_prompt' must be true or false, got {_shown(add)}.",
                       param="add_generation_prompt")
    given = body.get("continue_final_message")
    if not (given is None or isinstance(given, bool) or given == "content"):  # (llama-server's name for the text)
        raise ApiError(400, "'continue_final_message' must be true or false (SpecChat keeps thinking in the "
                            f"content, so there is no 'reasoning_content' to continue), got {_shown(given)}.",
                       param="continue_final_message")
    carry_on = bool(given)
    if given is None and messages[-1]["role"] == "assistant":  # prefilled: the answer goes on from its text
        carry_on, add = True, False
    if carry_on and add:
        raise ApiError(400, "Cannot set both add_generation_prompt and continue_final_message to true.",
                       param="continue_final_message")
    if carry_on and messages[-1].get("tool_calls"):
        raise ApiError(400, "Cannot continue an assistant message that contains tool calls.", param="messages")
    return {"add_generation_prompt": add, "continue_final_message": carry_on}


MAX_CHOICES = 8


def choices(body) -> int:
    """``n``: how many choices, answered whole (1 to MAX_CHOICES; more than one is not streamed)."""
    if not isinstance(body, dict):
        return 1  # (parse says what is wrong with it)
    n = _number(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be a whole number from 1 to {MAX_CHOICES}.", param="n")
    if n > 1 and body.get("stream"):
        raise ApiError(400, "n > 1 is answered whole: leave out 'stream'.", param="n")
    return n
