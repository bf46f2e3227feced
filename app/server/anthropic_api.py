"""Anthropic's Messages API (``POST /v1/messages``) over the loaded pair, for Claude-style clients and agents.

A request is read as Anthropic writes it (``max_tokens`` required, ``system`` as a string or text blocks, content
as a string or blocks, ``stop_sequences``), turned into the chat body ``request_body.parse`` reads, and answered
through ``OpenAIServer``'s own steps: the same prompt rendering, queue, cancellation, speculation (the server's
default drafter; ``speculative.n_max: 0`` turns it off per request, as on the chat endpoint) and llama-server's
``timings``. The answer is Anthropic's message, or with ``stream`` its Server-Sent Events (``message_start`` …
``message_stop``). Errors come in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.
"""
from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

from ..engine import Done, EngineError, TextDelta
from .openai_api import _Held, _json_body, sse, stop_word, timings
from .request_body import ApiError

# Fields taken as they are on the chat endpoint (llama-server's and SpecChat's own), beside Anthropic's.
_PASSED = ("speculative", "drafter", "seed", "min_p", "chat_template_kwargs")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(exc: ApiError) -> JSONResponse:
    """An ApiError in Anthropic's shape, with its status and headers."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message}}, status_code=exc.status,
                        headers=exc.headers)


def _text_blocks(value, where: str) -> str:
    """A string, or a list of ``{"type": "text", "text"}`` blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise ApiError(400, f"{where}[{i}]: only text blocks are supported here (got {kind!r}).")
            parts.append(block["text"])
        return "".join(parts)
    raise ApiError(400, f"{where} must be a string or a list of text blocks.")


def chat_body(body) -> dict:
    """The chat-completions body that asks for what an Anthropic Messages body asks; any mistake is a 400."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ApiError(400, "max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"max_tokens: must be a positive integer, got {max_tokens!r}.")
    messages = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ApiError(400, "messages: must be a non-empty list of {role, content} objects.")
    for i, m in enumerate(given):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}].role: must be user or assistant.")
        messages.extend(_message(m, f"messages[{i}].content"))
    out = {"messages": messages, "max_tokens": max_tokens, "stream": body.get("stream")}
    out.update(_tools(body))
    for name in ("model", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    out.update({k: v for k, v in body.items() if k in _PASSED or k.startswith("speculative.")})
    return out


def _message(m: dict, where: str) -> list[dict]:
    """One Anthropic message as chat messages: an assistant's ``tool_use`` blocks become its ``tool_calls``, a
    user's ``tool_result`` blocks become ``tool`` messages (before the user's text, if any), a user's ``image``
    blocks OpenAI's ``image_url`` parts (read, and refused, as on the chat endpoint)."""
    content = m.get("content")
    if not isinstance(content, list):
        return [{"role": m["role"], "content": _text_blocks(content, where)}]
    parts, calls, results = [], [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise ApiError(400, f"{where}[{i}]: a tool_use block needs a 'name' and an 'input' object.")
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and m["role"] == "user":
            inner = block.get("content")
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                            "content": _text_blocks(inner if inner is not None else "", f"{where}[{i}].content")})
        elif kind == "image" and m["role"] == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), f"{where}[{i}]")}})
        else:
            parts.append({"type": "text", "text": _text_blocks([block], where)})
    images = any(p["type"] == "image_url" for p in parts)
    joined = parts if images else "".join(p["text"] for p in parts)
    out = results + ([{"role": m["role"], "content": joined}] if parts or calls else [])
    if calls:
        out[-1]["tool_calls"] = calls
    return out


def _image_url(source, where: str) -> str:
    """An image block's source as the URL of an OpenAI image part: base64 data as a data URL; a ``url`` source as
    it is (refused there: nothing is fetched)."""
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    if not (isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str)
            and isinstance(source.get("media_type"), str)):
        raise ApiError(400, f"{where}: an image block needs a source {{\"type\": \"base64\", \"media_type\": "
                            "\"image/png\", \"data\": \"...\"}.")
    return f"data:{source['media_type']};base64,{source['data']}"


