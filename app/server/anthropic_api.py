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
import threading
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..chat.streaming import batches_async
from ..engine import Done, EngineError, ModelsUnloaded, TextDelta
from .openai_api import _cancel_on_disconnect, _json_body, _retry, timings
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
        messages.append({"role": m["role"], "content": _text_blocks(m.get("content"), f"messages[{i}].content")})
    out = {"messages": messages, "max_tokens": max_tokens, "stream": body.get("stream")}
    for name in ("model", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    out.update({k: v for k, v in body.items() if k in _PASSED or k.startswith("speculative.")})
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

    async def _answer(self, request: Request):
        server = self.server
        body = chat_body(await _json_body(request))
        engine, loaded = server.runtime.engine, server._loaded_name()
        if engine is None or loaded is None:
            raise ApiError(503, "No model pair is loaded: load one in the app, or start `specchat serve --pair NAME`.")
        job, ids, params, _ = await asyncio.to_thread(server._prepare, body, True, engine, loaded)
        cancel = threading.Event()
        leave = server._enter_queue(cancel)
        batches = batches_async(lambda c: engine.generate(ids, params, job.drafter, c), leave, cancel)
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, cancel))
        handed_over = False
        try:
            try:
                first = await anext(batches)
            except StopAsyncIteration:
                return JSONResponse({"type": "error", "error": {"type": "api_error", "message": "The client went "
                                                                                                "away."}}, 499)
            except ModelsUnloaded as exc:
                raise _retry(exc) from None
            except EngineError as exc:
                raise ApiError(400, str(exc)) from None
            meta = dict(id=f"msg_{uuid.uuid4().hex[:24]}", model=body.get("model") or loaded, prompt_n=len(ids),
                        stops=tuple(params.stop), detokenize=engine.detokenize, chat=True)
            if job.stream:
                handed_over = True
                return StreamingResponse(self._stream(first, batches, meta, watch), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            done = first[-1]
            async for batch in batches:
                done = batch[-1]
            server._log(meta, done, True)
            return JSONResponse(message(meta, done))
        finally:
            if not handed_over:
                watch.cancel()
                await batches.aclose()

    async def _stream(self, first: list, batches, meta: dict, watch: asyncio.Future):
        """Anthropic's events: message_start, content_block_start, ping, content_block_delta per batch of text,
        content_block_stop, message_delta (stop_reason, usage, timings), message_stop."""
        done = None
        try:
            start = message(meta, None)
            yield _event("message_start", {"type": "message_start", "message": start})
            yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text", "text": ""}})
            yield _event("ping", {"type": "ping"})
            batch = first
            while True:
                text = "".join(ev.text for ev in batch if isinstance(ev, TextDelta))
                if text:
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                         "delta": {"type": "text_delta", "text": text}})
                done = batch[-1] if isinstance(batch[-1], Done) else None
                if done is not None:
                    break
                batch = await anext(batches)
            yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            end = message(meta, done)
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
    """Anthropic's message for a finished generation (None: the empty one ``message_start`` carries)."""
    reason, sequence = _stop_reason(meta, done) if done is not None else (None, None)
    out = {"id": meta["id"], "type": "message", "role": "assistant", "model": meta["model"],
           "content": [{"type": "text", "text": done.text}] if done is not None else [],
           "stop_reason": reason, "stop_sequence": sequence,
           "usage": {"input_tokens": meta["prompt_n"], "output_tokens": done.stats.n_tokens if done else 0}}
    if done is not None:
        out["timings"] = timings(done.stats)
    return out


def _stop_reason(meta: dict, done: Done) -> tuple[str, str | None]:
    """end_turn, max_tokens or stop_sequence (with the sequence): a stop string ended the answer where the text of
    its tokens goes on, past the answer, with one of them."""
    if done.finish_reason == "length":
        return "max_tokens", None
    if meta["stops"]:
        full = meta["detokenize"](done.token_ids)
        found = [(i, s) for s in meta["stops"] if (i := full.find(s, max(0, len(done.text) - 1))) >= 0]
        if found and len(full) > len(done.text):
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
