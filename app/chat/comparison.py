"""One on/off comparison (``Comparison``): the same prompt answered with speculation off, then on, and where the
two outputs first differ where they should be the same (greedy, or sampled by SpecChat with one seed)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .live_answer import Live


@dataclass
class Comparison:
    """Speculation off, then on, for one prompt."""

    prompt: str
    drafter: str
    same_tokens: bool  # both runs should give the same tokens: greedy, or SpecChat's engine sampling with one seed
    off: Live = field(default_factory=Live)
    on: Live = field(default_factory=Live)
    phase: str = "off"  # off | on | done
    # Where same_tokens, where the first differing token sits in each output: ((start, end) off, (start, end) on)
    diff_spans: tuple[tuple[int, int], tuple[int, int]] | None = None
    note: str = ""  # e.g. a server that kept drafting with speculation off requested
    by_text: bool = False  # a server gives no token ids: the outputs are compared character by character
    # What the pair can reach here (engine.speedup.Ceiling), timed after both runs (a draft model only), and the
    # pair's other methods by name, for the advice where drafting cannot pay
    ceiling: object | None = None
    others: tuple[str, ...] = ()
    # Cores other programs kept busy just before the runs and during them (machine_load), of the machine's ``cores``
    busy_before: float | None = None
    busy_during: float | None = None
    cores: int = 1

    @property
    def finished(self) -> bool:
        """Both runs ran to their end (not stopped): only then are their outputs and speeds compared."""
        return bool(self.off.done and self.on.done) and "cancelled" not in (self.off.done.finish_reason,
                                                                            self.on.done.finish_reason)

    @property
    def speedup(self) -> float:
        a, b = self.off.stats.tokens_per_second, self.on.stats.tokens_per_second
        return b / a if a > 0 else 0.0

    def locate_difference(self, detokenize: Callable[[list[int]], str]) -> None:
        """Where the outputs should be the same, find where the first differing token sits in each output's text."""
        if not (self.same_tokens and self.finished) or (i := self.first_difference()) is None:
            return
        if self.by_text:
            self.diff_spans = ((i, i + 1), (i, i + 1))
            return
        start = len(detokenize(self.off.done.token_ids[:i]))  # the same tokens on both sides up to i
        self.diff_spans = tuple((start, len(detokenize(ids[:i + 1])))
                                for ids in (self.off.done.token_ids, self.on.done.token_ids))

    def first_difference(self) -> int | None:
        """Index of the first token (character, for a server) where the outputs differ; None if identical."""
        a, b = (self.off.text, self.on.text) if self.by_text else (self.off.done.token_ids, self.on.done.token_ids)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None if len(a) == len(b) else min(len(a), len(b))
