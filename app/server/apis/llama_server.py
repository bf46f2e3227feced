"""llama-server's own routes beside the OpenAI API, with its request and response shapes: ``/health``, ``/props``,
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/completion`` (its native completion) and ``/slots`` (its
"not supported" answer: SpecChat has one slot, the engine's turn, and no slot API), each under ``/v1`` and
without it.

llama-server also serves ``/models``, ``/chat/completions`` (and its ``/input_tokens``), ``/responses`` and
``/completions`` (its native completion, as ``/completion``) without the ``/v1`` prefix; ``LlamaAliases`` (an ASGI
wrapper put outside ``guard.Guard``) rewrites those unprefixed paths to their ``/v1`` ones before anything else sees
them, so the guard decides on them exactly as on ``/v1`` (Origin, the key) and the same handlers answer. While no
pair is loaded these routes answer as llama-server does while loading: 503 ``{"error": {"code": 503, "message":
"Loading model", "type": "unavailable_error"}}``.

Tokenizing and rendering a template are CPU work: they run on a worker thread, like the OpenAI handlers' parsing.
"""
from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ...engine import OFF, Done, EngineError, ModelsUnloaded
from ...engine.drafters import registry
from ...prompts import chat_prompt, image_messages, tool_prompt
from .. import token_probs
from ..answer import Answer, Step, progress_stats, prompt_progress, stream, timings
from ..http import ApiError, json_body, sse
from ..native_fields import build_info, native_result
from ..requests.openai import parse, prompts

# llama-server's paths that SpecChat serves under /v1 too; without the prefix they are rewritten to it.
ROUTES = ("/health", "/props", "/tokenize", "/detokenize", "/apply-template", "/slots", "/completion", "/metrics")
# llama-server's routes for what SpecChat deliberately does not do: 501 not_supported_error, as llama-server answers
# a feature it was not started with, rather than 404.
NOT_SUPPORTED = {
    "/embedding": "embeddings", "/embeddings": "embeddings", "/rerank": "reranking", "/reranking": "reranking",
    "/infill": "infill (fill-in-the-middle)", "/lora-adapters": "LoRA adapters",
    "/audio/transcriptions": "audio transcription", "/slots/{id_slot}": "saving or restoring slots",
}
# Unprefixed paths and the /v1 path each stands for: the same, but /completions, which is llama-server's native
# completion (/completion), not OpenAI's.
ALIASES = {p: "/v1" + p for p in ROUTES + tuple(p for p in NOT_SUPPORTED if "{" not in p) + (
    "/models", "/chat/completions", "/chat/completions/input_tokens", "/responses", "/responses/input_tokens")}
ALIASES["/completions"] = "/v1/completion"


def llama_error(status: int, message: str, type_: str) -> JSONResponse:
    """An error in llama-server's shape (``format_error_response``): ``{"error": {"code", "message", "type"}}``."""
    return JSONResponse({"error": {"code": status, "message": message, "type": type_}}, status_code=status)


def loading() -> JSONResponse:
    return llama_error(503, "Loading model", "unavailable_error")


class LlamaAliases:
    """ASGI wrapper: llama-server's unprefixed paths (``ALIASES``) become their ``/v1`` paths. Put it outside the
    guard, so that the guard sees ``/v1/…`` and protects them as the API they are."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        to = ALIASES.get(path) or ("/v1" + path if path.startswith("/slots/") else None)
        if to is not None:
            scope = dict(scope, path=to)
            if scope.get("raw_path") is not None:
                scope["raw_path"] = to.encode() if path in ALIASES else b"/v1" + scope["raw_path"]
        return await self.app(scope, receive, send)


def routes(api: FastAPI, server) -> None:
    """llama-server's routes on ``api``, answered by ``server`` (the app's ``ApiServer``)."""
    routes = _Routes(server)
    api.get("/health")(routes.health)
    api.get("/props")(routes.props)
    api.get("/slots")(routes.slots)
    api.get("/metrics")(routes.metrics)
    api.post("/tokenize")(routes.tokenize)
    api.post("/detokenize")(routes.detokenize)
    api.post("/apply-template")(routes.apply_template)
    api.post("/completion")(NativeCompletion(server).completion)
    for path, what in NOT_SUPPORTED.items():
        api.api_route(path, methods=["GET", "POST"], include_in_schema=False)(_not_supported(what))


class NativeCompletion:
    """llama-server's native completion, ``POST /completion`` (and unprefixed ``/completions``): ``prompt`` (text,
    token ids with strings mixed in, ``{"prompt_string"}``, or a list of those answered one after the other),
    ``n_predict`` and the OpenAI fields, answered in llama-server's native fields (``native_fields``);
    ``return_tokens`` adds the generated ids, ``response_fields`` keeps only the fields named (``a/b`` a nested one),
    ``n_probs`` adds ``completion_probabilities``. Streamed: one ``data: {"content", "tokens", "stop": false, …}``
    event per batch (per token with ``n_probs``), the whole answer's fields on the last, no ``[DONE]``."""

    def __init__(self, server):
        self.server = server

    async def completion(self, request: Request):
        body = await json_body(request)
        if self.server.runtime.engine is None or self.server.loaded_name() is None:
            return loading()
        given = prompts(body.get("prompt")) if isinstance(body, dict) and body.get("prompt") is not None else [None]
        if len(given) == 1:
            return await self._one(request, body)
        if body.get("stream"):
            raise ApiError(400, "Several prompts are answered whole: leave out 'stream'.", param="stream")
        return [await self._one(request, {**body, "prompt": p}) for p in given]  # one after the other, in order

    async def _one(self, request: Request, body):
        given = body if isinstance(body, dict) else {}
        fields = given.get("response_fields") or []
        if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise ApiError(400, "'response_fields' must be a list of field names.", param="response_fields")
        answer = await self.server.begin(request, body, False, id=f"cmpl-{uuid.uuid4().hex[:24]}")
        native = Native(fields, given.get("return_tokens") is True)
        if answer.job.stream:
            return sse(stream(answer, native, self.server.log))
        done = await answer.finish()
        self.server.log(answer)
        return native.result(answer, done)


