"""Several drafters at once (llama.cpp's comma-separated ``--spec-type``): each round the members draft, and the target
verifies the draft worth the most.

With fixed draft lengths that is llama.cpp's rule, the draft with the most expected accepted tokens: for k tokens
a + a^2 + ... + a^k, with a the member's acceptance measured in this generation (accepted over verified, its prior
counting as a few observations; until its first draft is judged, 1): a long n-gram draft that is usually right
beats a short model draft, and a member that keeps failing loses to the others. Members run in llama.cpp's order of
priority (the n-gram kinds, then the model drafters; common_speculative_init), and one whose best possible draft
could not beat the best so far is not asked at all: a model drafter costs a step per token, and a lookup that found
a long draft spares it. On a tie the earlier member wins, which is llama.cpp's own rule (there the first member
with any draft is verified).

Under the adaptive controller a draft has a price too: each verified position costs the batch time whether its
token holds or not (on the starter's CPU 0.15-0.2 of a plain step). A draft is worth its expected accepted tokens
less its positions at the controller's price (``Gate.prices``), each token expected accepted as often as the
member's tokens of its signal bucket were (a lookup's support, a draft model's logit gap). The controller sizes one
member's drafts, the *lead* (the first model drafter): the chain's signals are the lead's, and the tokens of a round
another member won say nothing of the lead's acceptance (``Draft.sized``). The others draft what they find, also
in rounds the controller turned off, cut where their draft is worth most. Valued as llama.cpp values them, the
18-token drafts of ``ngram-simple`` with a key of 2 tokens (right from their first token one time in four) won the
rounds, and one bucket of the two members' tokens read 0.81 where the model's were accepted 97%, which turned the
model off: a chain of the two made 1.00-1.07x in replays where each alone made 1.81x and 1.28x
(``bench/replay_chain.py``).

Which member drafted a round is the draft's ``source``: Stats count rounds, drafted and accepted tokens per member.
The target verifies as with any drafter, so greedy output stays identical to speculation off and sampled output keeps
the target's distribution.
"""
from __future__ import annotations

from bisect import bisect_right
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
        prior = drafter.SIGNAL_PRIOR
        self.accepted, self.verified = max(prior) * PRIOR_WEIGHT, PRIOR_WEIGHT
        self.edges = drafter.SIGNAL_EDGES
        self.buckets = [[prior[min(i, len(prior) - 1)] * PRIOR_WEIGHT, PRIOR_WEIGHT]
                        for i in range(len(self.edges) + 1)]

    @property
    def rate(self) -> float:
        """Its acceptance so far; a member not judged yet is taken at its word, so that each gets tried (a lookup's
        long draft would otherwise never beat a measured model draft on a prior, and never be measured)."""
        return 1.0 if self.verified == PRIOR_WEIGHT else self.accepted / self.verified

    def chance(self, signal: float | None) -> float:
        """How often its tokens of this signal's bucket were accepted, reached (its prior at first)."""
        if signal is None:
            return self.accepted / self.verified
        acc, seen = self.buckets[bisect_right(self.edges, signal)]
        return acc / seen

    def judge(self, signals: list[float] | None, n_accepted: int, k: int) -> None:
        self.accepted += n_accepted
        self.verified += min(n_accepted + 1, k)  # tokens the target judged: through the first rejected
        for i, signal in enumerate((signals or [])[: n_accepted + 1]):
            counts = self.buckets[bisect_right(self.edges, signal)]
            counts[0] += i < n_accepted
            counts[1] += 1


class _Tally:
    """A member's say in its own draft under the adaptive controller: every token is taken (the chain cuts the draft
    where it is worth most) and its signal noted; a model drafter looks further while the next token, expected
    accepted at the member's rate, is worth its position and a draft step (``bar``)."""

    def __init__(self, member: _Member, bar: float):
        self.member, self.bar, self.reach = member, bar, 1.0

    def take(self, signal: float) -> bool:
        self.reach *= self.member.chance(signal)
        return True

    def look_further(self) -> bool:
        return self.reach * self.member.chance(None) >= self.bar


