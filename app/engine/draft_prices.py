"""What rounds of drafting cost and make, read off the measured costs (``Measured``): the plan over ``speedup``'s
model that the adaptive controller (``draft_control.DraftLength``) drafts by, and what a round's draft timings tell
of them (``time_draft``). It keeps no state but the live estimates, so each answer can be checked alone against
timings given to a ``Measured``."""
from __future__ import annotations

from .measured import Measured
from .speedup import best_draft_length


class Prices:
    """Over ``measured``'s estimates, for drafts of ``draft_min`` to ``draft_max`` tokens."""

    def __init__(self, measured: Measured, draft_min: int, draft_max: int):
        self.measured = measured
        self.lengths = range(max(1, draft_min), draft_max + 1)
        self.between, self.verify = measured.between, measured.verify
        self.refresh()

    def refresh(self) -> None:
        """Read the draft's costs from the ``Measured`` (again, once it forgot them)."""
        m = self.measured
        self.t_draft, self.t_catch_up, self.probe_loss, self.first_extra = (m.t_draft, m.t_catch_up, m.probe_loss,
                                                                            m.first_extra)

    def draft_time(self, k: float) -> float:
        """Seconds drafting k tokens: k draft calls, the first catching up on the tokens made since the last round."""
        return k * self.t_draft.value + (self.first_extra.value if k else 0.0)

    def modelled(self, n_drafted: int, n_evals: int) -> float:
        """Seconds the costs say a round of ``n_evals`` draft calls and ``n_drafted`` tokens takes (_measured_loss).
        A round that drafted nothing is a plain step: its draft call, ended before a first token by --draft-p-min,
        is a cost the plan does not see."""
        drafting = n_evals * self.t_draft.value + self.first_extra.value if n_drafted else 0.0
        return drafting + self.verify.time(n_drafted + 1)

    def best_at(self, acceptance: float, margin: float, sure: float = 1.0, sure_next: float | None = None,
                flat: float = 0.0) -> tuple[int, float]:
        """The draft length that makes tokens fastest at this acceptance, with ``margin`` over plain decoding (0:
        plain decoding), and that rate: a round of k costs its draft (draft_time), its verification and the time
        between rounds; a plain step, the last two. ``sure``, ``sure_next``, ``flat``: as best_draft_length's."""
        return best_draft_length(lambda n: self.verify.time(n) + self.between.value, self.draft_time, self.lengths,
                                 min(acceptance, 0.999), margin, sure, sure_next, flat)

    def best_saving(self, rate: float | None, margin: float) -> float:
        """Seconds per token drafting saves at ``rate`` (tokens per second; by default the best, every draft token
        accepted), by the measured costs. A draft model that was off pays about its catch-up cost for every token
        made meanwhile when it drafts again: where that is more than drafting can save, turning it back on does not
        pay even if it stays on as long."""
        return self.verify.time(1) + self.between.value - 1.0 / (rate or self.best_at(0.999, margin)[1])

    def long_batch_timed(self, short: int) -> bool:
        """A batch longer than a measuring round's (``short`` tokens) timed twice (a new shape's first call pays
        extra: on the starter 13 tokens took 74 ms the first time, 63 after, and judged by the first, drafting could
        not pay)."""
        n = max(self.verify, default=1)
        return n > short + 1 and self.verify[n].n > 0

    def could_pay(self, short: int, margin: float, guess: float, kept_span: float) -> bool:
        """Could drafting pay at full acceptance if a long batch's extra positions cost only ``guess`` of
        what the short ones measured each (on the starter pair they cost half)? If not, a long look cannot change
        the verdict (on Gemma 3 270M drafted by its own Q4_K_M, a draft token costs 0.8 of a target step: each
        extra position would have to cost under a fifth of what it measured), and neither can a probe. Once a long
        batch was timed, no guess: the measured costs say; and where one was timed in an earlier launch, at about
        this plain step's speed (a host, not another: a GPU's), what its positions weighed against a plain step
        then. (Guessed, Gemma's first answer of each launch looked twice and probed, each probe catching the draft
        up on the 35-48 tokens made since: 0.85-0.88x of plain, where the next answers made 0.97-1.0x.)"""
        if self.long_batch_timed(short):
            return self.best_at(0.999, margin)[0] > 0
        plain, slope = self.verify.time(1) + self.between.value, guess * self.verify.slope()
        if kept := self.measured.kept_long_batch:
            share, kept_plain = kept
            if 1.0 / kept_span <= self.verify.time(1) / kept_plain <= kept_span:
                slope = share * self.verify.time(1)
        k, _ = best_draft_length(lambda n: plain + slope * (n - 1), self.draft_time, self.lengths, 0.999, margin)
        return k > 0

    def time_draft(self, draft_s: float, first_s: float, n_evals: int, n_first: int, own: int, rounds: int,
                   called_last: bool) -> None:
        """What a round's draft calls cost: a marginal call, a round's first call beyond it, a catch-up token. The
        round made ``n_evals`` draft calls, the first catching up on ``n_first`` tokens in ``first_s`` of its
        ``draft_s`` seconds, and drafted ``own`` tokens of the drafter's; ``rounds`` came before it, and the last
        called the draft model if ``called_last``."""
        # A drafted token costs one draft-model call (model-free drafters: their time per token). The calls after
        # a round's first tell that marginal cost; the first also catches up on the tokens made since the last
        # draft, so it only stands in (once some rounds passed with nothing better) until a real timing comes.
        if n_evals > 1:
            self.t_draft.add((draft_s - first_s) / (n_evals - 1))
        elif n_evals == 1 and not self.t_draft.known and rounds >= 3:
            self.t_draft.add(draft_s, provisional=True)
        elif own and not n_evals:
            self.t_draft.add(draft_s / own)
        if n_evals and n_first:
            self.t_catch_up.add(first_s / n_first)
        # What a round's first call costs beyond a marginal one, drafting round after round (a round of one call
        # times no marginal call to compare its first with). After rounds off, the first call also catches up on
        # every token made meanwhile (t_catch_up, a probe's cost), so it only bounds the steady cost from above: it
        # counts where it is not above the estimate. Counted in whole, those catch-ups took this from 4-7 ms to 22 ms
        # on the starter within 8 answers, and drafting looked too costly to turn back on; nor is one the first
        # timing (a round catching up on more than two tokens): on Gemma 3 270M by its own Q4_K_M a probe's catching
        # up on 46 tokens was, at 138 ms, and drafting looked hopeless at any acceptance.
        if n_evals > 1:
            extra = max(first_s - (draft_s - first_s) / (n_evals - 1), 0.0)
            if called_last or n_first <= 2 or extra <= self.first_extra.value:
                self.first_extra.add(extra)