class Native:
    """A native completion's answer: whole (``result``), or streamed as llama-server sends it."""

    def __init__(self, fields: list[str], return_tokens: bool):
        self.fields, self.return_tokens = fields, return_tokens
        self.texts = None  # (what each token streamed adds to the text)

    def result(self, answer: Answer, done: Done) -> dict:
        out = native_result(answer.engine, answer.ids, done, answer.job.params, answer.model, answer.job.stream,
                            self.return_tokens)
        if done.logprobs is not None and not answer.job.stream:
            out["completion_probabilities"] = token_probs.entries(answer.vocab, done.logprobs,
                                                                  token_probs.Texts(answer.vocab),
                                                                  answer.params.post_sampling_probs)
        return _only(out, self.fields) if self.fields else out

    def start(self, answer: Answer):
        self.texts = token_probs.Texts(answer.vocab)
        return ()

    def step(self, answer: Answer, step: Step):
        for ev in step.progress:  # (asked for with return_progress, before any token)
            chunk = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0, "tokens_predicted": 0,
                     "tokens_evaluated": answer.prompt_n, "prompt_progress": prompt_progress(ev)}
            if answer.job.timings_per_token:
                chunk["timings"] = timings(progress_stats(ev))
            yield f"data: {json.dumps(chunk)}\n\n"
        for chunk in self._chunks(answer, step):
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def end(self, answer: Answer, done: Done):
        yield f"data: {json.dumps(self.result(answer, done), ensure_ascii=False)}\n\n"

    def error(self, exc: EngineError) -> str:
        return f"data: {json.dumps({'error': {'code': 500, 'message': str(exc), 'type': 'server_error'}})}\n\n"

    def _chunks(self, answer: Answer, step: Step):
        """The events for a batch's text: one for all of it, or, with probabilities, one per token as llama-server
        sends them (a token whose text is not whole yet comes with empty content)."""
        base = {"stop": False, "id_slot": 0, "tokens_predicted": step.stats.n_tokens,
                "tokens_evaluated": answer.prompt_n}
        if answer.job.params.logprobs is None:
            if step.deltas:
                yield {"index": 0, "content": "".join(ev.text for ev in step.deltas),
                       "tokens": [t for ev in step.deltas for t in ev.token_ids], **base}
            return
        post = answer.params.post_sampling_probs
        for ev in step.deltas:
            if not ev.token_ids:  # (text held back for a stop string, let go at the end)
                yield {"index": 0, "content": ev.text, "tokens": [], **base}
            for i, (tok, prob) in enumerate(zip(ev.token_ids, ev.logprobs)):
                last = i == len(ev.token_ids) - 1
                yield {"index": 0, "content": ev.text if last else "", "tokens": [tok], **base,
                       "completion_probabilities": token_probs.entries(answer.vocab, [prob], self.texts, post)}


def _not_supported(what: str):
    async def answer():
        return llama_error(501, f"This server does not support {what}: SpecChat serves a chat pair (a target and "
                                "its draft) for generation only.", "not_supported_error")
    return answer


