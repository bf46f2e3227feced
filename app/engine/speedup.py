"""The speedup model, written once: how fast a draft length makes tokens, given what a round costs and how often
the target accepts a draft token. Bench's ceiling asks it at full acceptance, the adaptive controller at the
acceptance it measures."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def tokens_per_round(k: int, acceptance: float) -> float:
    """Expected tokens a round of k draft tokens commits: the accepted run plus the target's own token."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def best_draft_length(verify: Callable[[int], float], draft: Callable[[int], float], lengths: range,
                      acceptance: float = 1.0, margin: float = 0.0) -> tuple[int, float]:
    """The draft length among ``lengths`` that makes tokens fastest (0: plain decoding), and that rate in tokens
    per second. ``verify(n)``: seconds of a target batch of n tokens; ``draft(k)``: seconds drafting k tokens;
    ``margin``: how much faster than plain decoding (0.03: 3%) a draft length must be to be chosen."""
    plain = 1.0 / verify(1)
    best_k, best_rate = 0, plain
    for k in lengths:
        rate = tokens_per_round(k, acceptance) / (draft(k) + verify(k + 1))
        if rate > best_rate and rate > plain * (1.0 + margin):
            best_k, best_rate = k, rate
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

    def explain(self, others: tuple[str, ...] = ()) -> str:
        """In words, for bench and Compare: what the pair can reach and why; where it cannot pay, what could
        (``others``: the other drafters the pair can run, by name)."""
        why = (f"a draft token costs {self.draft_cost:.2f} of a target step and each token verified in a batch "
               f"{self.position_cost:.2f}")
        if self.pays:
            return (f"This pair can reach at most {self.speedup:.2f}x here ({self.draft_length} draft tokens a "
                    f"round, every one accepted): {why}.")
        tries = ["a smaller draft model", *others]
        return (f"Drafting cannot pay with this pair here, even with every draft token accepted: {why}. "
                f"Try {', '.join(tries[:-1]) + ' or ' + tries[-1] if len(tries) > 1 else tries[0]}.")
