"""What a speculative round costs with the loaded models on this machine now, and the speedup those costs allow.

A benchmark's speedup means little without its ceiling: on a small CPU the relative cost of drafting a token and
of verifying one more position changes with the host's state (compute- or memory-bound spells), so the best
possible speedup of one pair moves between runs. ``measure`` times the operations one round is made of, with
the engine's own contexts; ``Costs.ceiling`` turns them into the best speedup any draft length could reach if
the target accepted every draft token.
"""
from __future__ import annotations

import statistics
import time
from bisect import bisect_left
from dataclasses import dataclass

from .llama import Context
from .sampling import draft_pick, greedy_token
from .speedup import Ceiling, best_draft_length

POSITION = 128  # scratch tokens cached before timing: a short chat's worth of attention


@dataclass(frozen=True)
class Costs:
    verify_s: dict[int, float]  # a target batch of n tokens -> seconds (n = 1 is one step of plain decoding)
    draft_s: tuple[float, float] | None = None  # draft model: one token; the two tokens a round opens with

    @classmethod
    def mean(cls, samples: list[Costs]) -> Costs:
        """Average of measurements taken at different times (between benchmark prompts)."""
        verify = {n: statistics.fmean(c.verify_s[n] for c in samples) for n in samples[0].verify_s}
        drafts = [c.draft_s for c in samples if c.draft_s]
        draft = tuple(statistics.fmean(d[i] for d in drafts) for i in (0, 1)) if drafts else None
        return cls(verify, draft)

    def verify(self, n: float) -> float:
        """Seconds for a verification batch of n tokens: linear between the measured sizes (and past the last), and
        never less than one plain step (a batch timed on a busy moment can come out faster than a step: taken as
        it was, a round of k draft tokens would seem to beat k + 1 plain steps)."""
        return max(self._timed(n), self._timed(1))

    def _timed(self, n: float) -> float:
        sizes = sorted(self.verify_s)
        if n in self.verify_s or len(sizes) == 1:
            return self.verify_s.get(n, self.verify_s[sizes[0]] * n / sizes[0])
        i = min(max(bisect_left(sizes, n), 1), len(sizes) - 1)
        lo, hi = sizes[i - 1], sizes[i]
        return self.verify_s[lo] + (self.verify_s[hi] - self.verify_s[lo]) * (n - lo) / (hi - lo)

    def draft(self, k: int) -> float:
        """Drafting k tokens in a round after a fully accepted one: the draft catches up on two tokens (its own
        last, never evaluated, and the target's bonus) in one call, then takes k - 1 single steps."""
        if k == 0 or not self.draft_s:
            return 0.0
        one, two = self.draft_s
        return two + (k - 1) * one

    def ceiling(self, draft_max: int) -> tuple[float, int]:
        """(best speedup over plain decoding, the draft length reaching it) if every draft token were accepted:
        max over k of (k + 1) tokens per round / round time, times one plain step. No drafter with these costs
        can do better; rejections only lower it."""
        k, rate = best_draft_length(self.verify, self.draft, range(1, draft_max + 1))
        return (rate * self.verify(1) if k else 1.0), k

    def ceiling_of(self, draft_max: int) -> Ceiling:
        """The ceiling with the costs that make it: a draft token, and a verified position at the length reaching
        it (the longest one timed where none pays), each in target steps."""
        speedup, k = self.ceiling(draft_max)
        n = max(k or draft_max, 1) + 1
        step = self.verify(1)
        return Ceiling(speedup, k, self.draft_s[0] / step if self.draft_s else 0.0,
                       (self.verify(n) - step) / (n - 1) / step)

    def as_dict(self) -> dict:
        out = {"verify_ms": {n: s * 1e3 for n, s in sorted(self.verify_s.items())}}
        if self.draft_s:
            out["draft_ms"] = {1: self.draft_s[0] * 1e3, 2: self.draft_s[1] * 1e3}
        return out


def batch_sizes(draft_max: int) -> list[int]:
    """Verification batch sizes to time: 1, powers of two, and the largest a round can use."""
    top = draft_max + 1
    return sorted({1, top} | {n for n in (2, 4, 8, 16, 32) if n < top})


def measure(target: Context, draft: Context | None, draft_max: int, reps: int = 5) -> Costs:
    """Median time of each operation over ``reps`` tries, at ``POSITION`` cached tokens. Leaves both caches
    holding scratch tokens: the caller clears them."""
    verify = {n: _time(target, n, min(n, target.n_outputs_max), reps, greedy_token) for n in batch_sizes(draft_max)}
    draft_s = (_time(draft, 1, 1, reps, _draft_pick), _time(draft, 2, 1, reps, _draft_pick)) if draft else None
    return Costs(verify, draft_s)


def _draft_pick(row) -> None:
    draft_pick(row, 0.5)  # (llama.cpp's default --draft-p-min; the cost is the same at any)


def _time(ctx: Context, n: int, n_logits: int, reps: int, pick) -> float:
    """A round's operation as the loop does it: the decode, then the pick from each row of logits it asked for. On
    a GPU the picks are a good part of it: on an H200 a 262,144-logit row's took 68 µs, 0.1 of a plain step, and a
    ceiling priced without them said 1.57x where drafting made 0.76x at 97% acceptance."""
    n_vocab = ctx.model.n_vocab
    position = min(POSITION, ctx.n_ctx - n - 1)
    scratch = [(7 + 13 * i) % n_vocab for i in range(position + n)]  # any valid ids: the cost is the same
    ctx.decode(scratch[ctx.reuse_prefix(scratch[:position]) : position], n_logits=0)  # prefilled once
    ctx.checkpoint()  # recurrent memory comes back here between tries
    times = []
    for _ in range(reps):
        ctx.truncate(position)
        # A round: the batch, then every draft token rejected (recurrent memory saves and restores its state).
        t0 = time.perf_counter()
        ctx.decode(scratch[position:], n_logits=n_logits, n_speculative=n - 1)
        for i in range(n_logits):
            pick(ctx.logits(i))
        ctx.truncate(position + 1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
