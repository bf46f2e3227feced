"""The HTTP API over the loaded pair (``/v1``): one ``ApiServer`` holds what every API shares — the runtime, the
app's settings (what a request leaves out), the one slot, the log of requests served, the metrics — and the steps
every endpoint that generates starts with (``begin``); ``app()`` mounts each API's routes (``apis/``) behind the
error handlers and the body limit. Who may call at all (Host, Origin, the key) is decided in front of every route by
``guard.Guard``.

The CPU work of a request before its turn (decoding the JSON, reading the fields, rendering and tokenizing the
prompt) runs on a worker thread: one large request never holds up the event loop, so the other routes and the UI
answer meanwhile."""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from fastapi import FastAPI, Request

from ..chat.runtime import Runtime
from ..chat.settings import Settings
from ..engine import EngineError, ModelsUnloaded
from .answer import Answer
from .apis import anthropic, llama_server, openai, responses
from .http import ApiError, BodyLimit, body_limit, error_response
from .metrics import Metrics
from .prepare import prepare, retry
from .slot import MAX_WAITING, Slot

NO_PAIR = "No model pair is loaded: load one in the app, or start `specchat serve --pair NAME`."


@dataclass
class Served:
    """One request answered, for the app's API section."""

    when: float
    endpoint: str
    model: str
    tokens: int
    tokens_per_second: float | None
    acceptance: float | None
    drafter: str
    finish: str


def answers_scope(request: Request) -> str:
    """Whose earlier answers a request adds to and drafts from (``suffix``): the key it came with (a digest of it),
    so that one key's requests never draft from another's; "" without one, as the app's own chat."""
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "").strip()
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16] if key else ""


class ApiServer:
    def __init__(self, runtime: Runtime, defaults: Callable[[], Settings] = Settings, max_waiting: int = MAX_WAITING,
                 max_body: int | None = None, metrics: bool = False, aliases: tuple[str, ...] = (),
                 tags: tuple[str, ...] = (), verbose: bool = False, slots: bool = True):
        self.runtime = runtime
        self.defaults = defaults  # the app's current settings: what a request leaves out
        self.max_body = max_body  # bytes (--max-body-mb); None: sized to the loaded context (http.body_limit)
        self.served: deque[Served] = deque(maxlen=50)
        self.metrics = Metrics()  # counted always, served at /metrics only when asked for (--metrics)
        self.slot = Slot(self.metrics, max_waiting)
        self.metrics_enabled = metrics
        self.slots_enabled = slots  # /slots (llama-server's default; --no-slots: 501)
        self.aliases = tuple(aliases)  # --alias: the names the loaded pair is listed and answers by
        self.tags = tuple(tags)  # --tags: shown beside them
        self.verbose = verbose  # --verbose: answers carry llama-server's __verbose object unless a request says not

    def app(self, cors: list[str] | None = None) -> FastAPI:
        api = FastAPI(title="SpecChat OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
        if cors:
            from fastapi.middleware.cors import CORSMiddleware

            api.add_middleware(CORSMiddleware, allow_origins=cors, allow_methods=["*"], allow_headers=["*"])

        @api.middleware("http")
        async def errors(request: Request, call_next):
            try:
                return await call_next(request)
            except Exception as exc:  # never crash the server: say what went wrong
                return error_response(ApiError(500, f"Internal error: {exc}", "server_error"))

        api.exception_handler(ApiError)(lambda request, exc: error_response(exc))
        api.exception_handler(404)(lambda request, exc: error_response(
            ApiError(404, f"No such endpoint: {request.url.path}", code="not_found")))
        api.exception_handler(405)(lambda request, exc: error_response(
            ApiError(405, f"{request.method} is not allowed on {request.url.path}.", code="method_not_allowed")))
        for each in (llama_server, openai, anthropic, responses):  # llama-server's /health, /props, … first
            each.routes(api, self)
        api.add_middleware(BodyLimit, limit=self.body_limit)  # added last: in front of the rest
        return api

    # --- what the APIs share --------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self.slot.waiting

    @property
    def generations(self) -> int:
        return self.slot.generations

    def cancel_all(self) -> None:
        self.slot.cancel_all()

    def body_limit(self) -> int:
        """The largest request body taken now, in bytes."""
        if self.max_body:
            return self.max_body
        engine = self.runtime.engine
        try:
            return body_limit(engine.n_ctx if engine is not None else None)
        except AttributeError:  # (closed meanwhile)
            return body_limit(None)

    def loaded_name(self) -> str | None:
        """The loaded pair's name (None: none is loaded)."""
        return self.runtime.spec.describe() if self.runtime.spec and self.runtime.engine else None

    def model_name(self, loaded: str) -> str:
        """The name answers carry for the loaded pair ``loaded``: its first --alias, else its own."""
        return self.aliases[0] if self.aliases else loaded

    def _loaded(self):
        """The engine and the loaded pair's name, or a 503."""
        engine, loaded = self.runtime.engine, self.loaded_name()
        if engine is None or loaded is None:
            raise ApiError(503, NO_PAIR, "server_error", code="no_model_loaded")
        return engine, loaded

    async def input_tokens(self, body) -> dict:
        """``{"input_tokens": N}`` for a chat body: the prompt rendered and tokenized (on a worker thread) as its
        generation would be, and counted."""
        engine, _ = self._loaded()
        return {"input_tokens": len((await asyncio.to_thread(prepare, body, True, self.defaults(), engine)).ids)}

    async def begin(self, request: Request, body, chat: bool, id: str, model: str | None = None) -> Answer:
        """A request body read, its prompt rendered (on a worker thread), its generation queued and its first batch
        of events come: what every endpoint that generates starts with. ``id`` and ``model`` are what the answer
        carries (``model`` None: the loaded pair's name). A mistake, no pair loaded, the pair unloaded meanwhile or
        the client gone before its turn are ApiErrors (400, 503, 503 with Retry-After, 499)."""
        engine, loaded = self._loaded()
        # (reading the fields builds a grammar, and a prompt is rendered and tokenized: CPU work, off the loop)
        ready = await asyncio.to_thread(prepare, body, chat, self.defaults(), engine)
        ready = replace(ready, params=replace(ready.params, draft=replace(ready.params.draft,
                                                                           scope=answers_scope(request))))
        batches, watch = self.slot.generate(request, engine, ready.ids, ready.params, ready.job.drafter)
        try:
            first = await anext(batches)  # validation errors (and the wait for the engine) come before output
        except BaseException as exc:
            watch.cancel()
            await batches.aclose()
            if isinstance(exc, StopAsyncIteration):  # cancelled before its turn: the client is gone
                raise ApiError(499, "The client went away.", code="client_closed") from None
            if isinstance(exc, ModelsUnloaded):  # another pair was loaded while this request waited
                raise retry(exc) from None
            if isinstance(exc, EngineError):
                raise ApiError(400, str(exc)) from None
            raise
        return Answer(ready.job, ready.ids, ready.params, ready.reader, engine, model or self.model_name(loaded),
                      first, batches, watch, chat, id=id, created=int(time.time()))

    def log(self, answer: Answer) -> None:
        """An answer that ended, for the app's API section."""
        done = answer.done
        if done is None:
            return
        s = done.stats
        self.served.appendleft(Served(time.time(), "chat" if answer.chat else "completions", answer.model,
                                      s.n_tokens, s.tokens_per_second if s.rate_measured else None,
                                      s.acceptance_rate if s.n_drafted else None, s.drafter, done.finish_reason))
