"""OpenAI's API (``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``) over the loaded pair, with
llama-server's ``timings`` on every answer: a chat completion or a text completion whole (``n`` choices one after
the other, the prompt reused from the cache), or streamed as OpenAI's chunks, usage when asked, then ``[DONE]``."""
from __future__ import annotations

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...engine import Done, EngineError, PromptProgress, Stats
from .. import token_probs
from ..answer import Answer, Step, progress_stats, prompt_progress, stream, timings
from ..http import ApiError, json_body, sse
from ..native_fields import fingerprint, native_result
from ..requests.openai import choices


def routes(api: FastAPI, server) -> None:
    """OpenAI's routes on ``api``, answered by ``server`` (the app's ``ApiServer``)."""
    api.get("/models")(lambda: models(server))

    async def chat_completions(request: Request):
        return await answer(server, request, chat=True)

    async def chat_input_tokens(request: Request):
        """llama-server's ``/chat/completions/input_tokens``: the prompt's length, nothing generated."""
        return await server.input_tokens(await json_body(request))

    async def completions(request: Request):
        return await answer(server, request, chat=False)

    api.post("/chat/completions")(chat_completions)
    api.post("/chat/completions/input_tokens")(chat_input_tokens)
    api.post("/completions")(completions)


def models(server) -> dict:
    """The loaded pair first (by its first --alias, with how it speculates by default), then the downloaded ones."""
    from ...models.downloads import downloaded_pairs

    loaded = server.loaded_name()
    names = ([loaded] if loaded else []) + [n for n in downloaded_pairs() if n != loaded]
    now = int(time.time())
    data = [{"id": n, "object": "model", "created": now, "owned_by": "specchat", "loaded": n == loaded}
            for n in names]
    if loaded:  # how it speculates by default, for clients that show it (SpecChat pointed at this server does)
        data[0]["speculation"] = server.runtime.engine.speculation(server.defaults().drafter)
        if server.aliases:  # listed by its first alias, as llama-server (the pair's name is kept beside)
            data[0].update(id=server.aliases[0], aliases=list(server.aliases), pair=loaded)
        if server.tags:
            data[0]["tags"] = list(server.tags)
    return {"object": "list", "data": data}


async def answer(server, request: Request, chat: bool):
    body = await json_body(request)
    n = choices(body)
    answers = []
    for i in range(n):  # n > 1: the choices one after the other (the prompt is reused from the cache)
        started = await server.begin(request, {**body, "n": 1} if n > 1 else body, chat,
                                     id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}")
        verbose = server.verbose if started.job.verbose is None else started.job.verbose
        if started.job.stream:  # (the stream closes the generation when it ends)
            return sse(stream(started, Chunks(verbose), server.log))
        done = await started.finish()
        server.log(started)
        answers.append(final(started, done, verbose, index=i))
    whole = answers[0]
    if n > 1:  # one answer: its choices, the usage of all, the timings of the last
        completion = sum(a["usage"]["completion_tokens"] for a in answers)
        usage = whole["usage"]
        usage.update(completion_tokens=completion, total_tokens=usage["prompt_tokens"] + completion)
        whole.update(choices=[a["choices"][0] for a in answers], timings=answers[-1]["timings"])
    return JSONResponse(whole)


def final(answer: Answer, done: Done, verbose: bool, index: int = 0) -> dict:
    """The whole answer: a chat completion (its message, tool calls read from it) or a text completion."""
    finish = "length" if done.finish_reason == "length" else "stop"
    texts = token_probs.Texts(answer.vocab) if done.logprobs is not None else None
    post = answer.params.post_sampling_probs
    if answer.chat:
        content, calls = answer.parsed(done)
        message = {"role": "assistant", "content": content if content.strip() or not calls else None}
        if calls:
            message["tool_calls"] = [_call(c) for c in calls]
            finish = "tool_calls" if finish == "stop" else finish
        choice = {"index": index, "message": message, "finish_reason": finish}
        if done.logprobs is not None:
            choice["logprobs"] = {"content": token_probs.entries(answer.vocab, done.logprobs, texts, post)}
    else:
        probs = None if done.logprobs is None else token_probs.legacy(answer.vocab, done.logprobs, texts)
        choice = {"index": index, "text": done.text, "logprobs": probs, "finish_reason": finish}
    out = {"id": answer.id, "object": "chat.completion" if answer.chat else "text_completion",
           "created": answer.created, "model": answer.model, "system_fingerprint": fingerprint(), "choices": [choice],
           "usage": _usage(answer, done.stats), "timings": timings(done.stats)}
    return _with_verbose(out, answer, done) if verbose else out


