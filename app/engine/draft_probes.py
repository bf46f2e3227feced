"""Rounds with speculation off, and the probes that turn it back on (``Probes``), for the adaptive controller
(``draft_control.DraftLength``). A probe is a short draft now and then: it tells whether the text became
predictable, and costs a draft model its catching up on every token made since it last drafted. So how often
depends on why drafting went off (``Off``), each probe that changed nothing doubles the wait, and every wait is
priced: probes lose at most BUDGET of the time spent off. Why each rule is as it is:
docs/benchmarks/adaptive.md."""
from __future__ import annotations

import enum
import math
from typing import Callable

from .draft_prices import Prices


class Off(enum.Enum):
    """Why a round went off, which sets how often probes come (all priced: Probes._priced_wait)."""

    # A draft model that cannot pay even at full acceptance by the optimistic guess of Prices.could_pay, by costs
    # timed: no probes in this answer. A probe would only learn that again, after catching the draft model up on
    # every token made since it last drafted. Each later answer opens with a short draft that checks the costs
    # again (DraftLength._costs_moved).
    HOPELESS = "hopeless"
    UNSETTLED = "unsettled"  # the costs rest on a few timings (a new shape's first call, a busy moment): probe soon
    # A draft model's catching up costs more per token than drafting can save even when every token is accepted,
    # by settled costs: probe rarely. (Model-free drafters probe for free.)
    COSTLY = "costly"
    OTHER = "other"  # poor acceptance, a loss that noise can fake: probe often, doubling the wait after each failure


class Probes:
    EVERY = 24  # rounds with speculation off between two probe drafts
    EVERY_WHEN_COSTLY = 192  # ...when Off.COSTLY (model-free drafters probe for free)
    EVERY_UNSETTLED = 4  # ...when Off.UNSETTLED
    SETTLED = 4  # draft-token timings before the costs are settled (and two batch sizes timed three times)
    BUDGET = 0.02  # the share of the time spent off that probes may lose, by their measured losses
    # While off, the plan is made again every REPLAN_OFF rounds, not at every token: a plan weighs every draft length
    # (about 140 µs here, 50 on a GPU machine's host), and a plain step on a GPU takes as little as 0.6 ms (a
    # Gemma-shaped tiny pair on an H200 lost 7% to it while adaptive drafting stayed off). Probes keep their rounds.
    REPLAN_OFF = 16

    def __init__(self, prices: Prices):
        self._prices = prices
        self.off_rounds = 0  # rounds in a row with speculation off
        self._quiet_until = 0  # while off, rounds up to this many off go without a plan (REPLAN_OFF)
        self._failed = 0  # probes in a row after which speculation stayed off

    def quiet(self, was_probe: bool) -> bool:
        """A round off that needs no plan (REPLAN_OFF): counted here."""
        if self.off_rounds and not was_probe and self.off_rounds < self._quiet_until:
            self.off_rounds += 1
            return True
        return False

    def on(self) -> None:
        self.off_rounds = self._failed = 0

    def off(self, was_probe: bool, calls_model: bool, could_pay: Callable[[], bool], margin: float) -> bool:
        """One more round off, the last a probe if ``was_probe``, of a drafter that runs a model if ``calls_model``,
        where ``could_pay()`` says whether drafting could pay at full acceptance. True: probe now instead."""
        self.off_rounds += 1
        self._failed += was_probe and calls_model and self._settled()  # (a draft model's probes cost a catch-up)
        why = self.why(calls_model, could_pay, margin)
        if why is Off.HOPELESS:
            every = float("inf")
        elif why is Off.UNSETTLED:
            every = self.EVERY_UNSETTLED
        elif why is Off.COSTLY:
            every = self.EVERY_WHEN_COSTLY
        else:
            every = min(self.EVERY << min(self._failed, 8), self.EVERY_WHEN_COSTLY)
        wait = max(every, self._priced_wait())
        if self.off_rounds >= wait:
            self.off_rounds = 0
            return True
        self._quiet_until = min(self.off_rounds + self.REPLAN_OFF, math.ceil(min(wait, 1e9)) - 1)
        return False

    def why(self, calls_model: bool, could_pay: Callable[[], bool], margin: float) -> Off:
        """Why drafting is off now (Off), by the costs measured."""
        p = self._prices
        if calls_model and p.t_draft.n > 0 and not could_pay():
            return Off.HOPELESS
        if not self._settled():
            return Off.UNSETTLED
        if calls_model and p.best_saving(None, margin) <= p.t_catch_up.value:
            return Off.COSTLY
        return Off.OTHER

    def _settled(self) -> bool:
        """Enough timings to trust the costs: several draft tokens, and two batch sizes seen more than once."""
        p = self._prices
        return p.t_draft.n >= self.SETTLED and sum(e.n >= 3 for e in p.verify.values()) >= 2

    def _priced_wait(self) -> float:
        """Rounds off between two probes so that probes lose at most BUDGET of the time spent off: a pair whose
        measuring rounds lost 11 ms each against a 15 ms plain step probes every 38 rounds, not every 4."""
        loss = self._prices.probe_loss
        if not loss.known:
            return 0.0
        trust = 1.0 if loss.n else 0.5  # (one timing only: a new shape's first call may have paid extra)
        return trust * max(loss.value, 0.0) / (self.BUDGET * self._prices.verify.time(1))

    def repay(self, rate: float, room: int | None, calls_model: bool, margin: float) -> bool:
        """Drafting again after rounds off first catches a draft model up on every token made meanwhile: does
        drafting at ``rate`` (tokens per second) repay that before the answer runs out of ``room``? (A plan that
        changes its mind while off learned nothing of the text, only the host's timings drifting: a real run's first
        answer went back on 20 tokens from its end, catching up on 91 tokens in 448 ms.) A probe, priced, still may."""
        if not (self.off_rounds and calls_model and rate and room):
            return True
        return self._prices.best_saving(rate, margin) * room > self.off_rounds * self._prices.t_catch_up.value
