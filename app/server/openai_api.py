"""The OpenAI-compatible API (``/v1``) over the loaded pair, with llama-server's ``timings`` on every answer.

Requests take turns on the engine (its lock is the slot the chat UI uses too, so an API call and a browser chat
never interleave in one context); a bounded number may wait, beyond that the answer is 503 with Retry-After.
A client that goes away — while its request waits for its turn, mid-stream or before a whole answer is sent —
cancels its generation at once, and so does shutting down (``cancel_all``). Who may call at all (Host, Origin,
the key) is decided in front of every route by ``guard.Guard``.

A body is bounded (``request_body.BodyLimit``), and the CPU work of a request before its turn (decoding the JSON,
reading the fields, rendering and tokenizing the prompt) runs on a worker thread: one large request never holds up
the event loop, so the other routes and the UI answer meanwhile. A prompt is refused for its length before it is
tokenized when its size alone says it cannot fit the context.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..chat.runtime import Runtime
from ..chat.settings import Settings
from ..chat.streaming import batches_async
from ..engine import Done, EngineError, ModelsUnloaded, PromptProgress, Round, Stats, TextDelta
from ..prompts import chat_tokens, plain_tokens, text_of, tool_prompt
from . import llama_server_api, token_probs
from .metrics import Metrics
from .request_body import ApiError, BodyLimit, Job, _number, body_limit, decode, parse

MAX_WAITING = 64  # requests queued or running at once; more get 503


def timings(stats: Stats) -> dict:
    """llama-server's ``timings`` object, from the engine's measured stats (``cache_n``: prompt tokens reused)."""
    prompt_ms = stats.time_to_first_token_s * 1000
    predicted_ms = stats.decode_seconds * 1000
    return {
        "cache_n": stats.prompt_cached,
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_second": stats.prompt_tokens / prompt_ms * 1000 if prompt_ms > 0 else None,
        "predicted_n": stats.n_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": stats.tokens_per_second if stats.rate_measured else None,
        "prompt_per_token_ms": prompt_ms / stats.prompt_tokens if stats.prompt_tokens else None,
        "predicted_per_token_ms": 1000 / stats.tokens_per_second if stats.rate_measured else None,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
        "draft_n_forced": stats.n_forced,  # of draft_n, tokens a grammar forced (SpecChat's own field)
    }


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


@dataclass
class Started:
    """A generation under way (``OpenAIServer._begin``): the request read, its prompt's tokens, the tool format its
    answer is read with (None: no call), the first batch of events, the rest, and the watch that cancels it when the
    client goes away. A stream that takes it over closes it when it ends; else ``finish`` does."""

    job: Job
    ids: list[int]
    reader: object
    first: list
    batches: AsyncIterator
    watch: asyncio.Future
    loaded: str  # the name answers carry for the loaded pair (OpenAIServer.model_name)

    async def finish(self) -> Done:
        """The whole answer: every batch read, the generation closed."""
        try:
            done = self.first[-1]
            async for batch in self.batches:
                done = batch[-1]
            return done
        finally:
            await self.close()

    async def close(self) -> None:
        self.watch.cancel()
        await self.batches.aclose()


class OpenAIServer:
    def __init__(self, runtime: Runtime, defaults: Callable[[], Settings] = Settings, max_waiting: int = MAX_WAITING,
                 max_body: int | None = None, metrics: bool = False, aliases: tuple[str, ...] = (),
                 tags: tuple[str, ...] = (), verbose: bool = False, slots: bool = True):
        self.runtime = runtime
        self.defaults = defaults  # the app's current settings: what a request leaves out
        self.max_waiting = max_waiting
        self.max_body = max_body  # bytes (--max-body-mb); None: sized to the loaded context (request_body.body_limit)
        self.waiting = 0
        self.generations = 0  # generations started (queued included): what a refused request must not move
        self._count_lock = threading.Lock()
        self._cancels: set[threading.Event] = set()  # one per request queued or running
        self.served: deque[Served] = deque(maxlen=50)
        self.metrics = Metrics()  # counted always, served at /metrics only when asked for (--metrics)
        self.metrics_enabled = metrics
        self.slots_enabled = slots  # /slots (llama-server's default; --no-slots: 501)
        self.aliases = tuple(aliases)  # --alias: the names the loaded pair is listed and answers by
        self.tags = tuple(tags)  # --tags: shown beside them
        self.verbose = verbose  # --verbose: answers carry llama-server's __verbose object unless a request says not

    # --- the app --------------------------------------------------------------------------------------------
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
                return _error(ApiError(500, f"Internal error: {exc}", "server_error"))

        api.exception_handler(ApiError)(lambda request, exc: _error(exc))
        api.exception_handler(404)(lambda request, exc: _error(ApiError(404, f"No such endpoint: {request.url.path}",
                                                                      code="not_found")))
        api.exception_handler(405)(lambda request, exc: _error(ApiError(405, f"{request.method} is not allowed on "
                                                                      f"{request.url.path}.", code="method_not_allowed")))
        llama_server_api.register(api, self)  # llama-server's /health, /props, /tokenize, …
        api.get("/models")(self.models)
        api.post("/chat/completions")(self.chat_completions)
        api.post("/chat/completions/input_tokens")(self.chat_input_tokens)
        api.post("/completions")(self.completions)
        from .anthropic_api import AnthropicMessages  # (here: that module imports this one)
        anthropic = AnthropicMessages(self)
        api.post("/messages")(anthropic.messages)  # Anthropic's Messages API
        api.post("/messages/count_tokens")(anthropic.count_tokens)
        from .responses_api import Responses  # (the same)
        responses = Responses(self)
        api.post("/responses")(responses.create)  # OpenAI's Responses API
        api.post("/responses/input_tokens")(responses.input_tokens)
        api.add_middleware(BodyLimit, limit=self.body_limit)  # added last: in front of the rest
        return api

    def body_limit(self) -> int:
        """The largest request body taken now, in bytes."""
        if self.max_body:
            return self.max_body
        try:
            return body_limit(self.runtime.engine.n_ctx)
        except AttributeError:  # no pair loaded (or it was closed meanwhile)
            return body_limit(None)

    async def models(self) -> dict:
        from ..models.downloads import downloaded_pairs

        loaded = self._loaded_name()
        names = ([loaded] if loaded else []) + [n for n in downloaded_pairs() if n != loaded]
        now = int(time.time())
        data = [{"id": n, "object": "model", "created": now, "owned_by": "specchat", "loaded": n == loaded}
                for n in names]
        if loaded:  # how it speculates by default, for clients that show it (SpecChat pointed at this server does)
            data[0]["speculation"] = self._speculation()
            if self.aliases:  # listed by its first alias, as llama-server (the pair's name is kept beside)
                data[0].update(id=self.aliases[0], aliases=list(self.aliases), pair=loaded)
            if self.tags:
                data[0]["tags"] = list(self.tags)
        return {"object": "list", "data": data}

    def _speculation(self) -> str:
        return self.runtime.engine.speculation(self.defaults().drafter)

    async def chat_completions(self, request: Request):
        return await self._answer(request, chat=True)

    async def chat_input_tokens(self, request: Request):
        """llama-server's ``/chat/completions/input_tokens``: the prompt's length, nothing generated."""
        return await self.input_tokens(await _json_body(request))

    async def input_tokens(self, body) -> dict:
        """``{"input_tokens": N}`` for a chat body: the prompt rendered and tokenized (on a worker thread) as its
        generation would be, and counted."""
        engine, loaded = self.runtime.engine, self._loaded_name()
        if engine is None or loaded is None:
            raise ApiError(503, "No model pair is loaded: load one in the app, or start `specchat serve --pair NAME`.",
                           "server_error", code="no_model_loaded")
        ids = (await asyncio.to_thread(self._prepare, body, True, engine, loaded))[1]
        return {"input_tokens": len(ids)}

    async def completions(self, request: Request):
        return await self._answer(request, chat=False)

    # --- answering ------------------------------------------------------------------------------------------
    def _loaded_name(self) -> str | None:
        return self.runtime.spec.describe() if self.runtime.spec and self.runtime.engine else None

    def model_name(self, loaded: str) -> str:
        """The name answers carry for the loaded pair ``loaded``: its first --alias, else its own."""
        return self.aliases[0] if self.aliases else loaded

    def cancel_all(self) -> None:
        """Stop every request queued or running (shutting down)."""
        with self._count_lock:
            for cancel in self._cancels:
                cancel.set()

    async def _answer(self, request: Request, chat: bool):
        body = await _json_body(request)
        n = _choices(body)
        answers = []
        for i in range(n):  # n > 1: the choices one after the other (the prompt is reused from the cache)
            started = await self._begin(request, {**body, "n": 1} if n > 1 else body, chat)
            job, ids = started.job, started.ids
            meta = dict(id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", created=int(time.time()),
                        model=started.loaded, chat=chat, prompt_n=len(ids), tools=started.reader, offered=job.tools,
                        vocab=self.runtime.engine.model, post=job.params.post_sampling_probs,
                        engine=self.runtime.engine, stream=job.stream, ids=ids, params=job.params,
                        verbose=self.verbose if job.verbose is None else job.verbose)
            if job.stream:  # (the stream closes the generation when it ends)
                return sse(self._stream(job, started.first, started.batches, meta, started.watch))
            done = await started.finish()
            self._log(meta, done, chat)
            answers.append(self._final(meta, done, index=i))
        whole = answers[0]
        if n > 1:  # one answer: its choices, the usage of all, the timings of the last
            completion = sum(a["usage"]["completion_tokens"] for a in answers)
            usage = whole["usage"]
            usage.update(completion_tokens=completion, total_tokens=usage["prompt_tokens"] + completion)
            whole.update(choices=[a["choices"][0] for a in answers], timings=answers[-1]["timings"])
        return JSONResponse(whole)

    def _prepare(self, body, chat: bool, engine, loaded: str) -> tuple[Job, list[int], object, object]:
        """On a worker thread: the request read (``Job``), its prompt's tokens, the generation's parameters and the
        tool format its answer is read with (None: no call). Any mistake is an ApiError; the context length is
        checked before the prompt is tokenized where its size alone says it cannot fit."""
        job = parse(body, chat, self.defaults(), engine.drafters, bias_tokens(engine.model))
        for check, value, param in ((engine.check_drafter, job.drafter, "drafter"),
                                    (engine.check_logit_bias, job.params.sampling, "logit_bias")):
            try:
                check(value)
            except ModelsUnloaded as exc:  # (an engine worker loading the pair again after a crash, say)
                raise _retry(exc) from None
            except EngineError as exc:
                raise ApiError(400, str(exc), param=param) from None
        params, reader = job.params, None
        try:
            tokens_given = not chat and isinstance(job.prompt, list)  # (token ids: nothing to render)
            texts = [text_of(m["content"]) for m in job.messages] if chat else [] if tokens_given else [job.prompt]
            _check_length(engine, texts, chat)
            if chat and (job.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in job.messages)):
                ids, grammar, fmt, shown = tool_prompt(engine.model, job.messages, job.tools, job.tool_choice,
                                                       engine.projector, **job.template_variables)
                params, reader = replace(params, grammar=grammar, shown=shown), fmt  # (fmt None: no call)
            elif chat:
                ids = chat_tokens(engine.model, job.messages, engine.projector, **job.template_variables)
            else:
                ids = _token_ids(engine, job.prompt) if tokens_given else plain_tokens(engine.model, job.prompt)
        except ModelsUnloaded as exc:
            raise _retry(exc) from None
        except EngineError as exc:
            raise ApiError(400, str(exc)) from None
        if len(ids) >= engine.n_ctx:
            raise _too_long("The prompt is", len(ids), engine.n_ctx, chat)
        return job, ids, params, reader

    def _generate(self, request: Request, engine, ids: list[int], params, drafter: str):
        """A prepared request's generation: a place in the queue, its batches (validation errors and the wait for
        the engine come with the first), and a watch that cancels it when the client goes away."""
        cancel = threading.Event()
        leave = self._enter_queue(cancel)
        batches = self.metrics.observe(batches_async(lambda c: engine.generate(ids, params, drafter, c), leave, cancel))
        return batches, asyncio.ensure_future(_cancel_on_disconnect(request, cancel))

    async def _begin(self, request: Request, body, chat: bool) -> Started:
        """A request body read, its prompt rendered (on a worker thread), its generation queued and its first batch
        of events come: what every endpoint that generates starts with. A mistake, no pair loaded, the pair unloaded
        meanwhile or the client gone before its turn are ApiErrors (400, 503, 503 with Retry-After, 499)."""
        engine = self.runtime.engine
        loaded = self._loaded_name()
        if engine is None or loaded is None:
            raise ApiError(503, "No model pair is loaded: load one in the app, or start `specchat serve --pair NAME`.",
                           "server_error", code="no_model_loaded")
        # (reading the fields builds a grammar, and a prompt is rendered and tokenized: CPU work, off the loop)
        job, ids, params, reader = await asyncio.to_thread(self._prepare, body, chat, engine, loaded)
        batches, watch = self._generate(request, engine, ids, params, job.drafter)
        try:
            first = await anext(batches)  # validation errors (and the wait for the engine) come before output
        except BaseException as exc:
            watch.cancel()
            await batches.aclose()
            if isinstance(exc, StopAsyncIteration):  # cancelled before its turn: the client is gone
                raise ApiError(499, "The client went away.", code="client_closed") from None
            if isinstance(exc, ModelsUnloaded):  # another pair was loaded while this request waited
                raise _retry(exc) from None
            if isinstance(exc, EngineError):
                raise ApiError(400, str(exc)) from None
            raise
        return Started(job, ids, reader, first, batches, watch, self.model_name(loaded))

    def _enter_queue(self, cancel: threading.Event) -> Callable[[], None]:
        """Count a request in (503 when too many wait); returns what counts it out, called on the worker when its
        generation is over, however it ends."""
        with self._count_lock:
            if self.waiting >= self.max_waiting:
                raise ApiError(503, f"Busy: {self.waiting} requests are queued; try again shortly.", "server_error",
                               code="queue_full", headers={"Retry-After": "2"})
            self.waiting += 1
            self.generations += 1
            self._cancels.add(cancel)

        def leave() -> None:
            with self._count_lock:
                self.waiting -= 1
                self._cancels.discard(cancel)

        return leave

    def _final(self, meta: dict, done: Done, index: int = 0) -> dict:
        finish = "length" if done.finish_reason == "length" else "stop"
        texts = token_probs.Texts(meta["vocab"]) if done.logprobs is not None else None
        if meta["chat"]:
            content, calls = meta["tools"].parse(done.text, meta["offered"]) if meta["tools"] else (done.text, [])
            message = {"role": "assistant", "content": content if content.strip() or not calls else None}
            if calls:
                message["tool_calls"] = [_call(c) for c in calls]
                finish = "tool_calls" if finish == "stop" else finish
            choice = {"index": index, "message": message, "finish_reason": finish}
            if done.logprobs is not None:
                choice["logprobs"] = {"content": token_probs.entries(meta["vocab"], done.logprobs, texts, meta["post"])}
        else:
            probs = None if done.logprobs is None else token_probs.legacy(meta["vocab"], done.logprobs, texts)
            choice = {"index": index, "text": done.text, "logprobs": probs, "finish_reason": finish}
        out = {"id": meta["id"], "object": "chat.completion" if meta["chat"] else "text_completion",
               "created": meta["created"], "model": meta["model"],
               "system_fingerprint": llama_server_api.fingerprint(), "choices": [choice],
               "usage": _usage(meta, done.stats), "timings": timings(done.stats)}
        return _with_verbose(out, meta, done)

    async def _stream(self, job: Job, first: list, batches: AsyncIterator, meta: dict, watch: asyncio.Future):
        """Server-Sent Events: OpenAI's chunks, llama-server's timings on the last (and on each with
        ``timings_per_token``), usage when asked, then ``[DONE]``. Closing the connection cancels the generation."""
        chat = meta["chat"]
        stats = Stats()
        held = _Held(meta["tools"]) if meta["tools"] else None  # text that may begin a call waits
        offset = 0  # characters of the answer sent (the legacy logprobs' text_offset)
        texts = token_probs.Texts(meta["vocab"]) if job.params.logprobs is not None else None

        def chunk(text: str | None, finish: str | None = None, role: bool = False, with_timings: bool = False,
                  calls: list | None = None, probs: list | None = None, done: Done | None = None,
                  progress: PromptProgress | None = None) -> str:
            nonlocal offset
            if chat:
                # (the first, as llama-server: the role, no content yet)
                delta = ({"role": "assistant", "content": None} if role else {"content": text} if text is not None
                         else {})
                if calls:
                    delta = {"tool_calls": calls}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                if probs:
                    choice["logprobs"] = {"content": token_probs.entries(meta["vocab"], probs, texts, meta["post"])}
            else:
                legacy = token_probs.legacy(meta["vocab"], probs, texts, offset) if probs else None
                choice = {"index": 0, "text": text or "", "logprobs": legacy, "finish_reason": finish}
                offset += len(text or "")
            out = {"id": meta["id"], "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": meta["created"], "model": meta["model"],
                   "system_fingerprint": llama_server_api.fingerprint(), "choices": [choice]}
            if with_timings or (job.timings_per_token and not role):  # (the role's chunk comes before any token)
                out["timings"] = timings(stats if progress is None else progress_stats(progress))
            if done is not None:  # (the last: llama-server's debug object, when asked for)
                _with_verbose(out, meta, done)
            if progress is not None:
                out["prompt_progress"] = prompt_progress(progress)
            return f"data: {json.dumps(out, ensure_ascii=False)}\n\n"

        done = None
        try:
            if chat:
                yield chunk(None, role=True)
            batch = first
            while True:
                for ev in batch:
                    if isinstance(ev, (Round, Done)):
                        stats = ev.stats
                    elif isinstance(ev, PromptProgress):  # (asked for with return_progress, before any token)
                        yield chunk(None, role=chat, progress=ev, with_timings=job.timings_per_token)
                done = batch[-1] if isinstance(batch[-1], Done) else None
                text = "".join(ev.text for ev in batch if isinstance(ev, TextDelta))
                probs = token_probs.of_batch(batch)
                if held is not None:
                    text = held.feed(text)
                if text or probs:  # what arrived together goes out as one chunk
                    yield chunk(text, probs=probs)
                if done is not None:
                    break
                batch = await anext(batches)
            finish = "length" if done.finish_reason == "length" else "stop"
            if held is not None:
                content, calls = meta["tools"].parse(done.text, meta["offered"])
                rest = held.rest(content)
                if rest:  # what waited and is content after all
                    yield chunk(rest)
                for i, call in enumerate(calls):  # each call: its id and name, then its arguments
                    yield chunk(None, calls=[{"index": i, "id": call.id, "type": "function",
                                              "function": {"name": call.name, "arguments": ""}}])
                    yield chunk(None, calls=[{"index": i, "function": {"arguments": call.arguments}}])
                finish = "tool_calls" if calls and finish == "stop" else finish
            yield chunk(None, finish, with_timings=True, done=done)
            if job.include_usage:
                tail = {"id": meta["id"], "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": meta["created"], "model": meta["model"], "choices": [],
                        "usage": _usage(meta, done.stats), "timings": timings(done.stats)}  # (as llama-server)
                yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"
        except EngineError as exc:  # after the headers went out: the error as the stream's last event
            yield f"data: {json.dumps(ApiError(500, str(exc), 'server_error').body())}\n\n"
        finally:
            watch.cancel()
            await batches.aclose()  # a client gone away lands here too: the generation stops now
            if done is not None:
                self._log(meta, done, chat)

    def _log(self, meta: dict, done: Done, chat: bool) -> None:
        s = done.stats
        self.served.appendleft(Served(time.time(), "chat" if chat else "completions", meta["model"], s.n_tokens,
                                      s.tokens_per_second if s.rate_measured else None,
                                      s.acceptance_rate if s.n_drafted else None, s.drafter, done.finish_reason))


def sse(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-Sent Events, not buffered on the way (a proxy honours X-Accel-Buffering)."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set ``cancel`` when the client closes the connection (the body is read already: what comes next from the
    server is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


class _Held:
    """Streams what the tool format shows of the answer so far (``Format.visible``: the text before a call, or
    before what may begin one; gpt-oss's final channel); the rest waits for the answer's end, where it is read."""

    def __init__(self, fmt):
        self.fmt = fmt
        self.raw = ""
        self.sent = 0  # characters of the visible text streamed

    def feed(self, text: str) -> str:
        self.raw += text
        shown = self.fmt.visible(self.raw)
        new, self.sent = shown[self.sent:], max(self.sent, len(shown))
        return new

    def rest(self, content: str) -> str:
        return content[self.sent:]


def stop_word(done: Done, stops, detokenize) -> str | None:
    """The stop string that ended the answer, if one did: the text of its tokens goes on, past the answer, with one
    of them (None: the end of text, the length, or no stop string)."""
    if not stops or done.finish_reason == "length":
        return None
    full = detokenize(done.token_ids)
    found = [(i, s) for s in stops if (i := full.find(s, max(0, len(done.text) - 1))) >= 0]
    return min(found)[1] if found and len(full) > len(done.text) else None


MAX_CHOICES = 8


def _choices(body) -> int:
    """``n``: how many choices, answered whole (1 to MAX_CHOICES; more than one is not streamed)."""
    if not isinstance(body, dict):
        return 1  # (parse says what is wrong with it)
    n = _number(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be a whole number from 1 to {MAX_CHOICES}.", param="n")
    if n > 1 and body.get("stream"):
        raise ApiError(400, "n > 1 is answered whole: leave out 'stream'.", param="n")
    return n


def _call(call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def bias_tokens(model) -> Callable[[str], list[int]]:
    """How a text in ``logit_bias`` becomes tokens: the model's tokenizer, no special tokens (llama-server's)."""
    return lambda text: model.tokenize(text, add_special=False, parse_special=False)


def prompt_progress(ev: PromptProgress) -> dict:
    """llama-server's ``prompt_progress``: tokens in all, from the cache, evaluated so far (cached included)."""
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed, "time_ms": ev.seconds * 1e3}