class Chunks:
    """A streamed answer as OpenAI's chunks: llama-server's timings on the last (and on each with
    ``timings_per_token``), usage when asked, then ``[DONE]``."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.offset = 0  # characters of the answer sent (the legacy logprobs' text_offset)
        self.texts = None

    def start(self, answer: Answer):
        if answer.job.params.logprobs is not None:
            self.texts = token_probs.Texts(answer.vocab)
        if answer.chat:  # (the first, as llama-server: the role, no content yet)
            yield self._chunk(answer, None, role=True)

    def step(self, answer: Answer, step: Step):
        for ev in step.progress:  # (asked for with return_progress, before any token)
            yield self._chunk(answer, None, role=answer.chat, progress=ev, with_timings=answer.job.timings_per_token)
        if step.text or step.probs:  # what arrived together goes out as one chunk
            yield self._chunk(answer, step.text, probs=step.probs)

    def end(self, answer: Answer, done: Done):
        finish = "length" if done.finish_reason == "length" else "stop"
        if answer.reader is not None:
            calls = answer.parsed(done)[1]
            for i, call in enumerate(calls):  # each call: its id and name, then its arguments
                yield self._chunk(answer, None, calls=[{"index": i, "id": call.id, "type": "function",
                                                        "function": {"name": call.name, "arguments": ""}}])
                yield self._chunk(answer, None, calls=[{"index": i, "function": {"arguments": call.arguments}}])
            finish = "tool_calls" if calls and finish == "stop" else finish
        yield self._chunk(answer, None, finish, with_timings=True, done=done)
        if answer.job.include_usage:
            tail = {"id": answer.id, "object": "chat.completion.chunk" if answer.chat else "text_completion",
                    "created": answer.created, "model": answer.model, "choices": [],
                    "usage": _usage(answer, done.stats), "timings": timings(done.stats)}  # (as llama-server)
            yield f"data: {json.dumps(tail)}\n\n"
        yield "data: [DONE]\n\n"

    def error(self, exc: EngineError) -> str:
        return f"data: {json.dumps(ApiError(500, str(exc), 'server_error').body())}\n\n"

    def _chunk(self, answer: Answer, text: str | None, finish: str | None = None, role: bool = False,
               with_timings: bool = False, calls: list | None = None, probs: list | None = None,
               done: Done | None = None, progress: PromptProgress | None = None) -> str:
        post = answer.params.post_sampling_probs
        if answer.chat:
            delta = ({"role": "assistant", "content": None} if role else {"content": text} if text is not None
                     else {})
            if calls:
                delta = {"tool_calls": calls}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if probs:
                choice["logprobs"] = {"content": token_probs.entries(answer.vocab, probs, self.texts, post)}
        else:
            legacy = token_probs.legacy(answer.vocab, probs, self.texts, self.offset) if probs else None
            choice = {"index": 0, "text": text or "", "logprobs": legacy, "finish_reason": finish}
            self.offset += len(text or "")
        out = {"id": answer.id, "object": "chat.completion.chunk" if answer.chat else "text_completion",
               "created": answer.created, "model": answer.model, "system_fingerprint": fingerprint(),
               "choices": [choice]}
        if with_timings or (answer.job.timings_per_token and not role):  # (the role's chunk comes before any token)
            out["timings"] = timings(answer.stats if progress is None else progress_stats(progress))
        if done is not None and self.verbose:  # (the last: llama-server's debug object, when asked for)
            _with_verbose(out, answer, done)
        if progress is not None:
            out["prompt_progress"] = prompt_progress(progress)
        return f"data: {json.dumps(out, ensure_ascii=False)}\n\n"


def _call(call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _with_verbose(out: dict, answer: Answer, done: Done) -> dict:
    """``out`` with llama-server's ``__verbose`` debug object (its native completion fields: the prompt as rendered
    and read, the settings, why it stopped)."""
    out["__verbose"] = native_result(answer.engine, answer.ids, done, answer.job.params, answer.model,
                                     answer.job.stream)
    return out


def _usage(answer: Answer, stats: Stats) -> dict:
    return {"prompt_tokens": answer.prompt_n, "completion_tokens": stats.n_tokens,
            "total_tokens": answer.prompt_n + stats.n_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached}}  # reused from the previous request
