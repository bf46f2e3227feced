"""The speedup model, written once: how fast a draft length makes tokens, given what a round costs and how often
the target accepts a draft token. Bench's ceiling asks it at full acceptance, the adaptive controller at the
acceptance it measures."""
from __future__ import annotations

from typing import Callable


def tokens_per_round(k: int, acceptance: float) -> float:
    """Expected tokens a round of k draft tokens commits: the accepted run plus the target's own token."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def best_draft_length(verify: Callable[[int], float], draft: Callable[[int], float], lengths: range,
                      acceptance: float = 1.0) -> tuple[int, float]:
    """The draft length among ``lengths`` that makes tokens fastest (0: plain decoding), and that rate in tokens
    per second. ``verify(n)``: seconds of a target batch of n tokens; ``draft(k)``: seconds drafting k tokens."""
    best_k, best_rate = 0, 1.0 / verify(1)
    for k in lengths:
        rate = tokens_per_round(k, acceptance) / (draft(k) + verify(k + 1))
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate
