"""HTTP for every API: errors in OpenAI's shape (``ApiError``), the JSON body (bounded before it is read, decoded on a
worker thread into JSON of bounded depth whose strings are text and whose numbers are finite) and Server-Sent Events.

A body is bounded by ``BodyLimit`` (413, at once when Content-Length says so): the app never sees a byte more. What
a client sends that cannot be read is a 4xx naming where, never a 500."""
from __future__ import annotations

import asyncio
import json
import math
import re
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse


class ApiError(Exception):
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status, and
    llama-server's fields where it has them (``extra``: ``n_prompt_tokens`` and ``n_ctx`` of a prompt too long)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers, self.extra = headers or {}, extra or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}


# The largest body /v1 takes unless --max-body-mb says otherwise: 64 bytes of JSON per token of the loaded context,
# and never less than 16 MiB. A token of English is about 4 bytes; one of escaped non-ASCII text (\uXXXX, 6 bytes a
# character) or of a run of spaces in code is longer, so 64 holds any prompt the context can take, with its history
# and tools, many times over. 16 MiB is that for the largest context a catalog pair loads (262,144 tokens): a pair
# loaded with a bigger --ctx raises the limit with it. A body within it is decoded and tokenized off the event loop.
BODY_BYTES_PER_TOKEN = 64
MIN_BODY_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 100  # JSON nesting: deeper is a 400 (json.loads gives up, with RecursionError, at about 1,000)
DRAIN_SECONDS, DRAIN_BYTES = 5.0, 256 * 1024 * 1024  # what is read and dropped of a body refused for its size
_SURROGATE = re.compile("[\ud800-\udfff]")


def body_limit(n_ctx: int | None) -> int:
    """The default body limit for a pair loaded with an ``n_ctx``-token context (None: none loaded)."""
    return max(MIN_BODY_BYTES, (n_ctx or 0) * BODY_BYTES_PER_TOKEN)


class BodyLimit:
    """ASGI middleware: a request body larger than ``limit()`` bytes is refused with 413 in OpenAI's shape, at once
    when its Content-Length says so, else as soon as the bytes sent pass it; the app never sees a byte of it. A
    body within the limit is read whole and handed on (its end then is the client's disconnect, as before)."""

    def __init__(self, app, limit):
        self.app, self.limit = app, limit  # limit(): bytes, asked per request (the loaded context may change)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit()
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await _refuse_body(receive, send, limit, int(declared), headers)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before its body was whole: nobody to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                chunks.clear()
                return await _refuse_body(receive, send, limit, None, headers)
            if not message.get("more_body"):
                break
        body, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _refuse_body(receive, send, limit: int, declared: int | None, headers: dict) -> None:
    """413, then the rest of the body read and dropped (up to DRAIN_SECONDS and DRAIN_BYTES), so that a client
    that writes its whole body before it reads (most do) gets the answer, not a connection reset."""
    size = f"{declared / 2**20:.1f} MB" if declared is not None else f"over {limit / 2**20:.1f} MB"
    error = ApiError(413, f"The request body is {size}; this server takes at most {limit / 2**20:.1f} MB (start it "
                          "with a larger --max-body-mb to raise that).", code="request_too_large")
    payload = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload, "more_body": True})
    # A client that waits for "100 Continue" sends nothing more: it has its answer.
    if headers.get(b"expect", b"").lower() != b"100-continue":
        loop = asyncio.get_running_loop()
        deadline, dropped = loop.time() + DRAIN_SECONDS, 0
        while dropped < DRAIN_BYTES and (left := deadline - loop.time()) > 0:
            try:
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                break
            dropped += len(message.get("body", b""))
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def decode(raw: bytes | str, what: str = "The request body", param: str | None = None):
    """JSON as the API takes it: at most MAX_DEPTH levels deep, strings that are text (no lone surrogate, as
    ``"\\ud800"`` decodes to) and finite numbers (Python's json reads NaN, Infinity and 1e999 as floats).
    ``what`` names it in errors, ``param`` is the field they name (None: the top-level key at fault)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"{what} is nested too deeply: at most {MAX_DEPTH} levels.", param=param) from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, f"{what} is not valid JSON.", param=param) from None
    check_values(value, what, param)
    return value


def check_values(value, what: str = "The request body", param: str | None = None) -> None:
    """Raise a 400 naming where ``value`` (decoded JSON) is nested too deeply, holds a string that is not text
    or a number that is not finite. Walked without recursion, so no depth can overflow the stack."""
    stack = [(value, 1, (), None)]  # (value, its depth, the path to its container, its key there)
    while stack:
        v, depth, path, key = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                _bad(what, param, path, key, "holds a lone UTF-16 surrogate (as \\ud800 decodes to), not text")
        elif isinstance(v, float):
            if not math.isfinite(v):
                _bad(what, param, path, key, f"is {v}: numbers must be finite (NaN and Infinity are not JSON)")
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                _bad(what, param, path, key, f"is nested too deeply: at most {MAX_DEPTH} levels")
            here = path + (key,) if key is not None else path
            if isinstance(v, dict):
                for k, item in v.items():
                    if _SURROGATE.search(k):
                        _bad(what, param, here, None, "has a key holding a lone UTF-16 surrogate, not text")
                    stack.append((item, depth + 1, here, k))
            else:
                stack.extend((item, depth + 1, here, i) for i, item in enumerate(v))


def _bad(what: str, param: str | None, path: tuple, key, why: str):
    """The 400 for what ``check_values`` found at ``path`` + ``key``: ``'messages[0].content' holds …``."""
    where = path + (key,) if key is not None else path
    name = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" if i else k for i, k in enumerate(where))
    name = name if len(name) <= 80 else name[:80] + "…"
    if param is None and where and isinstance(where[0], str):
        param = where[0]
    if not where:
        raise ApiError(400, f"{what} {why}.", param=param)
    if what == "The request body":
        raise ApiError(400, f"'{name}' {why}.", param=param)
    raise ApiError(400, f"{what} at {name} {why}.", param=param)


def error_response(exc: ApiError) -> JSONResponse:
    """An ApiError in OpenAI's shape, with its status and headers."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def json_body(request: Request):
    """The request's JSON body (read whole by ``BodyLimit``, decoded on a worker thread). Only JSON: a web page can
    send text/plain or a form without asking first, never application/json."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"Send the request as JSON (Content-Type: application/json), not {kind or 'nothing'}.",
                       code="unsupported_media_type")
    return await asyncio.to_thread(decode, await request.body())


def sse(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-Sent Events, not buffered on the way (a proxy honours X-Accel-Buffering)."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
