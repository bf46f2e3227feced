"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) over the loaded pair, for
Claude-style clients and agents.

A body is read by ``requests.anthropic`` into the one job and answered as every API is: the same prompt rendering,
queue, cancellation, speculation (the server's default drafter; ``speculative.n_max: 0`` turns it off per request,
as on the chat endpoint) and llama-server's ``timings``. The answer is Anthropic's message, or with ``stream`` its
Server-Sent Events (``message_start`` … ``message_stop``). Errors come in Anthropic's shape: ``{"type": "error",
"error": {"type", "message"}}``.
"""
from __future__ import annotations

import json
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...engine import Done, EngineError
from ..answer import Answer, Step, stop_word, stream, timings
from ..http import ApiError, json_body, sse
from ..requests.anthropic import chat_body

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def routes(api: FastAPI, server) -> None:
    """Anthropic's routes on ``api``, answered by ``server`` (the app's ``ApiServer``)."""

    async def messages(request: Request):
        try:
            body = chat_body(await json_body(request))
            answer = await server.begin(request, body, True, id=f"msg_{uuid.uuid4().hex[:24]}",
                                        model=body.get("model"))
            if answer.job.stream:
                return sse(stream(answer, Events(), server.log))
            done = await answer.finish()
            server.log(answer)
            return JSONResponse(message(answer, done))
        except ApiError as exc:
            return anthropic_error(exc)

    async def count_tokens(request: Request):
        """``{"input_tokens": N}`` for a Messages body (``max_tokens`` not needed)."""
        try:
            body = await json_body(request)
            if isinstance(body, dict) and body.get("max_tokens") is None:
                body = {**body, "max_tokens": 1}
            return JSONResponse(await server.input_tokens(chat_body(body)))
        except ApiError as exc:
            return anthropic_error(exc)

    api.post("/messages")(messages)
    api.post("/messages/count_tokens")(count_tokens)


def anthropic_error(exc: ApiError) -> JSONResponse:
    """An ApiError in Anthropic's shape, with its status and headers."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message}}, status_code=exc.status,
                        headers=exc.headers)


class Events:
    """Anthropic's events: message_start, ping, a text block (content_block_start, a content_block_delta per batch
    of text, content_block_stop) once there is text, a block per tool call (its input as one input_json_delta),
    message_delta (stop_reason, usage, timings), message_stop."""

    def __init__(self):
        self.opened = False  # the text block

    def start(self, answer: Answer):
        yield _event("message_start", {"type": "message_start", "message": message(answer, None)})
        if answer.reader is None:  # (with tools offered, the text block opens once there is text)
            yield self._open()
        yield _event("ping", {"type": "ping"})

    def step(self, answer: Answer, step: Step):
        if step.text:
            if not self.opened:
                yield self._open()
            yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": step.text}})

    def end(self, answer: Answer, done: Done):
        end, index = message(answer, done), 0
        if self.opened:
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

    def error(self, exc: EngineError) -> str:
        return _event("error", {"type": "error", "error": {"type": "api_error", "message": str(exc)}})

    def _open(self) -> str:
        self.opened = True
        return _event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}})


def message(answer: Answer, done: Done | None) -> dict:
    """Anthropic's message for a finished generation (None: the empty one ``message_start`` carries). With tools
    offered, its text block (left out when empty and there are calls) and a ``tool_use`` block per call read from
    the answer."""
    reason, sequence = _stop_reason(answer, done) if done is not None else (None, None)
    content = []
    if done is not None:
        text, calls = answer.parsed(done)
        content = ([{"type": "text", "text": text}] if text or not calls else []) + [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments or "{}")} for c in calls]
        reason = "tool_use" if calls and reason == "end_turn" else reason
    out = {"id": answer.id, "type": "message", "role": "assistant", "model": answer.model, "content": content,
           "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(answer.prompt_n, done)}
    if done is not None:
        out["timings"] = timings(done.stats)
    return out


def _usage(prompt_n: int, done: Done | None) -> dict:
    """Anthropic's usage, as llama-server writes it: ``input_tokens`` evaluated, ``cache_read_input_tokens`` reused
    from the previous request (their sum is the prompt), ``output_tokens``."""
    cached = done.stats.prompt_cached if done else 0
    return {"input_tokens": prompt_n - cached, "cache_read_input_tokens": cached,
            "output_tokens": done.stats.n_tokens if done else 0}


def _stop_reason(answer: Answer, done: Done) -> tuple[str, str | None]:
    """end_turn, max_tokens or stop_sequence (with the sequence)."""
    if done.finish_reason == "length":
        return "max_tokens", None
    stops = answer.params.stop
    word = stop_word(done, stops, answer.engine.detokenize) if stops else None
    return ("stop_sequence", word) if word else ("end_turn", None)


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
