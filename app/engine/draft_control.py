"""How many tokens to draft next round.

Fixed mode drafts ``draft_max`` every round (the drafter may stop earlier, e.g. on ``draft_p_min``).
Adaptive mode measures, per generation, the per-token acceptance rate and what drafting and verifying cost, and
drafts the length k that maximises expected tokens per second under the standard geometric model:

    tokens(k) = (1 - a^(k+1)) / (1 - a)        time(k) = k * t_draft + t_verify(k + 1)

k = 0 means speculation is off: plain decoding through the same loop. While off it probes a short draft now and
then, so a text that becomes predictable (a code block being repeated) switches speculation back on.

Adaptive greedy drafting with a draft model also stops *where* a rejection is likely: it learns, per bucket of the
draft's top-1 minus top-2 logit gap, how often the target accepted such tokens, and drafts the next token only
while accept(gap) x (time per output token) exceeds what the token costs to draft and verify. Rejections cluster
at near-ties (on the starter pair every rejection had a gap under 0.25 logits), so rounds end just before them.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from .errors import EngineError

MAX_DRAFT = 64  # the target's batch holds draft_max + 1 outputs; keeps the logits buffer small


@dataclass(frozen=True)
class DraftParams:
    draft_max: int = 8  # llama.cpp --draft-max
    draft_min: int = 0  # llama.cpp --draft-min: drafts shorter than this are not verified
    draft_p_min: float = 0.5  # llama.cpp --draft-p-min: stop drafting when the draft's top probability is lower
    adaptive: bool = False

    def validate(self) -> None:
        if not 0 <= self.draft_max <= MAX_DRAFT:
            raise EngineError(f"Invalid --draft-max {self.draft_max}: use 0..{MAX_DRAFT}.")
        if not 0 <= self.draft_min <= self.draft_max:
            raise EngineError(
                f"Invalid --draft-min {self.draft_min}: it must be between 0 and --draft-max ({self.draft_max})."
            )
        if not 0.0 <= self.draft_p_min < 1.0:
            raise EngineError(f"Invalid --draft-p-min {self.draft_p_min}: it must be in [0, 1).")


class DraftLength:
    PROBE_EVERY = 24  # rounds with speculation off between two probe drafts
    DECAY = 0.9  # weight of the past in the running estimates (about the last 10 rounds)
    GAP_EDGES = (0.25, 0.5, 1.0, 2.0, 4.0)  # logit-gap buckets for the acceptance calibration
    PRIOR = (3.6, 4.0)  # accepted, seen: an optimistic 0.9 prior worth four observations per bucket

    def __init__(self, params: DraftParams):
        self.p = params
        self._gap_acc = [[*self.PRIOR] for _ in range(len(self.GAP_EDGES) + 1)]
        self._rate = None  # output tokens per second (decayed)
        self._succ = 0.0  # accepted draft tokens (decayed)
        self._seen = 0.0  # draft tokens examined by the target (decayed)
        self._t_draft = None  # seconds per drafted token
        self._fit = [0.0] * 5  # decayed sums for verify_s ~ a + b * n: S, Sn, Snn, St, Snt
        self._off_rounds = 0

    # --- what to do next ------------------------------------------------------------------------------------
    def next(self) -> int:
        if not self.p.adaptive or self.p.draft_max == 0:
            return self.p.draft_max
        if self._seen < 4 or self._t_draft is None or self._fit[0] < 2:
            return self.p.draft_max  # measure before judging
        k = self._best_k()
        if k == 0:
            self._off_rounds += 1
            if self._off_rounds >= self.PROBE_EVERY:
                self._off_rounds = 0
                return min(2, self.p.draft_max)
        else:
            self._off_rounds = 0
        return k

    def acceptance(self) -> float:
        return self._succ / self._seen if self._seen else 0.0

    def _verify_time(self, n: int) -> float:
        s, sn, snn, st, snt = self._fit
        mean_n, mean_t = sn / s, st / s
        var = snn / s - mean_n * mean_n
        if var > 1e-9:
            b = (snt / s - mean_n * mean_t) / var
        else:
            b = 0.1 * mean_t / max(mean_n, 1.0)  # one batch size seen so far: assume +10% per extra token
        return max(1e-6, mean_t + max(b, 0.0) * (n - mean_n))

    def _best_k(self) -> int:
        a = min(self.acceptance(), 0.999)
        best_k, best_rate = 0, 1.0 / self._verify_time(1)
        for k in range(max(1, self.p.draft_min), self.p.draft_max + 1):
            tokens = (1.0 - a ** (k + 1)) / (1.0 - a)
            rate = tokens / (k * self._t_draft + self._verify_time(k + 1))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def keep_going(self, gap: float) -> bool:
        """Draft a token whose logit gap is ``gap``? (adaptive greedy mode; see the module docstring)"""
        acc, seen = self._gap_acc[bisect_right(self.GAP_EDGES, gap)]
        return acc / seen >= self._min_acceptance()

    def _min_acceptance(self) -> float:
        if self._rate is None or self._t_draft is None or self._fit[0] < 2:
            return 0.8
        s, sn, snn, st, snt = self._fit
        var = snn / s - (sn / s) ** 2
        slope = max((snt / s - (sn / s) * (st / s)) / var, 0.0) if var > 1e-9 else 0.0
        return min(max((self._t_draft + slope) * self._rate, 0.5), 0.98)

    # --- feedback -------------------------------------------------------------------------------------------
    def update(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float,
               gaps: list[float] | None = None) -> None:
        d = self.DECAY
        if gaps:  # calibrate: tokens before the first rejection were accepted, that one was not, later unseen
            for i, gap in enumerate(gaps[: n_accepted + 1]):
                bucket = self._gap_acc[bisect_right(self.GAP_EDGES, gap)]
                bucket[0] += i < n_accepted
                bucket[1] += 1
        rate = (n_accepted + 1) / max(draft_s + verify_s, 1e-9)
        self._rate = rate if self._rate is None else d * self._rate + (1 - d) * rate
        if n_drafted:
            examined = n_accepted + (1 if n_accepted < n_drafted else 0)
            self._succ = d * self._succ + n_accepted
            self._seen = d * self._seen + examined
            per_token = draft_s / n_drafted
            self._t_draft = per_token if self._t_draft is None else d * self._t_draft + (1 - d) * per_token
        n = n_drafted + 1
        f = self._fit
        self._fit = [d * f[0] + 1, d * f[1] + n, d * f[2] + n * n, d * f[3] + verify_s, d * f[4] + n * verify_s]
