"""What adaptive drafting measures of a pair and keeps from one answer to the next (``Measured``): what a round's
operations cost, as running estimates (``Estimate``), and how the drafter's tokens fared, which outlives the
launch too (``AcceptanceMemory``). ``draft_control.DraftLength`` decides from them."""
from __future__ import annotations

import statistics
import time
from typing import Protocol

DECAY = 0.9  # weight of the past in the running estimates of times (about the last 10 rounds)


class AcceptanceMemory(Protocol):
    """Where a pair's ``Measured.profile`` per drafter is kept across launches (the app's data folder)."""

    def recall(self, drafter: str) -> dict | None: ...

    def keep(self, drafter: str, profile: dict) -> None: ...


class SpeedLog(Protocol):
    """Where the speed of plain decoding with the target wholly on a GPU is kept across launches (the app's data
    folder): what the Models view expects of other targets on that GPU (``models.gpu_speed``)."""

    def keep_plain(self, tokens_per_second: float) -> None: ...


class Measured:
    """What a round costs with one drafter on this pair, and how often its tokens were accepted lately: kept from
    one answer to the next, so each does not pay again to learn it. The acceptance is only a prior (the text
    decides it too), worth Acceptance.PRIOR_WEIGHT tokens, so that a few rejections at the start of an answer do
    not turn a pair that pays off for the whole answer."""

    MEMORY_S = 300.0  # how long timings of the draft are trusted without a new one (the host's speed drifts)
    LONG_BATCH = 4  # verification batches of this many tokens or more are long: past a measuring round's (long_batch)
    BUCKET_DECAY = 0.99  # weight of the past in a signal bucket's counts, per token of its own (about the last 100)

    def __init__(self):
        self.forget_draft_costs()
        self.between = Estimate(DECAY)  # seconds between two rounds, outside drafting and verifying
        self.verify = Batches()  # a verification batch of n tokens -> its seconds
        self.draft_timed_at = -float("inf")  # time.monotonic() of the last draft timing
        self.calls_model = False  # the drafter runs a model (a draft model, a head), not a lookup
        self.accepted = self.judged = 0.0  # draft tokens accepted and judged, decayed, over the last answers
        # Per signal bucket, decayed: a round's first draft tokens (per round), and the tokens drafted after one of
        # each bucket (per token in that row): how sure draft tokens come, in runs (Acceptance.round_shapes)
        self.first: list[float] = []
        self.after: list[list[float]] = []
        # ...and the draft tokens accepted and judged, each bucket's decayed per token of its own (BUCKET_DECAY): how
        # sure tokens fare is the pair's more than the text's, so an answer starts from them (Acceptance.CARRIED)
        self.buckets: list[list[float]] = []
        # What one more position of a long verification batch costs, as a share of a plain step, and that plain
        # step's seconds, from an earlier launch on this host (long_batch): None until a long batch was timed
        self.kept_long_batch: tuple[float, float] | None = None

    def forget_draft_costs(self) -> None:
        """What drafting costs, to be timed afresh: while drafting is off, plain steps keep timing the target, and
        nothing times the draft, so its costs outlive a spell that turned drafting off (DraftLength._costs_moved)."""
        self.t_draft = Estimate(DECAY)  # seconds to draft one more token
        self.t_catch_up = Estimate(DECAY)  # seconds per token a draft model's first call spends catching up
        self.probe_loss = Estimate(DECAY)  # seconds a measuring round lost against plain steps
        self.first_extra = Estimate(DECAY)  # seconds a draft model's first call of a round takes beyond t_draft

    def per_bucket(self, n: int) -> None:
        """Size the per-bucket tables for a drafter with n signal buckets (empty until the first answer)."""
        if len(self.first) != n:
            self.first, self.after = [0.0] * n, [[0.0] * n for _ in range(n)]
            self.buckets = [[0.0, 0.0] for _ in range(n)]

    def profile(self) -> dict:
        """How this drafter's tokens fared on this pair (its acceptance, per signal bucket and overall, and how sure
        tokens come): the pair's more than the host's or the text's, so it is kept across launches (``adopt``),
        where costs are not, but for what a long batch's positions weigh against a plain step (``long_batch``)."""
        profile = {"first": self.first, "after": self.after, "buckets": self.buckets,
                   "accepted": self.accepted, "judged": self.judged}
        if long_batch := self.long_batch():
            profile["long_batch"] = list(long_batch)
        return profile

    def long_batch(self) -> tuple[float, float] | None:
        """(What one more position of a long verification batch costs as a share of a plain step, the plain step's
        seconds): timed in this launch (the longest batch of LONG_BATCH tokens or more timed twice), else kept from
        an earlier one. It is the target's kernels' more than the host's speed: on the starter pair 0.2-0.3, on
        Gemma 3 270M, whose output layer of 262,144 rows is most of a position's work, 0.92."""
        plain = self.verify.get(1)
        timed = [n for n, e in self.verify.items() if n >= self.LONG_BATCH and e.n > 0]
        if not (timed and plain and plain.value > 0):
            return self.kept_long_batch
        n = max(timed)
        return max(self.verify[n].value - plain.value, 0.0) / (n - 1) / plain.value, plain.value

    def adopt(self, profile: dict) -> bool:
        """Start from a ``profile`` kept from an earlier launch (an answer weighs it as it weighs the last answers':
        Acceptance.CARRIED). Whatever does not have its shape, or holds a negative count, is left out: False."""
        try:
            first = [float(x) for x in profile["first"]]
            after = [[float(x) for x in row] for row in profile["after"]]
            buckets = [[float(x) for x in b] for b in profile["buckets"]]
            accepted, judged = float(profile["accepted"]), float(profile["judged"])
            long_batch = profile.get("long_batch")
            share, plain = (float(long_batch[0]), float(long_batch[1])) if long_batch is not None else (0.0, 1.0)
        except (KeyError, TypeError, ValueError, IndexError):
            return False
        n = len(first)
        numbers = [*first, *(x for row in after + buckets for x in row), accepted, judged]
        if (len(after) != n or len(buckets) != n or any(len(row) != n for row in after)
                or any(len(b) != 2 or b[0] > b[1] for b in buckets) or accepted > judged
                or not all(0.0 <= x < float("inf") for x in numbers)
                or not (0.0 <= share < 1e3 and 0.0 < plain < 1e3)):
            return False
        self.first, self.after, self.buckets, self.accepted, self.judged = first, after, buckets, accepted, judged
        self.kept_long_batch = (share, plain) if long_batch is not None else None
        return True

    def fresh(self) -> bool:
        """Timed enough, and recently enough, to start an answer from: a draft token and a plain step each timed
        twice, a verification batch too, the draft within MEMORY_S."""
        plain = self.verify.get(1)
        return (self.t_draft.n >= 1 and plain is not None and plain.n >= 1 and len(self.verify) >= 2
                and time.monotonic() - self.draft_timed_at < self.MEMORY_S)


