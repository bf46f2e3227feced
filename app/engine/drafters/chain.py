"""Several drafters at once (llama.cpp's comma-separated ``--spec-type``): each round the members draft, and the draft
the target verifies is the one with the most expected accepted tokens.

A member's expected accepted tokens for a draft of k tokens is a + a^2 + ... + a^k, with a its acceptance measured
in this generation (accepted over verified, its prior counting as a few observations; until its first draft is
judged, 1): a long n-gram draft that is usually right beats a short model draft, and a member that keeps failing
loses to the others. Members run
in llama.cpp's order of priority (the n-gram kinds, then the model drafters; common_speculative_init), and one whose
best possible draft could not beat the best so far is not asked at all: a model drafter costs a step per token,
and a lookup that found a long draft spares it. On a tie the earlier member wins, which is llama.cpp's own rule
(there the first member with any draft is verified).

Which member drafted a round is the draft's ``source``: Stats count rounds, drafted and accepted tokens per member.
The target verifies as with any drafter, so greedy output stays identical to speculation off and sampled output keeps
the target's distribution.
"""
from __future__ import annotations

from dataclasses import replace

from .base import Draft, Drafter

PRIOR_WEIGHT = 4.0  # the prior acceptance counts as this many verified tokens


def expected_accepted(a: float, k: int) -> float:
    """E[accepted] of a k-token draft whose tokens each hold with probability a, given the ones before held."""
    if k <= 0 or a <= 0.0:
        return 0.0
    return k if a >= 1.0 else a * (1.0 - a**k) / (1.0 - a)


class _Member:
    def __init__(self, drafter: Drafter, costly: bool):
        self.drafter, self.costly = drafter, costly
        prior = max(drafter.SIGNAL_PRIOR)
        self.accepted, self.verified = prior * PRIOR_WEIGHT, PRIOR_WEIGHT

    @property
    def rate(self) -> float:
        """Its acceptance so far; a member not judged yet is taken at its word, so that each gets tried (a lookup's
        long draft would otherwise never beat a measured model draft on a prior, and never be measured)."""
        return 1.0 if self.verified == PRIOR_WEIGHT else self.accepted / self.verified


class ChainDrafter(Drafter):
    """Drafters run together; see the module's docstring. ``members`` in llama.cpp's order of priority, each with
    whether drafting costs it model steps."""

    AFTER_FORCED = False  # (a member that may draft after forced tokens drafts on its own)

    def __init__(self, members: list[tuple[Drafter, bool]]):
        self.members = [_Member(d, costly) for d, costly in members]
        self.name = ",".join(m.drafter.name for m in self.members)
        self.label = " + ".join(m.drafter.label for m in self.members)
        self._used: _Member | None = None
        self._k = 0

    def begin(self, prompt_ids: list[int]) -> None:
        for m in self.members:
            m.drafter.begin(prompt_ids)

    def draft_round(self, history, n_max, limit, sp, rng, gate) -> Draft:
        best, best_value = Draft(), 0.0
        self._used = None
        for m in self.members:
            if m.costly and expected_accepted(m.rate, min(n_max, limit)) <= best_value:
                continue  # even a full draft of it could not beat the one in hand
            d = m.drafter.draft_round(history, n_max, limit, sp, rng, None)
            value = expected_accepted(m.rate, min(len(d.tokens), limit))
            if d.tokens and value > best_value:
                best, best_value, self._used = d, value, m
        if self._used is None:
            return Draft()
        best.source = self._used.drafter.name
        if gate is not None:  # the adaptive controller still has its say, token by token
            keep = 0
            while keep < len(best.tokens) and gate.take(0.0):
                keep += 1
            best = _cut(best, keep)
            best.signals = [0.0] * keep
        self._k = len(best.tokens)
        return best

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        """Under a grammar (which asks for proposals directly): the first member that proposes anything."""
        for m in self.members:
            d = m.drafter.propose(history, n_max, sp, rng, gate, stop)
            if d.tokens:
                self._used, self._k = m, len(d.tokens)
                d.source = m.drafter.name
                return d
        self._used = None
        return Draft()

    def accept(self, n_accepted: int) -> None:
        m = self._used
        if m is not None:
            m.accepted += n_accepted
            m.verified += min(n_accepted + 1, self._k)  # tokens the target judged: through the first rejected
            m.drafter.accept(n_accepted)

    def set_threads(self, n: int) -> None:
        for m in self.members:
            m.drafter.set_threads(n)

    def clear(self) -> None:
        for m in self.members:
            m.drafter.clear()

    def close(self) -> None:
        for m in self.members:
            m.drafter.close()


def _cut(d: Draft, k: int) -> Draft:
    return replace(d, tokens=d.tokens[:k], signals=d.signals[:k] if d.signals else d.signals, forced=d.forced[:k])
