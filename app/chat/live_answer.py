"""One answer as it streams (``Live``): its text in runs tagged by where they came from (draft or target), its
running figures and the chart's points. The runtime folds the engine's events into it; the UI renders it."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import Done, PromptProgress, Round, Stats, TextDelta

MAX_POINTS = 400  # chart points kept per answer


@dataclass
class Live:
    """One answer so far: text runs tagged with where they came from, running stats, chart points."""

    # [[text, origin], ...], adjacent runs merged; origin: False (the target's), the drafter's name (a drafted token
    # the target accepted), or True (drafted, by a drafter not recorded: answers kept by earlier versions)
    segments: list[list] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (tokens, tokens/s, acceptance)
    done: Done | None = None
    prompt: PromptProgress | None = None  # how far the prompt's reading got (before the first token)
    earlier: Stats | None = None  # an answer continued (Continue): its earlier runs' figures, which ``stats`` adds in

    @classmethod
    def going_on(cls, text: str, segments: list[list] | None = None, stats: dict | None = None) -> Live:
        """An answer written before (as stored: its text, runs and figures), to be continued."""
        earlier = Stats.from_dict(stats) if stats else None
        return cls(segments=[list(s) for s in segments or ([[text, False]] if text else [])],
                   stats=earlier or Stats(), earlier=earlier)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)

    def add(self, ev) -> None:
        if isinstance(ev, PromptProgress):
            self.prompt = ev
        elif isinstance(ev, TextDelta):
            origin = (ev.drafter or True) if ev.from_draft else False
            if self.segments and self.segments[-1][1] == origin:
                self.segments[-1][0] += ev.text
            else:
                self.segments.append([ev.text, origin])
        elif isinstance(ev, (Round, Done)):
            s = self.stats = self.earlier.then(ev.stats) if self.earlier is not None else ev.stats
            if s.rate_measured:  # (the chart plots what the panel shows: a continued answer's figures, both runs)
                self.points.append((s.n_tokens, s.tokens_per_second, s.acceptance_rate))
                if len(self.points) > MAX_POINTS:  # keep the chart light on long answers: every other point
                    self.points = self.points[::2]
            if isinstance(ev, Done):
                self.done = ev
