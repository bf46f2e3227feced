"""One answer under way, as every API renders it: the typed record (``Answer``), the one loop over its events
(``Answer.steps``: progress, text with a tool call's text held back, probabilities, figures) and the one stream
around it (``stream``: an API's renderer called at the start, at each batch and at the end; an engine error as the
stream's last event; the generation closed however it ends). llama-server's ``timings`` are written here, from the
engine's measured stats, for every API."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterable, Protocol

from ..engine import Done, EngineError, GenerationParams, PromptProgress, Round, Stats, TextDelta
from ..engine.logprobs import TokenLogprob
from . import token_probs
from .requests.openai import Job


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


def prompt_progress(ev: PromptProgress) -> dict:
    """llama-server's ``prompt_progress``: tokens in all, from the cache, evaluated so far (cached included)."""
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed, "time_ms": ev.seconds * 1e3}


def progress_stats(ev: PromptProgress) -> Stats:
    """The figures so far while a prompt is evaluated (for its ``timings``): the prompt's part, nothing generated."""
    return Stats(prompt_cached=ev.cache, prompt_tokens=ev.processed - ev.cache, time_to_first_token_s=ev.seconds)


def stop_word(done: Done, stops, detokenize) -> str | None:
    """The stop string that ended the answer, if one did: the text of its tokens goes on, past the answer, with one
    of them (None: the end of text, the length, or no stop string)."""
    if not stops or done.finish_reason == "length":
        return None
    full = detokenize(done.token_ids)
    found = [(i, s) for s in stops if (i := full.find(s, max(0, len(done.text) - 1))) >= 0]
    return min(found)[1] if found and len(full) > len(done.text) else None


class HoldBack:
    """Streams what the tool format shows of the answer so far (``Format.visible``: the text before a call, or
    before what may begin one; gpt-oss's final channel); the rest waits for the answer's end, where it is read."""

    def __init__(self, reader):
        self.reader = reader
        self.raw = ""
        self.sent = 0  # characters of the visible text streamed

    def feed(self, text: str) -> str:
        self.raw += text
        shown = self.reader.visible(self.raw)
        new, self.sent = shown[self.sent:], max(self.sent, len(shown))
        return new

    def rest(self, content: str) -> str:
        """What waited and is content after all."""
        return content[self.sent:]


@dataclass
class Step:
    """One batch of an answer's events, read: the prompt's progress reported in it, its text deltas, the text to
    show of them (with tools offered: what cannot begin a call; on the last, what waited and is text after all),
    their tokens' probabilities, and the answer's figures after it (``stats``; ``done`` on the last)."""

    progress: list[PromptProgress]
    deltas: list[TextDelta]
    text: str
    probs: list[TokenLogprob]
    stats: Stats
    done: Done | None


@dataclass
class Answer:
    """A generation under way (``ApiServer.begin``): the request read, its prompt's tokens, the parameters it runs
    with, the tool format its text is read with (None: no call), the first batch of events, the rest, and the
    watch that cancels it when the client goes away. ``id``, ``model`` and ``created`` are what the API's answer
    carries. A stream closes it when it ends (``stream``); else ``finish`` does."""

    job: Job
    ids: list[int]
    params: GenerationParams
    reader: Any  # a tool format (prompts.tools): visible(text), parse(text, tools); None where no call is read
    engine: Any  # an Engine or a WorkerEngine
    model: str
    first: list
    batches: AsyncGenerator
    watch: asyncio.Future
    chat: bool
    id: str = ""
    created: int = 0
    stats: Stats = field(default_factory=Stats)  # the latest figures
    done: Done | None = None

    @property
    def prompt_n(self) -> int:
        return len(self.ids)

    @property
    def vocab(self):
        """The target's vocabulary (tokens' texts, for token probabilities)."""
        return self.engine.model

    def parsed(self, done: Done) -> tuple[str, list]:
        """The answer's content and the tool calls read from it."""
        return self.reader.parse(done.text, self.job.tools) if self.reader else (done.text, [])

    async def steps(self) -> AsyncIterator[Step]:
        """The one loop over the answer's events, a batch at a time (``self.stats``, ``self.done`` kept)."""
        held = HoldBack(self.reader) if self.reader else None
        batch = self.first
        while True:
            for ev in batch:
                if isinstance(ev, (Round, Done)):
                    self.stats = ev.stats
            self.done = batch[-1] if isinstance(batch[-1], Done) else None
            deltas = [ev for ev in batch if isinstance(ev, TextDelta)]
            text = "".join(ev.text for ev in deltas)
            if held is not None:
                text = held.feed(text)
                if self.done is not None:
                    text += held.rest(self.parsed(self.done)[0])
            yield Step([ev for ev in batch if isinstance(ev, PromptProgress)], deltas, text,
                       token_probs.of_batch(batch), self.stats, self.done)
            if self.done is not None:
                return
            batch = await anext(self.batches)

    async def finish(self) -> Done:
        """The whole answer: every batch read, the generation closed."""
        try:
            done = self.first[-1]
            async for batch in self.batches:
                done = batch[-1]
            self.done, self.stats = done, done.stats
            return done
        finally:
            await self.close()

    async def close(self) -> None:
        self.watch.cancel()
        await self.batches.aclose()  # a client gone away lands here too: the generation stops now


class Renderer(Protocol):
    """An API's shape of a streamed answer: its Server-Sent Events before the first batch, for each batch, after
    the last, and for an engine error once the headers went out."""

    def start(self, answer: Answer) -> Iterable[str]: ...
    def step(self, answer: Answer, step: Step) -> Iterable[str]: ...
    def end(self, answer: Answer, done: Done) -> Iterable[str]: ...
    def error(self, exc: EngineError) -> str: ...


async def stream(answer: Answer, renderer: Renderer, log: Callable[[Answer], None]) -> AsyncIterator[str]:
    """An answer as Server-Sent Events in ``renderer``'s shape; closing the connection cancels the generation, and
    an answer that ended is logged (``log``: the app's API section)."""
    try:
        for event in renderer.start(answer):
            yield event
        async for step in answer.steps():
            for event in renderer.step(answer, step):
                yield event
        if answer.done is not None:  # (steps ends at the Done)
            for event in renderer.end(answer, answer.done):
                yield event
    except EngineError as exc:  # after the headers went out: the error as the stream's last event
        yield renderer.error(exc)
    finally:
        await answer.close()
        if answer.done is not None:
            log(answer)
