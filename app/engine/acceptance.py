"""What the target accepts of a drafter's tokens (adaptive drafting, ``draft_control.DraftLength``): how often, per
bucket of the drafter's confidence signal, and overall; and how sure a round's draft tokens come, in runs, for the
plan to value rounds that end at their first unsure token. What it learns is kept in the ``Measured``, from which the
next answer starts."""
from __future__ import annotations

import statistics
from bisect import bisect_right
from collections.abc import Iterator, Sequence

from .measured import Measured


class Acceptance:
    TOKEN_DECAY = 0.98  # weight of the past in the acceptance, per draft token judged (about the last 50)
    PRIOR_WEIGHT = 8.0  # the drafter's prior acceptance per signal bucket counts as this many observations
    # ...and what the last answers measured of a bucket as at most this many more. Restarting at the priors each
    # answer, the sure buckets read 0.96-0.97 on the starter, whose target accepted 99% of them: its rounds were
    # valued under the margin and a slow spell stayed off in half the runs
    CARRIED = 32.0

    def __init__(self, edges: tuple[float, ...], prior: tuple[float, ...], measured: Measured):
        self.edges = edges
        self._m = m = measured
        w = self.PRIOR_WEIGHT
        self._buckets = [[prior[min(i, len(prior) - 1)] * w, w] for i in range(len(edges) + 1)]
        m.per_bucket(len(self._buckets))
        for counts, (acc, judged) in zip(self._buckets, m.buckets):  # the last answers', worth CARRIED tokens at most
            scale = min(1.0, self.CARRIED / judged) if judged else 0.0
            counts[0] += acc * scale
            counts[1] += judged * scale
        self._last: int | None = None  # the bucket of the draft token before this one in the round (None: the first)
        self._prior = statistics.fmean(prior)  # the acceptance of a token not drafted yet, before any is judged
        # per bucket: accepted, judged (the measurements alone)
        self.outcomes: list[list[float]] = [[0, 0] for _ in self._buckets]
        # accepted draft tokens and those examined by the target (decayed), from the last answers' at first
        scale = min(1.0, self.PRIOR_WEIGHT / m.judged) if m.judged else 0.0
        self._succ, self._seen = m.accepted * scale, m.judged * scale

    def bucket(self, signal: float) -> int:
        return bisect_right(self.edges, signal)

    def rate(self, bucket: int) -> float:
        """The estimated acceptance of a token of this signal bucket."""
        acc, seen = self._buckets[bucket]
        return acc / seen

    def overall(self) -> float:
        """Of every draft token judged lately (0 before any)."""
        return self._succ / self._seen if self._seen else 0.0

    def unseen(self) -> float:
        """Of the next draft token, its signal unseen yet."""
        return self.overall() if self._seen else self._prior

    # --- how sure a round's tokens come ---------------------------------------------------------------------
    def start_round(self) -> None:
        self._last = None

    def count_shape(self, bucket: int) -> None:
        """Count a draft token of this signal bucket where the plan learns how sure a round's tokens come."""
        if self.edges:
            m, last = self._m, self._last
            row = m.first if last is None else m.after[last]
            row[:] = [n * self.TOKEN_DECAY for n in row]
            row[bucket] += 1.0
            self._last = bucket

    def rounds_seen(self) -> float:
        return sum(self._m.first)

    def round_shapes(self, bar: float) -> Iterator[tuple[float, float, float, float]]:
        """For each choice of the signal buckets a round proposes tokens of (the surest first, none estimated under
        ``bar``): (the floor, the lowest acceptance among them; their tokens' acceptance; how often a round's first
        draft token falls in them; how often one that follows such a token does). How often a round's first token is
        sure is read off every draft token seen: the first tokens alone are few where drafting was mostly off, and
        those few come from the short drafts that open each answer, whose first token is unsure more often (the
        starter on a slow spell: 53-59% sure by them, 91% of its answers' tokens)."""
        m = self._m
        rates = [self.rate(b) for b in range(len(self._buckets))]
        drafted = [f + sum(col) for f, col in zip(m.first, zip(*m.after))]  # per bucket
        for q in sorted({r for r in rates if r >= bar}, reverse=True):
            sure = [b for b, r in enumerate(rates) if r >= q]
            first = sum(m.first[b] for b in sure)
            after = sum(sum(m.after[b]) for b in sure)  # tokens drafted after a sure one
            if not first or not after:
                continue
            count = {b: m.first[b] + sum(m.after[a][b] for a in sure) for b in sure}  # sure tokens seen, per bucket
            acceptance = sum(count[b] * rates[b] for b in sure) / sum(count.values())
            yield (q, acceptance, sum(drafted[b] for b in sure) / sum(drafted),
                   sum(m.after[a][b] for a in sure for b in sure) / after)

    # --- what the target judged -----------------------------------------------------------------------------
    def judge(self, signals: Sequence[float | None], n_accepted: int) -> None:
        """Count a round's draft tokens per signal bucket: those before the first rejection were accepted, that one
        was not, later ones are unseen. A ``None`` signal is a token a grammar forced: not the drafter's to judge."""
        for i, signal in enumerate(signals[: n_accepted + 1]):
            if signal is None:
                continue
            b = self.bucket(signal)
            carried = self._m.buckets[b]
            carried[:] = [n * Measured.BUCKET_DECAY for n in carried]
            for counts in (self._buckets[b], self.outcomes[b], carried):
                counts[0] += i < n_accepted
                counts[1] += 1

    def judge_all(self, examined: int, accepted: int) -> None:
        """Count the drafter's own tokens the target examined in a round, and how many it accepted (forgotten per
        token judged: a short round is not worth a long one)."""
        w = self.TOKEN_DECAY ** examined
        self._succ = w * self._succ + accepted
        self._seen = w * self._seen + examined
        self._m.accepted, self._m.judged = self._succ, self._seen
