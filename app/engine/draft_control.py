"""How much to draft: llama.cpp's fixed settings, or an adaptive controller that measures and decides.

Fixed mode drafts up to ``draft_max`` tokens every round (a model drafter stops earlier on ``draft_p_min``).

Adaptive mode (``DraftLength``) decides token by token, from what it measures in this generation and carries from
the last (``Measured``): each drafter's confidence signal per token, the acceptance per signal bucket
(``Acceptance``), the draft step, the verification batch by its size, a plain step and a round's other costs. A token
is proposed while P(reached and accepted) x (a target step) exceeds what its position costs the batch, and drafting
goes on while the next, unseen, is worth a draft step too; the cap maximises expected tokens per second
(``speedup``). It opens by measuring at little risk (a short draft, plain steps), turns speculation off where it
loses (a short, priced probe now and then turns it back on), and checks the rounds that drafted against plain
decoding. Each round's purpose is a ``Round``.

Its parts, each testable alone: ``draft_prices.Prices`` (the plan over ``speedup``'s model, and what timings tell
of the costs), ``draft_probes.Probes`` (rounds off, and when to probe), ``draft_tallies`` (the decayed records of the
rounds), ``acceptance.Acceptance``. Why each rule and constant is as it is, with the runs that measured it:
docs/benchmarks/adaptive.md, "How the controller decides".
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .acceptance import Acceptance
from .draft_prices import Prices
from .draft_probes import Probes
from .draft_tallies import DraftedRounds, Pace
from .drafters.ngram import NgramParams
from .errors import EngineError
from .measured import Measured

MAX_DRAFT = 64  # the target's batch holds draft_max + 1 outputs; keeps the logits buffer small


@dataclass(frozen=True)
class DraftParams:
    draft_max: int = 8  # llama.cpp --draft-max
    draft_min: int = 0  # llama.cpp --draft-min: drafts shorter than this are not verified
    draft_p_min: float = 0.5  # llama.cpp --draft-p-min: stop drafting when the draft's top probability is lower
    adaptive: bool = False
    ngram: NgramParams = field(default_factory=NgramParams)  # the n-gram kinds' own settings
    # Whose earlier answers a generation adds to and drafting from earlier answers (suffix) reads: "" the app's own,
    # else one API key's (a digest of it): one key's requests never draft from another's
    scope: str = ""
    remember: bool = True  # does this generation join the earlier answers? (not Compare's or a bench's runs)

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


class DraftLength:
    MEASURE_DRAFT = 2  # tokens a measuring round drafts: two draft calls to time, at little risk
    EXPLORE, EXPLORE_EVERY = 6, 3  # see _explore
    LONG_LOOK, LONG_LOOKS, LONG_LOOK_ACCEPTANCE = 16, 2, 0.8  # see _long_look_due
    LONG_BATCH_GUESS = 0.3  # see _could_pay
    KEPT_SPAN = 2.5  # ...and how far a plain step may be from that of a long batch kept from an earlier launch
    PLAIN_SAMPLES = 2  # plain steps timed before judging (they cost nothing against plain decoding)
    SURE_SAMPLES = 4  # rounds whose draft tokens' signals were seen before rounds are valued by them (_plan)
    PAY_MARGIN = 0.08  # what drafting must promise over plain decoding to turn on (where less, noise decides)
    EMPTY_MEASURES = 2  # measuring drafts in a row ended before their first token (--draft-p-min), then judge
    UNSEEN = 0.1  # how much longer than the costs say drafted rounds may take before a loss is not noise
    FLAT = 0.02  # the cap: the longest draft length whose estimated rate is within FLAT of the best (_plan)
    RECHECK_S = 20.0  # see _costs_moved

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
        self._probes = Probes(self._prices)
        self._spec = DraftedRounds()
        self._pace = Pace()
        self._mode = Round.PLAN  # what this round is for
        self._plain_rounds = 0  # rounds that drafted nothing and called no draft model
        self._examined = 0  # draft tokens the target has judged, all told (the measuring phase needs a few)
        self._rounds = 0
        self._long_looks = 0
        self._empty = 0  # rounds that called the draft model and drafted nothing, since one drafted
        self._called_last = False  # the last round called the draft model (this answer's)
        self._bars: tuple[float, float] | None = None  # _min_acceptance without and with a draft step, this round

    # --- decisions ------------------------------------------------------------------------------------------
    def next(self, room: int | None = None) -> int:
        """The most tokens to draft this round; ``room``: how many more the answer may make (max_tokens)."""
        self._reach, self._explored = 1.0, False
        self._accepts.start_round()
        was_probe, self._mode = self._mode is Round.PROBE, Round.PLAN
        if not self.p.adaptive or self.p.draft_max == 0:
            return self.p.draft_max
        if self._probes.quiet(was_probe):
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
        # Drafting could pay: learn the acceptance before drafting at length. Not once rounds went off (a draft model
        # would first catch up on each token made since: a probe does that, priced), nor where the last answers'
        # estimates say to draft at length.
        best, self._floor, rate = self._plan()
        if (self._examined < 4 and not self._probes.off_rounds and self._empty < self.EMPTY_MEASURES
                and self._best_k(0.999) and not (self._known and best)):
            return self._measure(self._short)
        repays = self._probes.repay(rate, room, self._measured.calls_model, self.PAY_MARGIN)
        k = best if not self._measured_loss() and repays else 0  # (a pair that cannot pay even when every token is
        # accepted goes off here after one short draft)
        if k == 0:
            if self._probes.off(was_probe, self._measured.calls_model, self._could_pay, self.PAY_MARGIN):
                # (off for a measured loss where the model says drafting pays: a probe of the length it says, so
                # that one round can outweigh the loss)
                return self._measure(max(min(2, self.p.draft_max), best), Round.PROBE)
        else:
            self._probes.on()
        return k

    def _long_look_due(self) -> bool:
        """Time one long verification batch? When acceptance is plainly high and a guess says a long batch could
        make drafting pay (_could_pay), but no long batch was timed twice: the line through short batches
        overstates what each extra position costs a long batch (llama.cpp switches to batched kernels). A look
        proposes a token only while the look is expected accepted whole, up to it, at LONG_LOOK_ACCEPTANCE or more."""
        return (self._long_looks < self.LONG_LOOKS and self._examined >= 2
                and self.acceptance() >= self.LONG_LOOK_ACCEPTANCE
                and not self._prices.long_batch_timed(self._short) and self._short + 1 < self.p.draft_max
                and self._could_pay())

    def _costs_moved(self, draft_s: float, n_evals: int) -> bool:
        """Did an answer's first round, a short draft where the carried costs said drafting cannot pay even at full
        acceptance, draft more than UNSEEN faster than they say? Then they were a spell's. Where they held, the round
        changes nothing (its few sure tokens say little of the answer)."""
        return (n_evals > 1 and self._prices.t_draft.n > 0
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
    # to be reached and accepted.
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
        return self._prices.verify.slope() / token, self._prices.t_draft.value / token

    def _explore(self, bucket: int) -> bool:
        """Draft a token the estimates say to stop at, one time in EXPLORE_EVERY, while its signal bucket has
        fewer than EXPLORE outcomes or its outcomes alone say such tokens pay: tokens never drafted are never
        judged, so a prior set too low (the starter's near-ties are mostly accepted) would otherwise never be
        corrected. A bucket the target does reject costs a few tries. The round ends at the explored token (take,
        look_further): the tokens after it lie past where the estimates end the round."""
        accepted, judged = self._accepts.outcomes[bucket]
        if judged >= self.EXPLORE and accepted < judged * max(self._min_acceptance(draft_step=False), self._floor):
            return False
        self._refused[bucket] += 1
        return self._refused[bucket] % self.EXPLORE_EVERY == 0

    def acceptance(self) -> float:
        return self._accepts.overall()

    def _min_acceptance(self, draft_step: bool) -> float:
        """A draft token pays when, reached and accepted, it saves a plain decoding step (the target's cost for one
        token) at the price of one more position in the verification batch, and of a draft step if ``draft_step``.
        Under a growing signal, it saves what a token costs at the answer's pace, where that is less (the module's
        docstring). Asked for every drafted token, it only changes with ``update``: computed once a round."""
        if self._bars is None:
            if not self._costs_timed():
                self._bars = (0.5, 0.5)
            else:
                slope, token, step = (self._prices.verify.slope(), self._token_time(at_pace=self._grows),
                                      self._prices.t_draft.value)
                self._bars = tuple(min(max((slope + s) / token, 0.05), 0.98) for s in (0.0, step))
        return self._bars[draft_step]

    def _costs_timed(self) -> bool:
        """A draft step timed, and two rounds seen (or costs from earlier answers): prices may be read off them."""
        return self._prices.t_draft.known and (self._rounds >= 2 or self._known)

    def _token_time(self, at_pace: bool) -> float:
        """What an accepted token spares: a plain step, or at the answer's pace (the rounds' seconds per token
        lately) where that is less."""
        plain = self._prices.verify.time(1)
        return self._pace.token_time(plain) if at_pace else plain

    def _measured_loss(self) -> bool:
        """Have the rounds that drafted lost to costs the model does not see (DraftedRounds.lose)? A loss to
        rejections the model sees, in the acceptance it plans by (judged by the rate alone, a hard first stretch of
        an answer turned drafting off for good)."""
        return self._spec.lose(self._prices.verify.time(1), self.UNSEEN)

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
        it verifies the sure ones: a round is valued as what it is, for each choice of the buckets whose tokens it
        proposes (the surest first): how often a round's first draft token falls in them (as often as any draft token
        does), how often one that follows such a token does (unsure spots come in runs), and take's estimate of their
        acceptance; the fastest choice sets this round's floor. A drafter without signal buckets proposes every token:
        its acceptance, all sure."""
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
        # nothing, and drafts while it promises no loss)
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
        if n_evals or own:
            self._measured.draft_timed_at = time.monotonic()
            self._measured.calls_model |= n_evals > 0
        self._prices.time_draft(draft_s, first_s, n_evals, n_first, own, self._rounds, self._called_last)
        self._called_last = n_evals > 0
        if between_s is not None:
            self._prices.between.add(between_s)
        if self._mode in (Round.MEASURE, Round.PROBE) and 1 in self._prices.verify:  # what this probe
            # lost (or won) against plain steps (a long look, up to LONG_LOOK tokens, says nothing of what a short
            # probe costs, nor an answer's first round of what one costs after rounds off: it catches up on nothing)
            self._prices.probe_loss.add(draft_s + verify_s - (n_accepted + 1) * self._prices.verify.time(1))
        # The rounds that judge whether drafting loses (_measured_loss): a draft model's (a model-free drafter's
        # lookups cost next to nothing), but not a long look, a timing that drafts past where rounds end. A probe
        # that made its tokens faster than plain decoding starts the record again: the rounds that lost were another
        # spell's. Its catching up on the tokens made while off is left out: the price of having been off, paid once.
        if n_evals and self._mode is not Round.LONG_LOOK:
            r, spent = self._spec, draft_s + verify_s
            if self._mode is Round.PROBE:
                spent -= max(first_s - self._prices.t_draft.value - self._prices.first_extra.value, 0.0)
                if (n_accepted + 1) * self._prices.verify.time(1) > spent:
                    r = DraftedRounds()
            self._spec = r.add(n_accepted + 1, spent, modelled)
        self._pace = self._pace.add(n_accepted + 1, draft_s + verify_s + (between_s or 0.0))
        self._rounds += 1
        self._plain_rounds += not (n_drafted or n_evals)
        self._empty = 0 if n_drafted else self._empty + (n_evals > 0)
        self._prices.verify.add(n_drafted + 1, verify_s)
