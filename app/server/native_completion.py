"""llama-server's native completion, ``POST /completion`` (and unprefixed ``/completions``): ``prompt`` (text, token
ids with strings mixed in, ``{"prompt_string"}``, or a list of those answered one after the other), ``n_predict`` and
the OpenAI fields, answered as ``{"content", "tokens", "stop", "stop_type", "stopping_word", "tokens_predicted",
"tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated", "timings", …}``; ``return_tokens``
adds the generated ids, ``response_fields`` keeps only the fields named (``a/b`` a nested one, as llama-server),
``n_probs`` adds ``completion_probabilities`` (``token_probs.entries``). Streamed: one ``data: {"content", "tokens",
"stop": false, …}`` event per batch (per token with ``n_probs``), the whole answer's fields on the last, no
``[DONE]`` (as llama-server)."""
from __future__ import annotations

import json
import math

from fastapi import Request

from ..engine import Done, EngineError, PromptProgress, Round, TextDelta
from . import token_probs
from .llama_server_api import loading
from .openai_api import _json_body, progress_stats, prompt_progress, sse, stop_word, timings
from .request_body import ApiError, prompts


class NativeCompletion:
    def __init__(self, server):
        self.server = server  # the OpenAIServer

    async def completion(self, request: Request):
        body = await _json_body(request)
        server = self.server
        if server.runtime.engine is None or server._loaded_name() is None:
            return loading()
        given = prompts(body.get("prompt")) if isinstance(body, dict) and body.get("prompt") is not None else [None]
        if len(given) == 1:
            return await self._one(request, body)
        if body.get("stream"):
            raise ApiError(400, "Several prompts are answered whole: leave out 'stream'.", param="stream")
        return [await self._one(request, {**body, "prompt": p}) for p in given]  # one after the other, in order

    async def _one(self, request: Request, body: dict):
        server = self.server
        started = await server._begin(request, body, False)
        job, ids, batches = started.job, started.ids, started.batches
        engine = server.runtime.engine
        return_tokens = body.get("return_tokens") is True
        post = job.params.post_sampling_probs
        fields = body.get("response_fields") or []
        if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            await started.close()
            raise ApiError(400, "'response_fields' must be a list of field names.", param="response_fields")

        def final(done: Done) -> dict:
            server._log({"model": started.loaded}, done, False)  # for the app's API section
            out = native_result(engine, ids, done, job.params, started.loaded, job.stream, return_tokens)
            if done.logprobs is not None and not job.stream:
                texts = token_probs.Texts(engine.model)
                out["completion_probabilities"] = token_probs.entries(engine.model, done.logprobs, texts, post)
            return _only(out, fields) if fields else out

        def chunks(deltas: list[TextDelta], n: int):
            """The events for a batch's text: one for all of it, or, with probabilities, one per token as
            llama-server sends them (a token whose text is not whole yet comes with empty content)."""
            base = {"stop": False, "id_slot": 0, "tokens_predicted": n, "tokens_evaluated": len(ids)}
            if job.params.logprobs is None:
                if deltas:
                    yield {"index": 0, "content": "".join(ev.text for ev in deltas),
                           "tokens": [t for ev in deltas for t in ev.token_ids], **base}
                return
            for ev in deltas:
                if not ev.token_ids:  # (text held back for a stop string, let go at the end)
                    yield {"index": 0, "content": ev.text, "tokens": [], **base}
                for i, (tok, prob) in enumerate(zip(ev.token_ids, ev.logprobs)):
                    last = i == len(ev.token_ids) - 1
                    yield {"index": 0, "content": ev.text if last else "", "tokens": [tok], **base,
                           "completion_probabilities": token_probs.entries(engine.model, [prob], streamed, post)}

        streamed = token_probs.Texts(engine.model)  # (what each token streamed adds to the text)

        async def events():
            batch, done = started.first, None
            try:
                while done is None:
                    for ev in batch:  # (asked for with return_progress, before any token)
                        if isinstance(ev, PromptProgress):
                            chunk = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                                     "tokens_predicted": 0, "tokens_evaluated": len(ids),
                                     "prompt_progress": prompt_progress(ev)}
                            if job.timings_per_token:
                                chunk["timings"] = timings(progress_stats(ev))
                            yield f"data: {json.dumps(chunk)}\n\n"
                    done = batch[-1] if isinstance(batch[-1], Done) else None
                    deltas = [ev for ev in batch if isinstance(ev, TextDelta)]
                    n = next((ev.stats.n_tokens for ev in reversed(batch) if isinstance(ev, (Round, Done))), 0)
                    for chunk in chunks(deltas, n):
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    if done is None:
                        batch = await anext(batches)
                yield f"data: {json.dumps(final(done), ensure_ascii=False)}\n\n"
            except EngineError as exc:
                yield f"data: {json.dumps({'error': {'code': 500, 'message': str(exc), 'type': 'server_error'}})}\n\n"
            finally:
                await started.close()

        if job.stream:
            return sse(events())
        return final(await started.finish())


def native_result(engine, ids: list[int], done: Done, params, model: str, streamed: bool = False,
                  return_tokens: bool = False) -> dict:
    """A finished answer in llama-server's native fields (``/completion``'s, and the ``__verbose`` object its OpenAI
    routes add when asked): the prompt as the model read it, the answer, why it stopped, the settings, timings."""
    word = stop_word(done, params.stop, engine.detokenize)
    return {"index": 0, "content": "" if streamed else done.text,
            "tokens": list(done.token_ids) if return_tokens and not streamed else [], "id_slot": 0,
            "stop": True, "model": model, "tokens_predicted": done.stats.n_tokens,
            "tokens_evaluated": len(ids), "generation_settings": _settings(params, engine),
            "prompt": b"".join(engine.model.piece_text(t) for t in ids).decode("utf-8", "replace"),
            "has_new_line": "\n" in done.text, "truncated": False, "tokens_cached": done.stats.prompt_cached,
            "stop_type": "limit" if done.finish_reason == "length" else "word" if word else "eos",
            "stopping_word": word or "", "timings": timings(done.stats)}


def _settings(params, engine) -> dict:
    """``generation_settings``: what this generation ran with, in llama-server's names (``logit_bias`` as its
    ``{"bias", "token"}`` list, a ban's bias null, ``ignore_eos``'s bans of the end-of-generation tokens included)."""
    s, d = params.sampling, params.draft
    bias = list(s.logit_bias) + ([(t, -math.inf) for t in engine.model.eog_tokens] if s.ignore_eos else [])
    return {"n_ctx": engine.n_ctx, "n_predict": params.max_tokens, "seed": s.seed, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "stop": list(params.stop),
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in bias],
            "ignore_eos": s.ignore_eos,
            "speculative.n_max": d.draft_max, "speculative.n_min": d.draft_min, "speculative.p_min": d.draft_p_min}


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