class Estimate:
    """A running estimate of a time. llama.cpp's first call in a new shape pays extra (buffers touched for the
    first time), so the first sample only stands in until the second replaces it; then the median of the first
    few (a busy host's one slow call does not set the cost for dozens of rounds), and a decayed average once there
    are more (the machine's speed drifts)."""

    FEW = 5

    def __init__(self, decay: float):
        self.decay = decay
        self.n = 0  # samples that count
        self.value = 0.0
        self._provisional = False
        self._first: list[float] = []

    @property
    def known(self) -> bool:
        return self.n > 0 or self._provisional

    def add(self, t: float, provisional: bool = False) -> None:
        if provisional or (self.n == 0 and not self._provisional):
            self.value, self._provisional = t, True  # stands in until a real sample replaces it
            return
        self._provisional = False
        self.n += 1
        if self.n <= self.FEW:
            self._first.append(t)
            self.value = statistics.median(self._first)
        else:
            self.value += (1.0 - self.decay) * (t - self.value)


class Batches(dict):
    """The target's verification batches timed: n tokens -> ``Estimate`` of its seconds; and read off them, what a
    batch of any size takes (``time``)."""

    def __init__(self):
        super().__init__()
        self._fit: tuple[float, float, float] | None = None  # _line, since the last timing

    def add(self, n: int, seconds: float) -> None:
        self.setdefault(n, Estimate(DECAY)).add(seconds)
        self._fit = None

    def time(self, n: int) -> float:
        """Seconds a batch of n tokens takes: a plain step as measured, never read off the batches' line; a size
        timed a few times as timed; any other off the line."""
        if n == 1 and 1 in self:
            return self[1].value
        if n in self and self[n].n >= 3:
            return self[n].value
        mn, mt, slope = self._line()
        return max(1e-6, mt + slope * (n - mn))

    def slope(self) -> float:
        """Seconds each extra token adds to a verification batch."""
        return self._line()[2]

    def _line(self) -> tuple[float, float, float]:
        """Verification time against batch size: a least-squares line through the batch sizes seen (2 tokens or
        more; the plain step too while only one such size was seen), each weighted by how often (up to 10).
        Returns (mean size, mean seconds, seconds per extra token)."""
        if self._fit is None:
            batches = [n for n in self if n > 1]
            sizes = batches if len(batches) >= 2 else list(self)
            pts = [(n, self[n].value, max(1, min(self[n].n, 10))) for n in sizes]
            w = sum(k for *_, k in pts)
            mn = sum(n * k for n, _, k in pts) / w
            mt = sum(t * k for _, t, k in pts) / w
            var = sum(k * (n - mn) ** 2 for n, _, k in pts) / w
            slope = (max(sum(k * (n - mn) * (t - mt) for n, t, k in pts) / w / var, 0.0) if var > 1e-9
                     else 0.1 * mt / max(mn, 1.0))  # (one batch size seen so far: assume +10% per extra token)
            self._fit = mn, mt, slope
        return self._fit
