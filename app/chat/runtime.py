"""The app's core, below any UI: the loaded pair, chat answers and on/off comparisons as streams of snapshots.

The Gradio UI (app/ui) only renders what this module yields; tests drive it directly too.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..engine import Done, Engine, EngineError, Round, Stats, TextDelta, supports_gpu_offload
from ..models.loader import LoadSpec, Resolved, load_engine, resolve
from .settings import Settings
from .streaming import INTERVAL, Generation
from .thinking import OPEN, opens_thinking

MAX_POINTS = 400  # chart points kept per answer


@dataclass
class Live:
    """One answer so far: text runs tagged with where they came from, running stats, chart points."""

    segments: list[list] = field(default_factory=list)  # [[text, from_draft], ...], adjacent runs merged
    stats: Stats = field(default_factory=Stats)
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (tokens, tokens/s, acceptance)
    done: Done | None = None

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)

    def add(self, ev) -> None:
        if isinstance(ev, TextDelta):
            if self.segments and self.segments[-1][1] == ev.from_draft:
                self.segments[-1][0] += ev.text
            else:
                self.segments.append([ev.text, ev.from_draft])
        elif isinstance(ev, (Round, Done)):
            self.stats = ev.stats
            if ev.stats.rate_measured:
                self.points.append((ev.stats.n_tokens, ev.stats.tokens_per_second, ev.stats.acceptance_rate))
                if len(self.points) > MAX_POINTS:  # keep the chart light on long answers: every other point
                    self.points = self.points[::2]
            if isinstance(ev, Done):
                self.done = ev


@dataclass
class Comparison:
    """Speculation off, then on, for one prompt."""

    prompt: str
    drafter: str
    greedy: bool
    off: Live = field(default_factory=Live)
    on: Live = field(default_factory=Live)
    phase: str = "off"  # off | on | done
    # Under greedy decoding, where the first differing token sits in each output: ((start, end) off, (start, end) on)
    diff_spans: tuple[tuple[int, int], tuple[int, int]] | None = None

    @property
    def speedup(self) -> float:
        a, b = self.off.stats.tokens_per_second, self.on.stats.tokens_per_second
        return b / a if a > 0 else 0.0

    def locate_difference(self, detokenize: Callable[[list[int]], str]) -> None:
        """Under greedy decoding, find where the first differing token sits in each output's text."""
        if not (self.greedy and self.off.done and self.on.done) or (i := self.first_difference()) is None:
            return
        start = len(detokenize(self.off.done.token_ids[:i]))  # the same tokens on both sides up to i
        self.diff_spans = tuple((start, len(detokenize(ids[:i + 1])))
                                for ids in (self.off.done.token_ids, self.on.done.token_ids))

    def first_difference(self) -> int | None:
        """Index of the first token where the two outputs differ; None if they are identical."""
        a, b = self.off.done.token_ids, self.on.done.token_ids
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None if len(a) == len(b) else min(len(a), len(b))


class Runtime:
    """Holds the loaded pair. Loading replaces it (the old one is freed first: two pairs rarely fit at once)."""

    def __init__(self):
        self.engine: Engine | None = None
        self.spec: LoadSpec | None = None
        self.resolved: Resolved | None = None
        self._load_lock = threading.Lock()

    # --- models ---------------------------------------------------------------------------------------------
    def load(self, spec: LoadSpec, progress: Callable[[float, str], None] = lambda f, m: None) -> None:
        """Load a pair. On failure the previous pair is loaded back (if there was one) and the error raised."""
        with self._load_lock:
            previous = self.spec
            progress(0.05, f"Finding {spec.describe()}…")
            resolved = resolve(spec)  # fails early (missing download, bad name) with the old pair still loaded
            progress(0.2, "Freeing the previous pair…")
            self._close_engine()
            try:
                progress(0.35, "Checking files and vocabularies, loading weights…")
                self.engine = load_engine(spec, resolved)
                self.spec, self.resolved = spec, resolved
                progress(1.0, "Loaded")
            except EngineError as exc:
                if previous is not None:
                    progress(0.7, "Reloading the previous pair…")
                    try:
                        self.engine = load_engine(previous, self.resolved)
                    except EngineError:
                        self.spec = self.resolved = None
                        raise EngineError(f"{exc} (The previous pair could not be reloaded either.)") from exc
                    raise EngineError(f"{exc} The previous pair ({previous.describe()}) is still loaded.") from exc
                self.spec = self.resolved = None
                raise

    def _close_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def close(self) -> None:
        with self._load_lock:
            self._close_engine()

    @property
    def has_draft(self) -> bool:
        return bool(self.engine and self.engine.draft)

    def _engine(self) -> Engine:
        if self.engine is None:
            raise EngineError("No model pair is loaded: choose one under Settings → Models and press Load.")
        return self.engine

    def _drafter(self, kind: str) -> str:
        if kind == "model" and not self.has_draft:
            raise EngineError("This pair has no draft model: choose the n-gram drafter or turn speculation off.")
        return kind

    def info(self) -> dict:
        e = self.engine
        return {
            "pair": self.spec.describe() if self.spec else None,
            "target": e.target.model.path.name if e else None,
            "draft": e.draft.model.path.name if e and e.draft else None,
            "n_ctx": e.n_ctx if e else 0,
            "memory_bytes": e.memory_bytes() if e else 0,
            "gpu_offload": supports_gpu_offload(),
        }

    # --- chat -----------------------------------------------------------------------------------------------
    def answer(self, messages: list[dict], settings: Settings, cancel: threading.Event | None = None,
               interval: float = INTERVAL) -> Iterator[Live]:
        """Stream the assistant's reply to ``messages`` (role/content dicts, system prompt included)."""
        engine = self._engine()
        params = settings.generation()
        drafter = self._drafter(settings.drafter)
        prompt = engine.chat_prompt(messages, enable_thinking=settings.enable_thinking)
        live = Live()
        if opens_thinking(prompt):  # the template opened a thinking block: the answer starts inside it
            live.segments.append([OPEN + "\n", False])
        for _ in _stream(engine, engine.chat_tokens(prompt), params, drafter, cancel, interval, live):
            yield live

    def compare(self, messages: list[dict], settings: Settings, cancel: threading.Event | None = None,
                interval: float = INTERVAL) -> Iterator[Comparison]:
        """Speculation off, then on, one after the other so each run has the whole machine; both start from an
        empty cache, so neither reuses the other's prompt evaluation."""
        engine = self._engine()
        params = settings.generation()
        drafter = self._drafter(settings.drafter)
        if drafter == "none":
            raise EngineError("Comparing needs a drafter: choose the draft model or n-gram drafter in Settings.")
        ids = engine.chat_tokens(messages, enable_thinking=settings.enable_thinking)
        cancel = cancel or threading.Event()
        cmp = Comparison(messages[-1]["content"], drafter, params.sampling.temperature == 0)
        for phase, kind in (("off", "none"), ("on", drafter)):
            cmp.phase = phase
            live = getattr(cmp, phase)
            engine.reset()
            for _ in _stream(engine, ids, params, kind, cancel, interval, live):
                yield cmp
            if cancel.is_set():
                break
        cmp.phase = "done"
        cmp.locate_difference(engine.detokenize)
        yield cmp


def _stream(engine: Engine, ids, params, drafter: str, cancel, interval: float, live: Live) -> Iterator[None]:
    """Run one generation on a worker thread, folding each batch of its events into ``live``."""
    gen = Generation(lambda c: engine.generate(ids, params, drafter, c), cancel)
    for batch in gen.batches(interval):
        for ev in batch:
            live.add(ev)
        yield