class ChainDrafter(Drafter):
    """Drafters run together; see the module's docstring. ``members`` in llama.cpp's order of priority, each with
    whether drafting costs it model steps."""

    AFTER_FORCED = False  # (a member that may draft after forced tokens drafts on its own)

    def __init__(self, members: list[tuple[Drafter, bool]]):
        self.members = [_Member(d, costly) for d, costly in members]
        # The adaptive controller sizes one member's drafts, the first that drafts with a model (else the first):
        # the chain's signals are its; the others' drafts are sized by their worth at the controller's prices
        self.lead = next((m for m in self.members if m.costly), self.members[0])
        d = self.lead.drafter
        self.SIGNAL_EDGES, self.SIGNAL_PRIOR, self.SIGNAL_GROWS = d.SIGNAL_EDGES, d.SIGNAL_PRIOR, d.SIGNAL_GROWS
        self.name = ",".join(m.drafter.name for m in self.members)
        self.label = " + ".join(m.drafter.label for m in self.members)
        self._used: _Member | None = None
        self._k = 0
        self._signals: list[float] | None = None  # the used member's signals for its tokens verified

    def begin(self, prompt_ids: list[int]) -> None:
        for m in self.members:
            m.drafter.begin(prompt_ids)

    def read_on(self) -> bool:
        return any([m.drafter.read_on() for m in self.members])  # (each member reads on: no short cut)

    def draft_round(self, history, n_max, limit, sp, rng, gate) -> Draft:
        if gate is None:
            return self._most_expected(history, n_max, limit, sp, rng)
        position, step = gate.prices()
        best, best_worth, best_k, spent = None, 0.0, 0, Draft()
        self._used = None
        for m in self.members:
            lead = m is self.lead
            # (another lookup drafts what it finds within the batch's room, its worth cutting it, whether the lead
            # drafts or not: the controller sizes the lead's drafts. A round that replays drafts nothing: limit 0.)
            n = n_max if lead or m.costly else limit
            if n == 0 or (m.costly and best is not None
                          and _worths([m.chance(None)] * min(n, limit), position + step)[-1][1] <= best_worth):
                continue  # even its best draft could not beat the one in hand, its draft steps paid
            d = m.drafter.draft_round(history, n, limit, sp, rng, gate if lead else _Tally(m, position + step))
            spent = replace(spent, n_evals=spent.n_evals + d.n_evals, first_s=spent.first_s + d.first_s,
                            n_first=spent.n_first + d.n_first)
            if not d.tokens:
                continue
            worths = _worths([m.chance(x) for x in d.signals or [None] * len(d.tokens)], position)
            # (the lead's draft as the controller sized it; another's where it is worth most)
            k, worth = worths[-1] if lead else max(worths, key=lambda w: w[1])
            if (lead or worth > 0) and (best is None or worth > best_worth):
                best, best_worth, best_k, self._used = d, worth, k, m
        if best is None:
            return spent  # (no tokens: the draft calls spent are the round's cost all the same)
        self._signals, self._k = best.signals[:best_k] if best.signals else None, best_k
        # (another member's tokens say nothing of how the lead's fare, whose acceptance the controller measures)
        return replace(_cut(best, best_k), source=self._used.drafter.name, sized=self._used is self.lead,
                       n_evals=spent.n_evals, first_s=spent.first_s, n_first=spent.n_first)

    def _most_expected(self, history, n_max, limit, sp, rng) -> Draft:
        """llama.cpp's rule: the draft with the most expected accepted tokens, at each member's rate."""
        best, best_value = Draft(), 0.0
        self._used = self._signals = None
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
        self._k = len(best.tokens)
        return best

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        """Under a grammar (which asks for proposals directly): the first member that proposes anything. The
        controller's gate is the lead's, whose signals it reads: the others propose what they find."""
        for m in self.members:
            lead = m is self.lead or gate is None
            d = m.drafter.propose(history, n_max, sp, rng, gate if lead else _Tally(m, 0.0), stop)
            if d.tokens:
                self._used, self._k, self._signals = m, len(d.tokens), d.signals
                d.source, d.sized = m.drafter.name, lead
                return d
        self._used = None
        return Draft()

    def accept(self, n_accepted: int) -> None:
        m = self._used
        if m is not None:
            m.judge(self._signals, n_accepted, self._k)
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


def _worths(chances: list[float], price: float) -> list[tuple[int, float]]:
    """For each length k of a draft, (k, what its first k tokens are worth): tokens each accepted, reached, with
    these chances, each worth its chance of being reached and accepted less ``price`` for its position."""
    out, reach, worth = [], 1.0, 0.0
    for k, chance in enumerate(chances, 1):
        reach *= chance
        worth += reach - price
        out.append((k, worth))
    return out


def _cut(d: Draft, k: int) -> Draft:
    return replace(d, tokens=d.tokens[:k], signals=d.signals[:k] if d.signals else d.signals, forced=d.forced[:k])