class _Routes:
    def __init__(self, server):
        self.server = server

    def _engine(self):
        """The loaded engine, or None while no pair is (llama-server: still loading)."""
        engine = self.server.runtime.engine
        return engine if engine is not None and engine.ready and self.server.loaded_name() is not None else None

    async def health(self):
        return {"status": "ok"} if self._engine() is not None else loading()

    async def slots(self):
        """llama-server's slot monitor: SpecChat's one slot (it answers one request at a time on its engine), or 501
        when started with --no-slots."""
        if not self.server.slots_enabled:
            return llama_error(501, "This server does not support slots endpoint. Start it without --no-slots.",
                               "not_supported_error")
        engine = self._engine()
        if engine is None:
            return loading()
        busy = self.server.waiting > 0  # (counted in until its generation is over, however it ends)
        slot = {"id": 0, "n_ctx": engine.n_ctx, "speculative": any(d != OFF for d in engine.drafters),
                "is_processing": busy}
        if not busy:  # (what llama-server shows of an idle slot's budget)
            slot["next_token"] = [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]
        return [slot]

    async def metrics(self):
        """llama-server's Prometheus text (app/server/metrics.py), or its 501 when not started with --metrics."""
        server = self.server
        if not server.metrics_enabled:
            return llama_error(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                               "not_supported_error")
        resp = PlainTextResponse(server.metrics.text(server.waiting), media_type="text/plain; version=0.0.4")
        # In llama-server's case (Starlette would write the name in lower case, which HTTP allows, but clients written
        # against llama-server, its own tests among them, look the name up as it sends it)
        resp.raw_headers.append((b"Process-Start-Time-Unix", str(server.metrics.started).encode()))
        return resp

    async def props(self):
        engine = self._engine()
        if engine is None:
            return loading()
        try:
            return await asyncio.to_thread(self._props, engine)
        except ModelsUnloaded:
            return loading()

    def _props(self, engine) -> dict:
        s = self.server.defaults()
        model, draft = engine.model, engine.draft_model
        bos = model.piece_special(model.bos) if model.bos >= 0 else ""
        eos = model.piece_special(model.eos) if model.eos >= 0 else ""
        params = {"n_predict": s.max_tokens, "seed": s.seed, "temperature": s.temperature, "top_k": s.top_k,
                  "top_p": s.top_p, "min_p": s.min_p, "speculative.n_max": s.draft_max,
                  "speculative.n_min": s.draft_min, "speculative.p_min": s.draft_p_min}
        drafter = s.drafter if registry.runs_on(s.drafter, engine.drafters) else engine.drafters[0]
        return {
            "default_generation_settings": {"params": params, "n_ctx": engine.n_ctx},
            "total_slots": 1,
            "model_alias": self.server.model_name(self.server.loaded_name()),
            "model_path": str(model.path),
            "modalities": {"vision": engine.projector is not None, "video": False, "audio": False},
            "endpoint_slots": False, "endpoint_props": False,
            "endpoint_metrics": self.server.metrics_enabled,
            "chat_template": model.chat_template() or "",
            "bos_token": bos, "eos_token": eos,
            "build_info": build_info(),
            "is_sleeping": False,
            "speculative": {  # SpecChat's own: the pair and how it speculates by default
                "pair": self.server.loaded_name(), "target": model.path.name,
                "draft": draft.path.name if draft is not None else None,
                "drafter": drafter, "drafters": list(engine.drafters), "speculation": engine.speculation(drafter),
                "draft_max": s.draft_max, "draft_min": s.draft_min, "draft_p_min": s.draft_p_min,
                "adaptive": s.adaptive},
        }

    async def tokenize(self, request: Request):
        return await self._run(request, self._tokenize)

    async def detokenize(self, request: Request):
        return await self._run(request, self._detokenize)

    async def apply_template(self, request: Request):
        return await self._run(request, self._apply_template)

    async def _run(self, request: Request, work):
        body = await json_body(request)
        engine = self._engine()
        if engine is None:
            return loading()
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        try:
            return await asyncio.to_thread(work, body, engine)
        except ModelsUnloaded:
            return loading()
        except EngineError as exc:
            raise ApiError(400, str(exc)) from None

    def _tokenize(self, body: dict, engine) -> dict:
        content = body.get("content", "")
        add_special, parse_special = _flag(body, "add_special", False), _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        if not isinstance(content, str):
            raise ApiError(400, "'content' must be a string.", param="content")
        model = engine.model
        ids = model.tokenize(content, add_special=add_special, parse_special=parse_special) if content else []
        if not with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(model.piece_text(t))} for t in ids]}

    def _detokenize(self, body: dict, engine) -> dict:
        tokens = body.get("tokens", [])
        model = engine.model
        if not (isinstance(tokens, list) and all(type(t) is int and 0 <= t < model.n_vocab for t in tokens)):
            raise ApiError(400, f"'tokens' must be a list of token ids (0 to {model.n_vocab - 1}).", param="tokens")
        return {"content": b"".join(model.piece_text(t) for t in tokens).decode("utf-8", "replace")}

    def _apply_template(self, body: dict, engine) -> dict:
        job = parse(body, True, self.server.defaults(), engine.drafters)
        model = engine.model
        messages = image_messages(model, job.messages, engine.projector)[0]  # an image: the media marker
        if job.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            ids = tool_prompt(model, messages, job.tools, job.tool_choice, **job.template_variables)[0]
            return {"prompt": b"".join(model.piece_text(t) for t in ids).decode("utf-8", "replace")}
        return {"prompt": chat_prompt(model, messages, **job.template_variables)}


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false.", param=name)
    return value


def _piece(raw: bytes):
    """A token's text, or (not valid UTF-8 on its own) its bytes as numbers, as llama-server writes it."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _only(out: dict, fields: list[str]) -> dict:
    """llama-server's ``response_fields``: each field named, ``a/b`` the field ``b`` of ``a``; missing ones left out."""
    kept = {}
    for name in fields:
        value, found = out, True
        for key in name.split("/"):
            found = isinstance(value, dict) and key in value
            if not found:
                break
            value = value[key]
        if found:
            kept[name] = value
    return kept