def _tools(body: dict) -> dict:
    """Anthropic's ``tools`` (name, description, input_schema) and ``tool_choice`` as the chat endpoint takes them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        return {}
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError(400, "tools: must be a list of {name, description, input_schema} objects.")
    out = {"tools": [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                       "parameters": t.get("input_schema")}} for t in tools]}
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        named = {"type": "function", "function": {"name": choice.get("name")}} if kind == "tool" else None
        picked = {"auto": "auto", "any": "required", "none": "none", "tool": named}.get(kind)
        if picked is None:
            raise ApiError(400, "tool_choice: must be {\"type\": auto, any, none or tool (with a name)}.")
        out["tool_choice"] = picked
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out


class AnthropicMessages:
    """``POST /v1/messages`` answered by an ``OpenAIServer`` (its runtime, queue, defaults and log)."""

    def __init__(self, server):
        self.server = server

    async def messages(self, request: Request):
        try:
            return await self._answer(request)
        except ApiError as exc:
            return anthropic_error(exc)

    async def count_tokens(self, request: Request):
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` for a Messages body (``max_tokens`` not
        needed)."""
        try:
            body = await _json_body(request)
            if isinstance(body, dict) and body.get("max_tokens") is None:
                body = {**body, "max_tokens": 1}
            return JSONResponse(await self.server.input_tokens(chat_body(body)))
        except ApiError as exc:
            return anthropic_error(exc)

    async def _answer(self, request: Request):
        server = self.server
        body = chat_body(await _json_body(request))
        started = await server._begin(request, body, True)
        job = started.job
        meta = dict(id=f"msg_{uuid.uuid4().hex[:24]}", model=body.get("model") or started.loaded,
                    prompt_n=len(started.ids), stops=tuple(job.params.stop), chat=True,
                    detokenize=server.runtime.engine.detokenize, tools=started.reader, offered=job.tools)
        if job.stream:
            return sse(self._stream(started.first, started.batches, meta, started.watch))
        done = await started.finish()
        server._log(meta, done, True)
        return JSONResponse(message(meta, done))

    async def _stream(self, first: list, batches, meta: dict, watch: asyncio.Future):
        """Anthropic's events: message_start, ping, a text block (content_block_start, a content_block_delta per
        batch of text, content_block_stop) once there is text, a block per tool call (its input as one
        input_json_delta), message_delta (stop_reason, usage, timings), message_stop."""
        done, index = None, 0
        held = _Held(meta["tools"]) if meta["tools"] else None  # text that may begin a call waits
        try:
            yield _event("message_start", {"type": "message_start", "message": message(meta, None)})
            opened = held is None  # (with tools offered, the text block opens once there is text)
            if opened:
                yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                     "content_block": {"type": "text", "text": ""}})
            yield _event("ping", {"type": "ping"})
            batch = first
            while True:
                text = "".join(ev.text for ev in batch if isinstance(ev, TextDelta))
                done = batch[-1] if isinstance(batch[-1], Done) else None
                if held is not None:
                    text = held.feed(text)
                    if done is not None:
                        text += held.rest(meta["tools"].parse(done.text, meta["offered"])[0])
                if text:
                    if not opened:
                        opened = True
                        yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                             "content_block": {"type": "text", "text": ""}})
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                         "delta": {"type": "text_delta", "text": text}})
                if done is not None:
                    break
                batch = await anext(batches)
            end = message(meta, done)
            if opened:
                yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
                index = 1
            for block in (b for b in end["content"] if b["type"] == "tool_use"):
                yield _event("content_block_start", {"type": "content_block_start", "index": index,
                                                     "content_block": {**block, "input": {}}})
                yield _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
                yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            yield _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": end["stop_reason"],
                                                                            "stop_sequence": end["stop_sequence"]},
                                           "usage": end["usage"], "timings": end["timings"]})
            yield _event("message_stop", {"type": "message_stop"})
        except EngineError as exc:  # after the headers went out: the error as the stream's last event
            yield _event("error", {"type": "error", "error": {"type": "api_error", "message": str(exc)}})
        finally:
            watch.cancel()
            await batches.aclose()
            if done is not None:
                self.server._log(meta, done, True)


def message(meta: dict, done: Done | None) -> dict:
    """Anthropic's message for a finished generation (None: the empty one ``message_start`` carries). With tools
    offered, its text block (left out when empty and there are calls) and a ``tool_use`` block per call read from the answer."""
    reason, sequence = _stop_reason(meta, done) if done is not None else (None, None)
    content = []
    if done is not None:
        text, calls = meta["tools"].parse(done.text, meta["offered"]) if meta["tools"] else (done.text, [])
        content = ([{"type": "text", "text": text}] if text or not calls else []) + [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments or "{}")} for c in calls]
        reason = "tool_use" if calls and reason == "end_turn" else reason
    out = {"id": meta["id"], "type": "message", "role": "assistant", "model": meta["model"], "content": content,
           "stop_reason": reason, "stop_sequence": sequence,
           "usage": _usage(meta["prompt_n"], done)}
    if done is not None:
        out["timings"] = timings(done.stats)
    return out


def _usage(prompt_n: int, done: Done | None) -> dict:
    """Anthropic's usage, as llama-server writes it: ``input_tokens`` evaluated, ``cache_read_input_tokens`` reused
    from the previous request (their sum is the prompt), ``output_tokens``."""
    cached = done.stats.prompt_cached if done else 0
    return {"input_tokens": prompt_n - cached, "cache_read_input_tokens": cached,
            "output_tokens": done.stats.n_tokens if done else 0}


def _stop_reason(meta: dict, done: Done) -> tuple[str, str | None]:
    """end_turn, max_tokens or stop_sequence (with the sequence)."""
    if done.finish_reason == "length":
        return "max_tokens", None
    word = stop_word(done, meta["stops"], meta.get("detokenize"))  # (read only when there are stops)
    return ("stop_sequence", word) if word else ("end_turn", None)


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
