"""The speedup model, written once: how fast a draft length makes tokens, given what a round costs and how often
the target accepts a draft token. Bench's ceiling asks it at full acceptance, the adaptive controller at the
acceptance it measures."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _sum_powers(x: float, n: int) -> float:
    """1 + x + ... + x^(n-1)."""
    return float(n) if x >= 1.0 else (1.0 - x ** n) / (1.0 - x) if n > 0 else 0.0


def round_shape(k: int, acceptance: float, sure: float = 1.0, sure_next: float | None = None
                ) -> tuple[float, float, float]:
    """A round of at most k draft tokens that ends at the first token not sure enough to propose (the adaptive
    controller's rounds: it drafts on while each token's confidence is high, and stops before verifying an unsure
    one). ``sure``: how often a round's first draft token is sure enough; ``sure_next``: how often the one after a
    sure token is (unsure spots come in runs; default ``sure``); ``acceptance``: how often the target accepts a sure
    one. Returns the expected (tokens committed, draft calls, tokens verified beside the target's own). Where every
    token is sure, every round drafts k tokens, and commits (1 - a^(k+1)) / (1 - a) of them (the geometric model)."""
    g = sure if sure_next is None else sure_next
    if not k:
        return 1.0, 0.0, 0.0
    return (1.0 + sure * acceptance * _sum_powers(g * acceptance, k), 1.0 + sure * _sum_powers(g, k - 1),
            sure * _sum_powers(g, k))


def best_draft_length(verify: Callable[[float], float], draft: Callable[[float], float], lengths: range,
                      acceptance: float = 1.0, margin: float = 0.0, sure: float = 1.0,
                      sure_next: float | None = None, flat: float = 0.0) -> tuple[int, float]:
    """The draft length among ``lengths`` that makes tokens fastest (0: plain decoding), and that rate in tokens
    per second. ``verify(n)``: seconds of a target batch of n tokens; ``draft(k)``: seconds drafting k tokens (both
    asked of expected, fractional sizes where ``sure`` < 1); ``margin``: how much faster than plain decoding
    (0.03: 3%) a draft length must be to be chosen; ``acceptance``, ``sure`` and ``sure_next`` as in round_shape;
    ``flat``: take the longest length whose rate is within this share of the best (0.02: 2%) instead."""
    plain = 1.0 / verify(1)
    best_k, best_rate = 0, plain
    rates = {}
    for k in lengths:
        tokens, calls, verified = round_shape(k, acceptance, sure, sure_next)
        rate = rates[k] = tokens / (draft(calls) + verify(1.0 + verified))
        if rate > best_rate and rate > plain * (1.0 + margin):
            best_k, best_rate = k, rate
    if best_k and flat:  # (and still past the margin)
        best_k = max(k for k, rate in rates.items() if rate >= max(best_rate * (1.0 - flat), plain * (1.0 + margin)))
        best_rate = rates[best_k]
    return best_k, best_rate


@dataclass(frozen=True)
class Ceiling:
    """The best speedup a pair can reach on this machine now: every draft token accepted, the costs just timed."""

    speedup: float  # over plain decoding (1.0: no draft length pays)
    draft_length: int  # the draft length reaching it (0: none)
    draft_cost: float  # one draft token, in target steps
    position_cost: float  # one more position in the verification batch that reaches it, in target steps

    @property
    def pays(self) -> bool:
        return self.draft_length > 0

    @property
    def why(self) -> str:
        return (f"a draft token costs {self.draft_cost:.2f} of a target step and each token verified in a batch "
                f"{self.position_cost:.2f}")

    def explain(self, others: tuple[str, ...] = ()) -> str:
        """In words, for bench and Compare: what the pair can reach and why; where it cannot pay, what could
        (``others``: the other drafters the pair can run, by name)."""
        why = self.why
        if self.pays:
            return (f"This pair can reach at most {self.speedup:.2f}x here ({self.draft_length} draft tokens a "
                    f"round, every one accepted): {why}.")
        tries = ["a smaller draft model", *others]
        return (f"Drafting cannot pay with this pair here, even with every draft token accepted: {why}. "
                f"Try {', '.join(tries[:-1]) + ' or ' + tries[-1] if len(tries) > 1 else tries[0]}.")