def progress_stats(ev: PromptProgress) -> Stats:
    """The figures so far while a prompt is evaluated (for its ``timings``): the prompt's part, nothing generated."""
    return Stats(prompt_cached=ev.cache, prompt_tokens=ev.processed - ev.cache, time_to_first_token_s=ev.seconds)


def _with_verbose(out: dict, meta: dict, done: Done) -> dict:
    """``out`` with llama-server's ``__verbose`` debug object (its native completion fields: the prompt as rendered
    and read, the settings, why it stopped) where the request or ``--verbose`` asks for it."""
    if meta["verbose"]:
        from .native_completion import native_result  # (it builds on this module)

        out["__verbose"] = native_result(meta["engine"], meta["ids"], done, meta["params"], meta["model"],
                                         meta["stream"])
    return out


def _usage(meta: dict, stats: Stats) -> dict:
    return {"prompt_tokens": meta["prompt_n"], "completion_tokens": stats.n_tokens,
            "total_tokens": meta["prompt_n"] + stats.n_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached}}  # reused from the previous request


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _json_body(request: Request):
    """The request's JSON body (read whole by ``BodyLimit``, decoded on a worker thread). Only JSON: a web page can
    send text/plain or a form without asking first, never application/json."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"Send the request as JSON (Content-Type: application/json), not {kind or 'nothing'}.",
                       code="unsupported_media_type")
    return await asyncio.to_thread(decode, await request.body())


# Vocabularies whose entries are never shorter, in bytes, than the text each token stands for: SentencePiece (a
# space is written "▁", a byte "<0x0A>") and byte-level BPE (each byte one or two bytes of UTF-8). No token of
# theirs stands for more characters than their longest entry has bytes, but for whitespace: llama.cpp lets some
# special tokens (Phi-3's) swallow the whitespace beside them, so it is not counted.
_LONGEST_ENTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SPM, _BPE = 1, 2  # llama.cpp's enum llama_vocab_type
_SPACES = " \t\n\r\v\f"  # what C's isspace() takes, which llama.cpp strips with


def _check_length(engine, texts: list[str], chat: bool) -> None:
    """A prompt refused for its length before it is tokenized (tokenizing megabytes takes seconds and memory):
    it has at least ``characters other than whitespace / longest entry`` tokens, which may already be more than the
    context holds."""
    model = engine.model
    if model.vocab_type not in (_SPM, _BPE):
        return  # (others normalize text: a token may stand for more than its entry)
    longest = _LONGEST_ENTRY.get(model)
    if longest is None:  # once per model: a pass over its vocabulary
        longest = _LONGEST_ENTRY[model] = max((len(model.token_text(t)) for t in range(model.n_vocab)), default=1)
    characters = sum(len(t) - sum(t.count(c) for c in _SPACES) for t in texts)
    at_least = characters // max(longest, 1)
    if at_least >= engine.n_ctx:
        raise _too_long("The prompt is at least", at_least, engine.n_ctx, chat)


def _too_long(what: str, n_prompt: int, n_ctx: int, chat: bool) -> ApiError:
    """llama-server's ``exceed_context_size_error``, with its ``n_prompt_tokens`` and ``n_ctx``."""
    return ApiError(400, f"{what} {n_prompt} tokens but the context holds {n_ctx}: the request exceeds the available "
                         "context size; shorten it.", "exceed_context_size_error",
                    param="messages" if chat else "prompt", code="context_length_exceeded",
                    extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})


def _token_ids(engine, sequence: list) -> list[int]:
    """A prompt given as token ids (strings mixed in: tokenized, special tokens parsed, no BOS added), as llama-server
    takes it: the ids used as they are, each in the vocabulary."""
    model = engine.model
    ids = [t for piece in sequence for t in ([piece] if type(piece) is int else
                                             model.tokenize(piece, add_special=False, parse_special=True))]
    if not all(0 <= t < model.n_vocab for t in ids):
        raise ApiError(400, f"'prompt' holds a token id outside the vocabulary (0 to {model.n_vocab - 1}).",
                       param="prompt")
    return ids


def _retry(exc: ModelsUnloaded) -> ApiError:
    """The models went away (another pair loaded) before this request was served: 503, worth sending again."""
    return ApiError(503, str(exc), "server_error", code="model_unloaded", headers={"Retry-After": "1"})
