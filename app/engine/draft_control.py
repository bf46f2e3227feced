"""How much to draft: llama.cpp's fixed settings, or an adaptive controller that measures and decides.

Fixed mode drafts up to ``draft_max`` tokens every round (a model drafter stops earlier on ``draft_p_min``).

Adaptive mode (``DraftLength``) decides token by token, from what it measures in this generation and carries from
the last (``Measured``): each drafter's confidence signal per token, the acceptance per signal bucket
(``Acceptance``), the draft step, the verification batch by its size, a plain step and a round's other costs. A token
is proposed while P(reached and accepted) x (a target step) exceeds what its position costs the batch, and drafting
goes on while the next, unseen, is worth a draft step too; the cap maximises expected tokens per second
(``speedup``). It opens by measuring at little risk (a short draft, plain steps), turns speculation off where it
loses (a short, priced probe now and then turns it back on), and checks the rounds that drafted against plain
decoding. Each round's purpose is a ``Round``. Why each rule is as it is, with the runs that measured it:
docs/benchmarks/adaptive.md, "How the controller decides".
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from .acceptance import Acceptance
from .drafters.ngram import NgramParams
from .errors import EngineError
from .measured import DECAY, Measured
from .draft_prices import Prices

MAX_DRAFT = 64  # the target's batch holds draft_max + 1 outputs; keeps the logits buffer small


@dataclass(frozen=True)
class DraftParams:
    draft_max: int = 8  # llama.cpp --draft-max
    draft_min: int = 0  # llama.cpp --draft-min: drafts shorter than this are not verified
    draft_p_min: float = 0.5  # llama.cpp --draft-p-min: stop drafting when the draft's top probability is lower
    adaptive: bool = False
    ngram: NgramParams = field(default_factory=NgramParams)  # the n-gram kinds' own settings

    def validate(self) -> None:
        self.ngram.validate()
        if not 0 <= self.draft_max <= MAX_DRAFT:
            raise EngineError(f"Invalid --draft-max {self.draft_max}: use 0..{MAX_DRAFT}.")
        if not 0 <= self.draft_min <= self.draft_max:
            raise EngineError(
                f"Invalid --draft-min {self.draft_min}: it must be between 0 and --draft-max ({self.draft_max})."
            )
        if not 0.0 <= self.draft_p_min < 1.0:
            raise EngineError(f"Invalid --draft-p-min {self.draft_p_min}: it must be in [0, 1).")


class Round(enum.Enum):
    """What the round ``next`` chose is for: the controller's one state between a round's ``next`` and its
    ``update``."""

    PLAN = "plan"  # drafts what the plan says (or nothing)
    MEASURE = "measure"  # drafts a set length whatever the signals: to time the draft and to see acceptance
    RECHECK = "recheck"  # ...an answer's first, where the costs carried in said drafting cannot pay (_costs_moved)
    LONG_LOOK = "long look"  # ...a long look (_long_look_due)
    PROBE = "probe"  # ...a probe, after rounds off

    @property
    def measures(self) -> bool:
        return self is not Round.PLAN


@dataclass
class DraftedRounds:
    """The rounds that called a draft model, decayed: how many, the tokens they made, their seconds, and what the
    costs said they would take (_measured_loss)."""

    rounds: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    modelled: float = 0.0


@dataclass
class Pace:
    """Every round, decayed: the tokens made and their seconds (what an accepted token spares under a growing
    signal: _token_time)."""

    tokens: float = 0.0
    seconds: float = 0.0


class DraftLength:
    MEASURE_DRAFT = 2  # tokens a measuring round drafts: two draft calls to time, at little risk
    PROBE_EVERY = 24  # rounds with speculation off between two probe drafts
    # ...when a draft model's catching up on every token made since it last drafted costs more per token than
    # drafting can save (settled costs). Model-free drafters probe for free.
    PROBE_EVERY_WHEN_COSTLY = 192
    SETTLED = 4  # draft-token timings before a pair may be judged too costly to probe often
    PROBE_EVERY_UNSETTLED = 4  # ...and until then, probes come this often
    EXPLORE, EXPLORE_EVERY = 6, 3  # see _explore
    LONG_LOOK, LONG_LOOKS, LONG_LOOK_ACCEPTANCE = 16, 2, 0.8  # see _long_look_due
    LONG_BATCH_GUESS = 0.3  # see _could_pay
    KEPT_SPAN = 2.5  # ...and how far a plain step may be from that of a long batch kept from an earlier launch
    PLAIN_SAMPLES = 2  # plain steps timed before judging (they cost nothing against plain decoding)
    SURE_SAMPLES = 4  # rounds whose draft tokens' signals were seen before rounds are valued by them (_plan)
    PROBE_BUDGET = 0.02  # the share of the time spent off that probes may lose, by their measured losses
    # Drafting must promise this much over plain decoding: where it promises less, the host's noise and costs the
    # model leaves out (the draft model catching up after rounds off, its prefill) decide whether it wins, while
    # its costs are sure. On Gemma 3 270M by its own Q4_K_M (a ceiling of 0.97-1.07x by the host's spell) a 3%
    # margin still turned drafting on and off within answers, and catching up lost 5-30% of an answer; the starter
    # on a slow spell (1.10x at 12 tokens a round, all accepted) still drafts.
    PAY_MARGIN = 0.08
    # Short measuring drafts the drafter itself ends before their first token (--draft-p-min: a base model unsure at
    # the start of a letter) each cost a draft call and learn nothing: after this many in a row, judge as usual
    EMPTY_MEASURES = 2
    # How much longer than the costs say the rounds that drafted may take before a loss is laid to costs the model
    # does not see (_measured_loss) rather than to the host's noise
    UNSEEN = 0.1
    # The cap is the longest draft length whose estimated rate is within FLAT of the best (_plan). Near its best the
    # rate hardly changes with the length, so the estimates' noise picked among them: a rejection at a sure token
    # and a slow batch set the starter's cap at 3 for 25 rounds of sure tokens (and only batches of up to 4 were
    # timed again), where rounds of 12 made 10% more
    FLAT = 0.02
    RECHECK_S = 20.0  # see _costs_moved
    # While off, the plan is made again every REPLAN_OFF rounds, not at every token: a plan weighs every draft length
    # (about 140 µs here, 50 on a GPU machine's host), and a plain step on a GPU takes as little as 0.6 ms (a
    # Gemma-shaped tiny pair on an H200 lost 7% to it while adaptive drafting stayed off). Probes keep their rounds.
    REPLAN_OFF = 16

    def __init__(self, params: DraftParams, signal_edges: tuple[float, ...] = (), prior: tuple[float, ...] = (0.9,),
                 measured: Measured | None = None, signal_grows: bool = False):
        self.p = params
        self._grows = signal_grows  # Drafter.SIGNAL_GROWS (the module's docstring)
        m = measured or Measured()
        self._known = m.fresh()  # costs from earlier answers: no measuring rounds at the start of this one
        self._measured = m
        self._short = min(max(self.MEASURE_DRAFT, params.draft_min), params.draft_max)  # a measuring round's draft
        self._accepts = Acceptance(signal_edges, prior, m)  # what the target accepts, per signal bucket
        self._reach = 1.0  # P(the next draft token is verified at all) within the current round
        self._floor = 0.0  # a signal bucket whose acceptance is below this ends the round (_plan)
        self._explored = False  # this round proposed a token only to judge its bucket (_explore): it ends there
        self._refused = [0] * (len(signal_edges) + 1)  # per bucket: tokens the estimates said not to draft
        self._prices = Prices(m, params.draft_min, params.draft_max)
        self._spec = DraftedRounds()
        self._pace = Pace()
        self._off_rounds = 0
        self._quiet_until = 0  # while off, rounds up to this many off go without a plan (REPLAN_OFF)
        self._failed_probes = 0  # probes in a row after which speculation stayed off
        self._mode = Round.PLAN  # what this round is for
        self._plain_rounds = 0  # rounds that drafted nothing and called no draft model
        self._examined = 0  # draft tokens the target has judged, all told (the measuring phase needs a few)
        self._rounds = 0
        self._long_looks = 0
        self._empty = 0  # rounds that called the draft model and drafted nothing, since one drafted
        self._called_last = False  # the last round called the draft model (this answer's)
        self._bars: tuple[float, float] | None = None  # _min_acceptance without and with a draft step, this round

    # The live estimates, the prices' (Prices.refresh reads the draft's again once the Measured forgot them)
    _verify = property(lambda self: self._prices.verify)
    _between = property(lambda self: self._prices.between)
    _t_draft = property(lambda self: self._prices.t_draft)
    _t_catch_up = property(lambda self: self._prices.t_catch_up)
    _probe_loss = property(lambda self: self._prices.probe_loss)
    _first_extra = property(lambda self: self._prices.first_extra)

    # --- decisions ------------------------------------------------------------------------------------------
    def next(self, room: int | None = None) -> int:
        """The most tokens to draft this round; ``room``: how many more the answer may make (max_tokens)."""
        self._reach, self._explored = 1.0, False
        self._accepts.start_round()
        was_probe, self._mode = self._mode is Round.PROBE, Round.PLAN
        if not self.p.adaptive or self.p.draft_max == 0:
            return self.p.draft_max
        if self._off_rounds and not was_probe and self._off_rounds < self._quiet_until:
            self._off_rounds += 1
            return 0
        if (not self._rounds and self._known and not self._best_k(0.999)
                and time.monotonic() - self._measured.draft_timed_at >= self.RECHECK_S):
            # (_costs_moved: at little cost, the draft having just read the prompt)
            return self._measure(self._short, Round.RECHECK)
        if self._examined and self._plain_rounds < self.PLAIN_SAMPLES and not self._known:
            return 0  # plain steps: what drafting must beat (the second replaces the first, a new shape's timing)
        if not self._costs_timed():
            return self._measure(self._short)  # measure before judging
        if self._long_look_due():
            self._long_looks += 1
            self._floor = self.LONG_LOOK_ACCEPTANCE  # (it drafts the tokens it expects accepted: _long_look_due, take)
            return self._measure(min(self.p.draft_max, self.LONG_LOOK), Round.LONG_LOOK)
        # Drafting could pay: learn the acceptance before drafting at length. Not once rounds went off: a draft model
        # would first catch up on each token made since (the starter on a slow spell, 57 rounds into an answer: two
        # such drafts took 271 ms, 17 plain steps, and it stayed off). A probe does that, priced. Nor where the last
        # answers' estimates say to draft at length: each paid a round's fixed costs for 3 tokens (the starter's
        # held-out answers replayed: 92.3% of the ceiling, and 93.5% without them).
        best, self._floor, rate = self._plan()
        if (self._examined < 4 and not self._off_rounds and self._empty < self.EMPTY_MEASURES and self._best_k(0.999)
                and not (self._known and best)):
            return self._measure(self._short)
        k = best if not self._measured_loss() and self._repays(rate, room) else 0  # (a pair that cannot pay even
        # when every token is accepted goes off here after one short draft)
        if k == 0:
            self._off_rounds += 1
            if was_probe and self._measured.calls_model and self._settled():
                self._failed_probes += 1  # (a draft model's: each probe first catches up on the rounds off)
            # Off because a draft model cannot pay (_hopeless): no probes in this answer. Off while the costs rest
            # on a few timings (a new shape's first call, a busy moment): probe soon, to settle them. Off because a
            # draft model's catching up costs more per token than drafting can save even when every token is
            # accepted, by settled costs: probe rarely. Off for any other reason (poor acceptance, a measured loss
            # that noise can fake): probe often, so a passing slowdown does not end speculation for the answer.
            # Probes are priced in every case (_priced_wait).
            if self._hopeless():
                every = float("inf")
            elif not self._settled():
                every = self.PROBE_EVERY_UNSETTLED
            elif (self._measured.calls_model
                  and self._prices.best_saving(None, self.PAY_MARGIN) <= self._t_catch_up.value):
                every = self.PROBE_EVERY_WHEN_COSTLY
            else:  # ...and each probe that changed nothing doubles the wait, up to the costly pairs' rate
                every = min(self.PROBE_EVERY << min(self._failed_probes, 8), self.PROBE_EVERY_WHEN_COSTLY)
            wait = max(every, self._priced_wait())
            if self._off_rounds >= wait:
                self._off_rounds = 0
                # (off for a measured loss where the model says drafting pays: a probe of the length it says, so
                # that one round can outweigh the loss)
                return self._measure(max(min(2, self.p.draft_max), best), Round.PROBE)
            self._quiet_until = min(self._off_rounds + self.REPLAN_OFF, math.ceil(min(wait, 1e9)) - 1)
        else:
            self._off_rounds = 0
            self._failed_probes = 0
        return k

    def _repays(self, rate: float, room: int | None) -> bool:
        """Drafting again after rounds off first catches a draft model up on every token made meanwhile: does
        drafting at ``rate`` (tokens per second) repay that before the answer runs out of ``room``? (A plan that
        changes its mind while off learned nothing of the text, only the host's timings drifting: a real run's first
        answer went back on 20 tokens from its end, catching up on 91 tokens in 448 ms.) A probe, priced, still may."""
        if not (self._off_rounds and self._measured.calls_model and rate and room):
            return True
        return self._prices.best_saving(rate, self.PAY_MARGIN) * room > self._off_rounds * self._t_catch_up.value

    def _priced_wait(self) -> float:
        """Rounds off between two probes so that probes lose at most PROBE_BUDGET of the time spent off: a pair
        whose measuring rounds lost 11 ms each against a 15 ms plain step probes every 38 rounds, not every 4."""
        if not self._probe_loss.known:
            return 0.0
        trust = 1.0 if self._probe_loss.n else 0.5  # (one timing only: a new shape's first call may have paid extra)
        return trust * max(self._probe_loss.value, 0.0) / (self.PROBE_BUDGET * self._verify.time(1))

    def _long_look_due(self) -> bool:
        """Time one long verification batch? When acceptance is plainly high and a guess says a long batch could
        make drafting pay (_could_pay), but no long batch was timed twice: the line through short batches
        overstates what each extra position costs a long batch (from one token to a few, llama.cpp switches to
        batched kernels: on the starter pair 6.5 ms a position from 1 to 3 tokens, 3.3 from 3 to 13), and judged by
        it drafting could not pay, so it went off for whole answers whose every draft token was accepted. A look
        proposes a token only while the look is expected accepted whole, up to it, at LONG_LOOK_ACCEPTANCE or more:
        it times a batch, and each token after a likely rejection costs a draft call and a position for little. (The
        starter's first held-out answer, replayed: a look that ended only at tokens expected accepted under that,
        each alone, verified 17 tokens for 6 accepted; ending there, the held-out answers made 90.8% of the ceiling
        cold and 93.4% warm, 93.1% and 94.4% ending by the look's reach.)"""
        return (self._long_looks < self.LONG_LOOKS and self._examined >= 2
                and self.acceptance() >= self.LONG_LOOK_ACCEPTANCE
                and not self._prices.long_batch_timed(self._short) and self._short + 1 < self.p.draft_max
                and self._could_pay())

    def _hopeless(self) -> bool:
        """A draft model that cannot pay even at full acceptance and by the optimistic guess of _could_pay, by
        costs timed twice. A probe would only learn that again, and would first catch the draft model up on every
        token made since it last drafted: on Gemma 3 270M drafted by its own Q4_K_M, 2.1 ms a token against a 13 ms
        plain step, so probes lose a sixth of the time off however rare they are. Each later answer opens with a short
        draft that checks the costs again (_costs_moved)."""
        return self._measured.calls_model and self._t_draft.n > 0 and not self._could_pay()

    def _costs_moved(self, draft_s: float, n_evals: int) -> bool:
        """Did an answer's first round, a short draft where the carried costs said drafting cannot pay even at full
        acceptance, draft more than UNSEEN faster than they say? Then they were a spell's (the module's docstring;
        replayed on the starter, every answer after a spell of draft costs at 1.5x made 1.00x of plain, 1.16-1.25x
        without it). Where they held, the round changes nothing: counted, a few sure tokens at a base model's opening
        turned Gemma 3 270M by its own Q4_K_M on, at the edge of paying, and each answer lost 1-5%."""
        return (n_evals > 1 and self._t_draft.n > 0
                and draft_s < (1.0 - self.UNSEEN) * self._prices.draft_time(n_evals))

    def _could_pay(self) -> bool:
        """Prices.could_pay, at this controller's margin, guess and span."""
        return self._prices.could_pay(self._short, self.PAY_MARGIN, self.LONG_BATCH_GUESS, self.KEPT_SPAN)

    def _measure(self, k: int, mode: Round = Round.MEASURE) -> int:
        """A round that drafts ``k`` tokens whatever their signals: it is there to time the draft and to see
        acceptance (a round whose first token is turned down times nothing, and the costs never settle)."""
        self._mode = mode
        return k

    # The drafter has paid for a token by the time it asks to take it: taking it costs only its place in the
    # verification batch. Looking further costs a draft step, which pays only if the next token, unseen, is likely
    # to be reached and accepted. (Charging each token the draft step that shows it the way out ended rounds at a
    # token whose step was already paid: on a pair whose draft costs half its target, round after round drafted
    # nothing at that price.)
    def take(self, signal: float) -> bool:
        """Propose this drafted token, whose confidence signal is ``signal``?"""
        i = self._accepts.bucket(signal)
        self._accepts.count_shape(i)
        rate = self._accepts.rate(i)
        reach = self._reach * rate
        looking = self._mode is Round.LONG_LOOK
        forced = self._mode.measures and not looking  # (a long look ends at its own floor, on its reach too)
        if not forced and (reach < self._min_acceptance(draft_step=False) or rate < self._floor
                           or (looking and reach < self.LONG_LOOK_ACCEPTANCE)):
            # (a growing signal's bucket that pays, cut by the round's reach: the bucket is judged in other rounds)
            if (self._grows and rate >= self._min_acceptance(draft_step=False)) or not self._explore(i):
                return False
            self._explored = True
        self._reach = reach
        return True

    def look_further(self) -> bool:
        """Draft one more token after those taken?"""
        if self._explored:
            return False
        return self._mode.measures or self._reach * self._accepts.unseen() >= self._min_acceptance(draft_step=True)

    def prices(self) -> tuple[float, float]:
        """What one more verified position and one more draft step cost, in accepted tokens' worth (Gate.prices)."""
        if not self._costs_timed():
            return 0.5, 0.0
        token = self._token_time(at_pace=True)
        return self._verify.slope() / token, self._t_draft.value / token

    def _explore(self, bucket: int) -> bool:
        """Draft a token the estimates say to stop at, one time in EXPLORE_EVERY, while its signal bucket has
        fewer than EXPLORE outcomes or its outcomes alone say such tokens pay: tokens never drafted are never
        judged, so a prior set too low (the starter's near-ties are mostly accepted) would otherwise never be
        corrected. A bucket the target does reject costs a few tries. The round ends at the explored token (take,
        look_further): the tokens after it lie past where the estimates end the round, and drafted on, a near-tie
        explored as a round's first token cost the starter 15 draft calls and a 16-token batch for nothing."""
        accepted, judged = self._accepts.outcomes[bucket]
        if judged >= self.EXPLORE and accepted < judged * max(self._min_acceptance(draft_step=False), self._floor):
            return False
        self._refused[bucket] += 1
        return self._refused[bucket] % self.EXPLORE_EVERY == 0

    def acceptance(self) -> float:
        return self._accepts.overall()

    def _settled(self) -> bool:
        """Enough timings to trust the costs: several draft tokens, and two batch sizes seen more than once."""
        return self._t_draft.n >= self.SETTLED and sum(e.n >= 3 for e in self._verify.values()) >= 2

    def _min_acceptance(self, draft_step: bool) -> float:
        """A draft token pays when, reached and accepted, it saves a plain decoding step (the target's cost for one
        token) at the price of one more position in the verification batch, and of a draft step if ``draft_step``.
        Under a growing signal, it saves what a token costs at the answer's pace, where that is less (the module's
        docstring). Asked for every drafted token, it only changes with ``update``: computed once a round."""
        if self._bars is None:
            if not self._costs_timed():
                self._bars = (0.5, 0.5)
            else:
                slope, token = self._verify.slope(), self._token_time(at_pace=self._grows)
                self._bars = tuple(min(max((slope + step) / token, 0.05), 0.98) for step in (0.0, self._t_draft.value))
        return self._bars[draft_step]

    def _costs_timed(self) -> bool:
        """A draft step timed, and two rounds seen (or costs from earlier answers): prices may be read off them."""
        return self._t_draft.known and (self._rounds >= 2 or self._known)

    def _token_time(self, at_pace: bool) -> float:
        """What an accepted token spares: a plain step, or at the answer's pace (the rounds' seconds per token
        lately) where that is less."""
        plain = self._verify.time(1)
        pace = self._pace
        return min(plain, pace.seconds / pace.tokens) if at_pace and pace.tokens else plain

    def _measured_loss(self) -> bool:
        """Have the rounds that drafted made tokens more slowly than plain decoding does, and taken more than UNSEEN
        longer than the costs say such rounds take? The check is for costs the model does not see; a loss to
        rejections it sees, in the acceptance it plans by. (Judged by the rate alone, a hard first stretch of an
        answer turned drafting off, and the probes, each catching the draft up on the tokens made since, never
        turned it back on: the starter's "why is the sky blue" answer made 0.94x of plain where drafting on made
        1.08x.)"""
        s = self._spec
        return (s.rounds >= 6 and s.tokens / s.seconds < 1.0 / self._verify.time(1)
                and s.seconds > s.modelled * (1.0 + self.UNSEEN))

    def _best_k(self, acceptance: float | None = None) -> int:
        return self._best(acceptance)[0]

    def _best(self, acceptance: float | None = None) -> tuple[int, float]:
        """The draft length that makes tokens fastest at this acceptance (0: plain decoding; None: the drafter's
        acceptance, every token proposed), and that rate: a round of k costs its draft (Prices.draft_time), its
        verification and the time between rounds; a plain step, the last two."""
        return self._prices.best_at(self.acceptance() if acceptance is None else acceptance, self.PAY_MARGIN)

    def _plan(self) -> tuple[int, float, float]:
        """(The draft length to draft this round at most, the acceptance below which a signal bucket's tokens end the
        round, the tokens per second that makes.) A round ends at the first draft token not worth proposing (take), so
        it verifies the sure ones: judged as if every round drafted its full length, by the acceptance of all draft
        tokens alike, the starter on a slow spell (a draft token at half a target step) went off at 93-98% acceptance
        where its rounds, ending before near-ties, made 1.13x of plain. So a round is valued as what it is, for each
        choice of the buckets whose tokens it proposes (the surest first): how often a round's first draft token falls
        in them (as often as any draft token does), how often one that follows such a token does (unsure spots come in
        runs), and take's estimate of their acceptance; the fastest choice sets this round's floor. A drafter without
        signal buckets proposes every token: its acceptance, all sure."""
        if self._grows:  # (a floor refused whole rounds that its low buckets open and its sure tokens follow: each
            # token's worth ends a round, take)
            k, rate = self._best(0.999)
            return (self.p.draft_max if k else 0), 0.0, rate
        if not self._accepts.edges or self._accepts.rounds_seen() < self.SURE_SAMPLES:
            k, rate = self._best()
            return k, 0.0, rate
        if not self._best_k(0.999):
            return 0, 0.0, 0.0  # (no round pays where a full one, every token accepted, does not)
        # (the margin is to turn drafting on: a round that follows one that called the draft model catches up on
        # nothing, and drafts while it promises no loss. With the margin both ways, the starter on a slow spell went
        # off on estimates a few percent under it, where its rounds made 1.15-1.2x)
        margin = 0.0 if self._called_last else self.PAY_MARGIN
        best_k, best_rate, floor = 0, 0.0, 1.0
        for q, acceptance, sure, sure_next in self._accepts.round_shapes(self._min_acceptance(draft_step=False)):
            k, rate = self._prices.best_at(acceptance, margin, sure, sure_next, self.FLAT)
            if k and rate > best_rate:
                best_k, best_rate, floor = k, rate, q
        return best_k, floor, best_rate

    # --- feedback -------------------------------------------------------------------------------------------
    def record(self, draft, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float,
               between_s: float | None = None) -> None:
        """One round, as the loop saw it: the ``Draft`` it verified, how many of its tokens, how many accepted, the
        seconds spent drafting and verifying, and since the last round ended (None: no round before)."""
        # (a chain's other member's tokens are not the sized drafter's to judge, as a grammar's forced ones)
        signals, forced = (draft.signals, draft.forced) if draft.sized else (None, [True] * n_drafted)
        self.update(n_drafted, n_accepted, draft_s, verify_s, signals, draft.n_evals, draft.first_s,
                    draft.n_first, forced, between_s, draft.unsure and signals is not None)

    def update(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float,
               signals: list[float] | None = None, n_evals: int = 0, first_s: float = 0.0, n_first: int = 0,
               forced: list[bool] | None = None, between_s: float | None = None, unsure: bool = False) -> None:
        """One round's outcome: ``forced`` marks, per draft token, those a grammar forced (not the drafter's);
        ``unsure``: the drafter ended the round itself, at a token it was too unsure to draft (--draft-p-min)."""
        d = DECAY
        if self._mode is Round.RECHECK:  # (_costs_moved)
            if not self._costs_moved(draft_s, n_evals):
                self._rounds += 1
                self._measured.draft_timed_at = time.monotonic()  # (as timed: they are where they were)
                return
            self._measured.forget_draft_costs()
            self._prices.refresh()
        modelled = self._prices.modelled(n_drafted, n_evals) if self._costs_timed() else draft_s + verify_s
        self._bars = None
        if unsure:  # (where the plan sees how sure tokens come, as the least sure bucket's: a round that ends there
            # before a first token pays a draft call for nothing, which the plan prices only so)
            self._accepts.count_shape(0)
        if signals:
            self._accepts.judge(signals, n_accepted)
        # Acceptance is the drafter's: tokens a grammar forced are judged too, but say nothing of it (counted in,
        # the grammar's runs, 90% accepted, would set how far the drafter drafts through free text).
        examined = n_accepted + (1 if n_accepted < n_drafted else 0)
        forced = forced[:n_drafted] if forced else []
        own = n_drafted - sum(forced)
        own_accepted = n_accepted - sum(forced[:n_accepted])
        examined -= sum(forced[:examined])
        if own:
            self._accepts.judge_all(examined, own_accepted)
            self._examined += examined
        self._time_draft(draft_s, first_s, n_evals, n_first, own)
        if between_s is not None:
            self._between.add(between_s)
        if self._mode in (Round.MEASURE, Round.PROBE) and 1 in self._verify:  # what this probe
            # lost (or won) against plain steps (a long look, up to LONG_LOOK tokens, says nothing of what a short
            # probe costs, nor an answer's first round of what one costs after rounds off: it catches up on nothing)
            self._probe_loss.add(draft_s + verify_s - (n_accepted + 1) * self._verify.time(1))
        # The rounds that judge whether drafting loses (_measured_loss): a draft model's (a model-free drafter's
        # lookups cost next to nothing), but not a long look, a timing that drafts past where rounds end: counted, the
        # starter's first answer went off after two looks verified 16 tokens for 6 and 1 accepted. A probe that made
        # its tokens faster than plain decoding starts the record again: the rounds that lost were another spell's,
        # and without the looks' to dilute them one probe could not outweigh them. Its catching up on the tokens made
        # while off is left out: that is the price of having been off, paid once, not a cost of drafting on.
        if n_evals and self._mode is not Round.LONG_LOOK:
            r, spent = self._spec, draft_s + verify_s
            if self._mode is Round.PROBE:
                spent -= max(first_s - self._t_draft.value - self._first_extra.value, 0.0)
                if (n_accepted + 1) * self._verify.time(1) > spent:
                    r = DraftedRounds()
            self._spec = DraftedRounds(d * r.rounds + 1, d * r.tokens + n_accepted + 1, d * r.seconds + spent,
                                       d * r.modelled + modelled)
        pace = self._pace
        self._pace = Pace(d * pace.tokens + n_accepted + 1, d * pace.seconds + draft_s + verify_s + (between_s or 0.0))
        self._rounds += 1
        self._plain_rounds += not (n_drafted or n_evals)
        self._empty = 0 if n_drafted else self._empty + (n_evals > 0)
        self._verify.add(n_drafted + 1, verify_s)

    def _time_draft(self, draft_s: float, first_s: float, n_evals: int, n_first: int, own: int) -> None:
        """What a round's draft calls cost: a marginal call, a round's first call beyond it, a catch-up token."""
        # A drafted token costs one draft-model call (model-free drafters: their time per token). The calls after
        # a round's first tell that marginal cost; the first also catches up on the tokens made since the last
        # draft, so it only stands in (once some rounds passed with nothing better) until a real timing comes.
        if n_evals or own:
            self._measured.draft_timed_at = time.monotonic()
            self._measured.calls_model |= n_evals > 0
        if n_evals > 1:
            self._t_draft.add((draft_s - first_s) / (n_evals - 1))
        elif n_evals == 1 and not self._t_draft.known and self._rounds >= 3:
            self._t_draft.add(draft_s, provisional=True)
        elif own and not n_evals:
            self._t_draft.add(draft_s / own)
        if n_evals and n_first:
            self._t_catch_up.add(first_s / n_first)
        # What a round's first call costs beyond a marginal one, drafting round after round (a round of one call
        # times no marginal call to compare its first with). After rounds off, the first call also catches up on
        # every token made meanwhile (t_catch_up, a probe's cost), so it only bounds the steady cost from above: it
        # counts where it is not above the estimate. Counted in whole, those catch-ups took this from 4-7 ms to 22 ms
        # on the starter within 8 answers, and drafting looked too costly to turn back on; nor is one the first
        # timing (a round catching up on more than two tokens): on Gemma 3 270M by its own Q4_K_M a probe's catching
        # up on 46 tokens was, at 138 ms, and drafting looked hopeless at any acceptance.
        if n_evals > 1:
            extra = max(first_s - (draft_s - first_s) / (n_evals - 1), 0.0)
            if self._called_last or n_first <= 2 or extra <= self._first_extra.value:
                self._first_extra.add(extra)
        self._called_last = n_evals > 0
