"""The adaptive draft-length controller on synthetic measurements (times in seconds, as the loop reports them)."""
import math
import time
from bisect import bisect_right

from app.engine.draft_control import DraftLength, DraftParams, Measured, Round
from app.engine.draft_prices import Prices
from app.engine.draft_probes import Probes
from app.engine.draft_tallies import DraftedRounds, Pace
from app.engine.drafters import ModelDrafter
from app.engine.drafters.ngram import NgramSimple

ADAPTIVE = DraftParams(draft_max=8, adaptive=True)
VERIFY_1 = 0.010  # the target's time for one token
NEAR_TIE = 0.02  # a draft token's logit gap in the lowest signal bucket (its prior: 0.5)


def verify(n: int) -> float:
    return VERIFY_1 + 0.002 * (n - 1)


def feed(c: DraftLength, rounds: int, accept, t_draft: float) -> list[int]:
    """Run ``rounds`` rounds: draft what the controller asks, or fewer (drafts end early on unsure tokens), with
    ``accept(k)`` of them accepted, and report the times."""
    asked = []
    for i in range(rounds):
        k = c.next()
        asked.append(k)
        k = min(k, (8, 3, 1, 5)[i % 4])
        c.update(k, accept(k), k * t_draft, verify(k + 1), n_evals=k, first_s=t_draft if k else 0.0)
    return asked


def test_drafts_when_it_pays():
    c = DraftLength(ADAPTIVE)
    asked = feed(c, 30, lambda k: k, t_draft=0.002)
    assert all(k == 8 for k in asked[5:])


def test_turns_off_when_drafting_costs_more_than_it_saves_and_rarely_probes_then():
    """Every draft accepted, but a draft token costs as much as a target token: speculation loses. The cause is
    the cost, so probing again (the draft first catching up on every token since) is kept rare."""
    c = DraftLength(ADAPTIVE)
    asked = feed(c, 200, lambda k: k, t_draft=0.011)
    assert asked[:3] == [2, 0, 0]  # one short draft and a plain step show it cannot pay: little lost finding out
    assert asked[10:].count(0) > 0.95 * len(asked[10:])
    off = asked[asked.index(0, 2):]  # after the measuring rounds
    assert sum(1 for k in off if k) <= 4  # a few probes settle the costs, then none for the rest (~190 rounds)
    assert not any(asked[110:])


def test_a_draft_model_that_cannot_pay_is_not_probed_again_in_the_answer():
    """Once its costs were timed twice and say it cannot pay even at full acceptance, a draft model is left off for
    the rest of the answer: each probe would first catch it up on every token made since (on Gemma 3 270M by its
    own Q4_K_M, 2.1 ms a token against a 13 ms plain step: a sixth of the time off, however rare the probes)."""
    c = DraftLength(ADAPTIVE)
    asked = feed(c, 600, lambda k: k, t_draft=0.011)
    assert not any(asked[30:])  # (probes until a draft timing came twice: here by round 25)


def test_costs_timed_in_one_answer_start_the_next():
    """The engine keeps what rounds cost (``Measured``) from one answer to the next: a pair that cannot pay starts
    the next answer with speculation off, one that pays drafts from its first round; after MEMORY_S without a draft
    timing, an answer measures again."""
    costly = Measured()
    feed(DraftLength(ADAPTIVE, measured=costly), 30, lambda k: k, t_draft=0.011)
    assert costly.fresh() and not any(feed(DraftLength(ADAPTIVE, measured=costly), 100, lambda k: k, t_draft=0.011))

    cheap = Measured()
    first = feed(DraftLength(ADAPTIVE, measured=cheap), 30, lambda k: k, t_draft=0.002)
    assert first[:3] == [2, 0, 0]  # measuring: a short draft, two plain steps
    assert all(feed(DraftLength(ADAPTIVE, measured=cheap), 30, lambda k: k, t_draft=0.002))

    cheap.draft_timed_at -= Measured.MEMORY_S
    assert not cheap.fresh() and feed(DraftLength(ADAPTIVE, measured=cheap), 3, lambda k: k, t_draft=0.002)[0] == 2


def test_measuring_drafts_that_end_before_their_first_token_are_not_asked_for_every_round():
    """A base model unsure at the start of a letter: with --draft-p-min the draft model ends each draft before its
    first token, so a measuring round costs a draft call (4 ms) and learns nothing. After a few, the controller
    judges as usual (off) and probes at the price those calls cost (2% of the time off: every 20 rounds)."""
    c = DraftLength(ADAPTIVE)
    called = []
    for i in range(100):
        k = c.next()
        if k:
            called.append(i)
        c.update(0, 0, 0.004 if k else 0.0, verify(1), n_evals=1 if k else 0)
    assert len(called) <= 8 and called[4:] == [23, 43, 63, 83]


def test_probes_back_off_while_acceptance_stays_poor():
    """Off for poor acceptance: probes are priced (each loses 8 ms against a 10 ms plain step: at most 2% of the
    time off goes to probes, so 40 rounds between two), and once the costs are settled each probe that finds
    nothing better doubles the wait (a draft model's probe first catches up on every token made while off: on the
    starter pair on a slow spell, probes every 24 rounds cost more than a tenth of the speed)."""
    c = DraftLength(ADAPTIVE)
    asked = feed(c, 600, lambda k: 0, t_draft=0.002)
    probes = [i for i in range(asked.index(0, 2), len(asked)) if asked[i]]  # after the measuring rounds
    gaps = [b - a for a, b in zip(probes, probes[1:]) if b - a > 1]  # (not the short drafts learning acceptance)
    priced = (2 * 0.002 + verify(3) - VERIFY_1) / (Probes.BUDGET * VERIFY_1)
    assert all(g > priced for g in gaps)
    assert gaps[-3:] == [2 * Probes.EVERY, 4 * Probes.EVERY, Probes.EVERY_WHEN_COSTLY]


def test_measured_loss_turns_speculation_off_even_where_the_model_says_it_pays():
    """Rounds whose draft call ends before its first token still pay for that call; the geometric model does not
    see it, the measured rate does."""
    c = DraftLength(ADAPTIVE)
    for _ in range(4):  # measurements that make drafting look cheap and accepted
        k = c.next()
        c.update(k, k, k * 0.001, verify(k + 1), n_evals=k)
    assert c.next() > 0
    for _ in range(20):  # then draft calls that end before their first token, at 0.004 s each
        c.next()
        c.update(0, 0, 0.004, verify(1), n_evals=1)
    assert c._best_k() > 0 and c.next() == 0


def test_a_hard_first_stretch_does_not_turn_drafting_off_for_the_answer():
    """After an answer whose draft tokens were all accepted, one whose first 40 tokens the target often rejects
    (every third, at signals that look sure), then agrees with the draft: the rounds of the hard stretch lose to
    plain decoding, as the costs said such rounds would. That is the text, not a cost the model misses, so it is
    left to the acceptance, and drafting goes on once the text is easy. (Turned off by the measured rate, the
    starter's "why is the sky blue" answer stayed off: each probe, catching the draft up on every token made since,
    lost to plain steps. 0.94x of plain where drafting on made 1.08x.)"""
    t_draft, t_catch_up = 0.004, 0.0025  # a draft call; the first call's catching up, per token made since

    def answer(measured: Measured, hard_until: int) -> list[int]:
        """The tokens each round made after the first 60 of the answer."""
        c = DraftLength(DraftParams(draft_max=12, adaptive=True), ModelDrafter.SIGNAL_EDGES,
                        ModelDrafter.SIGNAL_PRIOR, measured)
        pos, cached, late = 0, 0, []
        while pos < 200:
            signals, evals = propose(c, c.next(), lambda j: 0.5)
            accepted = next((j for j in range(len(signals)) if pos + j < hard_until and (pos + j) % 3 == 2),
                            len(signals))
            n_first = max(pos + 1 - cached, 1)  # tokens the draft's first call evaluates
            first_s = t_draft + t_catch_up * (n_first - 1) if evals else 0.0
            if evals:
                cached = pos + 1 + min(accepted, evals - 1)
            c.update(len(signals), accepted, first_s + t_draft * (evals - 1) if evals else 0.0,
                     verify(len(signals) + 1), signals=signals, n_evals=evals, first_s=first_s, n_first=n_first)
            if pos >= 60:
                late.append(accepted + 1)
            pos += accepted + 1
        return late

    measured = Measured()
    answer(measured, hard_until=0)
    late = answer(measured, hard_until=40)
    assert sum(late) / len(late) > 3  # tokens a round once the text is easy (plain decoding: 1)


def test_a_rounds_first_call_catching_up_does_not_pass_for_the_cost_of_every_token():
    """The first draft call of a round also evaluates the tokens made since the last draft (and llama.cpp pays
    extra for a batch shape it has not seen): the starter pair's first rounds measured 14-27 ms for calls whose
    marginal cost is 10 ms. Taken as the cost of every token, drafting looked dearer than the target's own step and
    speculation went off for whole answers whose drafts were all accepted."""
    c = DraftLength(ADAPTIVE)
    asked = []
    for _ in range(40):
        k = c.next()
        asked.append(k)
        first = 0.012 if k else 0.0  # catching up: more than a target step (0.010)
        c.update(k, k, first + 0.002 * max(k - 1, 0), verify(k + 1), n_evals=k, first_s=first)
    assert asked[:2] == [2, 0] and all(k == 8 for k in asked[6:])


def test_slow_first_timings_of_new_shapes_do_not_end_drafting_for_the_answer():
    """Measured on the starter pair (a slow spell: 24 ms a target token, 6 ms per extra verified token, 10 ms a
    draft token): the first call of each new batch shape paid ~15 ms extra, so the first round's timings said a
    draft token costs 16 ms and each verified one 11 ms, drafting could not pay even at 100% acceptance, and the
    controller went off for the whole answer (1 of 192 tokens drafted; fixed drafts: 1.4x). First timings only
    stand in until the next ones come."""
    c = DraftLength(DraftParams(draft_max=12, adaptive=True))
    seen: set[tuple[str, int]] = set()

    def cost(kind: str, n: int, t: float) -> float:
        first = (kind, n) not in seen
        seen.add((kind, n))
        return t + (0.015 if first else 0.0)

    asked = []
    for i in range(60):
        k = c.next()
        asked.append(k)
        evals = k
        if i == 2 and k:  # as measured: the third round's first token was a near-tie, so nothing was drafted
            k, evals = 0, 1
        first_call = cost("draft", 2, 0.017) if evals else 0.0  # catches up on two tokens
        rest = sum(cost("draft", 1, 0.0099) for _ in range(max(k - 1, 0)))
        c.update(k, k, first_call + rest, cost("verify", k + 1, 0.024 + 0.006 * k), n_evals=evals,
                 first_s=first_call)
    assert sum(asked[:20]) > 0 and all(k >= 8 for k in asked[-20:])  # (12 x 10 ms + 96 ms for 13 tokens: pays)


def test_short_batches_alone_do_not_judge_what_a_long_one_costs():
    """Measured on the starter pair on a slow spell (2026-11-24): a target step 17 ms, a verification batch of 3
    tokens 30 ms (41 the first time), of 13 tokens 63 ms (from one token to a few, llama.cpp switches to batched
    kernels: 6.5 ms a position, then 3.3), a draft token 11.5 ms, every draft token accepted. Judged by the line
    through the short measuring batches, a draft token cost more than it saves, and speculation went off for whole
    answers (0.1 accepted tokens a round, 0.91x); at 12 tokens a round drafting pays (13 tokens in 201 ms against
    221). A long batch is timed first, twice where its first timing says drafting cannot pay
    (a new shape's first call pays extra)."""
    seen = set()

    def verify_s(n: int) -> float:
        first = n not in seen
        seen.add(n)
        return 0.017 if n == 1 else 0.030 + 0.0033 * (n - 3) + (0.011 if first else 0.0)

    c = DraftLength(DraftParams(draft_max=12, adaptive=True))
    asked = []
    for _ in range(40):
        k = c.next()
        asked.append(k)
        c.update(k, k, 0.0115 * k, verify_s(k + 1), n_evals=k, first_s=0.0115 if k else 0.0)
    assert asked[:4] == [2, 0, 0, 12] and all(k == 12 for k in asked[-20:])


def test_a_passing_slowdown_does_not_end_speculation_for_the_whole_answer():
    """A busy machine makes a few draft rounds slow: measured loss, off. Drafting can pay (cheap, accepted), so
    probes come every Probes.EVERY rounds and drafting resumes once the slowdown is over."""
    c = DraftLength(ADAPTIVE)
    asked = []
    for i in range(120):
        k = c.next()
        asked.append(k)
        slow = 0.08 if 6 <= i < 16 else 0.0  # another process takes the CPU for a while
        c.update(k, k, slow + 0.002 * k, verify(k + 1), n_evals=k, first_s=slow + 0.002 if k else 0.0)
    assert asked[16:].count(0) >= 10  # it went off during or after the slowdown...
    assert all(k == 8 for k in asked[-20:])  # ...and came back


def test_while_off_the_plan_is_made_again_only_every_few_rounds_and_probes_keep_their_rounds():
    """A plan weighs every draft length: about 140 µs here, 50 on a GPU machine's host, where a plain step takes as
    little as 0.6 ms (a Gemma-shaped tiny pair on an H200 lost 7% to planning while it stayed off). While off, the
    controller plans again every REPLAN_OFF rounds only; its probes come at the same rounds as with a plan at
    every token, off for poor acceptance (priced probes) as off because drafting cannot pay (none)."""
    def run(replan_off: int, t_draft: float, accept) -> tuple[list[int], int]:
        c = DraftLength(ADAPTIVE)
        c._probes.REPLAN_OFF = replan_off  # 0: a plan at every round, as before
        plans, plan = [], c._plan
        c._plan = lambda: plans.append(1) or plan()
        return feed(c, 600, accept, t_draft), len(plans)

    for t_draft, accept in [(0.002, lambda k: 0), (0.011, lambda k: k)]:
        every, n_every = run(0, t_draft, accept)
        quiet, n_quiet = run(Probes.REPLAN_OFF, t_draft, accept)
        assert quiet == every and every.count(0) > 500
        assert n_every > 500 and n_quiet < n_every / 5


def test_fixed_mode_always_drafts_draft_max():
    c = DraftLength(DraftParams(draft_max=5))
    assert feed(c, 20, lambda k: 0, t_draft=0.05) == [5] * 20


def test_model_free_drafters_keep_probing_often():
    """An n-gram lookup costs nothing to resume, so probes stay frequent (n_evals=0: no draft model)."""
    c = DraftLength(ADAPTIVE)
    asked = []
    for i in range(200):
        k = c.next()
        asked.append(k)
        k = min(k, (8, 3, 1, 5)[i % 4])
        c.update(k, k, k * 0.011, verify(k + 1))
    off = asked[asked.index(0):]
    assert 5 <= sum(1 for k in off if k) <= 14  # every 24 rounds, after a few to settle the costs


def propose(c: DraftLength, k: int, signal_at) -> tuple[list[float], int]:
    """A round's draft of at most ``k`` tokens, the j-th with confidence ``signal_at(j)``, as a draft model asks the
    controller: take this token? look further? Returns the signals of the tokens taken, and the draft-model calls
    spent (one shows the first token; each look further, one more)."""
    signals, calls = [], 1 if k else 0
    for j in range(k):
        if not c.take(signal_at(j)):
            break
        signals.append(signal_at(j))
        if j + 1 == k or not c.look_further():
            break
        calls += 1
    return signals, calls


def run_with_signals(c: DraftLength, rounds: int, near_tie_accepted: bool) -> tuple[int, int]:
    """Rounds with a draft model whose tokens are confident (gap 3) except every 4th, a near-tie (gap NEAR_TIE), whose
    fate the target decides by ``near_tie_accepted``; a draft token costs 0.35 of a target step, so a token pays
    when it is reached and accepted with probability above ~0.55 (the near-ties' prior: 0.5). Returns (near-ties
    drafted in the first half, in the second)."""
    drafted_ties = [0, 0]
    pos = 0
    for r in range(rounds):
        k = c.next()
        signals, evals = propose(c, k, lambda j: NEAR_TIE if (pos + j) % 4 == 3 else 3.0)
        tokens = len(signals)
        pos += tokens
        accepted = 0
        for signal in signals:
            if signal == NEAR_TIE and not near_tie_accepted:
                break
            accepted += 1
        drafted_ties[r >= rounds // 2] += sum(1 for s in signals if s == NEAR_TIE)
        pos += 1 if accepted == tokens else 0
        c.update(tokens, accepted, 0.0035 * evals, verify(tokens + 1), signals=signals, n_evals=evals,
                 first_s=0.0035 if evals else 0.0)
    return drafted_ties[0], drafted_ties[1]


def test_near_ties_the_target_accepts_are_learned_and_drafted():
    """The prior for near-ties is low (0.5: on the starter pair rejections clustered there), and a token never
    drafted is never judged: the controller drafts some against its estimate, learns they pass, then drafts them."""
    c = DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    first, second = run_with_signals(c, 200, near_tie_accepted=True)
    assert second > 30


def test_near_ties_the_target_rejects_are_tried_only_a_few_times():
    c = DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    first, second = run_with_signals(c, 200, near_tie_accepted=False)
    # A near-tie is drafted already when it is judged, so proposing it costs one more verified position (0.2 of a
    # target step here): the prior (0.5, weight 8) falls under that bar after 13 rejections, and then none is
    # proposed any more.
    assert first <= 14 and second == 0


def run_text(c: DraftLength, rounds: int, signal_at, accepted_at, t_draft: float, verify_s) -> tuple[int, float]:
    """Rounds over a text where ``signal_at(i)`` is the draft's confidence at position i and ``accepted_at(i)``
    whether the target agrees there: the draft model is called when the round may draft, stops where the
    controller says, and the target accepts up to its first disagreement. Returns (tokens made, seconds spent)
    over the second half of the rounds, the controller settled by then."""
    pos, tokens_made, seconds = 0, 0, 0.0
    for r in range(rounds):
        k = c.next()
        signals, evals = propose(c, k, lambda j: signal_at(pos + j))
        tokens = len(signals)
        accepted = next((j for j in range(tokens) if not accepted_at(pos + j)), tokens)
        pos += accepted + 1
        c.update(tokens, accepted, t_draft * evals, verify_s(tokens + 1), signals=signals, n_evals=evals,
                 first_s=t_draft if evals else 0.0)
        if r >= rounds // 2:
            tokens_made, seconds = tokens_made + accepted + 1, seconds + t_draft * evals + verify_s(tokens + 1)
    return tokens_made, seconds


def test_rounds_that_end_before_unsure_tokens_are_valued_as_such():
    """The starter on a slow spell: a draft token costs 0.47 of a target step, each verified position 0.28, so
    drafting pays only where nearly every proposed token is accepted. Unsure spots come in runs (two near-ties in
    every twelve tokens, the first rejected). Counted over every draft token, as if each round drafted its full
    length, acceptance is too low to pay and speculation went off; the rounds the controller drafts end before the
    near-ties, verify only sure tokens, and pay."""
    assert slow_spell_speedup(unsure_every=12) > 1.1


def slow_spell_speedup(unsure_every: int) -> float:
    """The starter on a slow spell (a draft token at 0.47 of a target step, each verified position 0.28): the speed
    adaptive drafting reaches against plain decoding, over a text whose last two tokens in every ``unsure_every``
    are near-ties, the first of them rejected."""
    def verify_s(n):
        return 0.010 + 0.0028 * (n - 1)

    c = DraftLength(DraftParams(draft_max=12, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    n = unsure_every
    tokens, seconds = run_text(c, 400, lambda i: NEAR_TIE if i % n >= n - 2 else 3.0, lambda i: i % n != n - 2,
                               t_draft=0.0047, verify_s=verify_s)
    return tokens / seconds * verify_s(1)


def test_acceptance_is_the_drafters_own_not_that_of_the_tokens_a_grammar_forced():
    """Under a grammar a draft holds forced keys and brackets, nearly always accepted, and the drafter's own tokens
    between them. Only the drafter's count: here it proposes two tokens after four forced ones, the first accepted
    and the second not, so its acceptance is one in two, not five in six."""
    c = DraftLength(ADAPTIVE)
    for _ in range(20):
        c.update(6, 5, 0.0, verify(7), forced=[True] * 4 + [False] * 2)
    assert abs(c.acceptance() - 0.5) < 1e-9
    plain = DraftLength(ADAPTIVE)
    for _ in range(20):
        plain.update(6, 5, 0.0, verify(7))
    assert abs(plain.acceptance() - 5 / 6) < 1e-9


def test_a_rounds_fixed_costs_make_longer_drafts_pay():
    """What a round pays once (the draft's first call catching up, the loop's work between rounds; a plain step
    pays the second too) is timed and counted: with the same acceptance and per-token costs, the longer the fixed
    part of a round, the longer the draft it chooses (left out, they made the starter draft 3 where 12 ran faster)."""
    def cap(first_extra: float, between: float) -> int:
        c = DraftLength(DraftParams(draft_max=12, adaptive=True))
        for _ in range(2):
            c.update(0, 0, 0.0, verify(1), between_s=between)
        for i in range(30):  # 12-token drafts, every other one rejected at its last token
            c.update(12, 11 if i % 2 else 12, 0.003 * 12 + first_extra, verify(13), n_evals=12,
                     first_s=0.003 + first_extra, n_first=2, between_s=between)
        return c.next()

    assert 0 < cap(0.0, 0.0) < cap(0.004, 0.0) < cap(0.004, 0.006)


def test_the_last_answers_acceptance_starts_the_next_as_a_prior():
    """A pair that was accepted throughout the last answer keeps drafting through a few rejections at the start of
    the next (the acceptance carried over counts as PRIOR_WEIGHT tokens); without it, they turn speculation off."""
    import copy

    m = Measured()
    feed(DraftLength(ADAPTIVE, measured=m), 30, lambda k: k, t_draft=0.004)
    forgetful = copy.deepcopy(m)
    forgetful.accepted = forgetful.judged = 0.0

    def start(measured: Measured) -> list[int]:
        c = DraftLength(ADAPTIVE, measured=measured)
        asked = []
        for i in range(6):  # the first three drafts each end in a rejection
            k = c.next()
            asked.append(k)
            c.update(k, max(k - 1, 0) if i < 3 else k, 0.004 * k, verify(k + 1), n_evals=k, first_s=0.004 if k else 0)
        return asked

    assert DraftLength(ADAPTIVE, measured=m).acceptance() > 0.95
    assert all(start(m)) and not any(start(forgetful)[2:])


def test_catching_up_after_rounds_off_is_not_taken_for_a_rounds_fixed_cost():
    """A draft model's first call after rounds off also catches up on every token made meanwhile. That is a
    probe's cost, not what a round's first call costs drafting round after round: counted as such (on the starter,
    4-7 ms became 22 ms within 8 answers), it made drafting look too costly to turn back on."""
    def after_probes(rounds_off: int) -> int:
        c = DraftLength(DraftParams(draft_max=12, adaptive=True))
        for _ in range(2):
            c.update(0, 0, 0.0, verify(1))
        for _ in range(10):  # drafting round after round: the first call costs 2 ms more than the others
            c.update(12, 12, 0.005 * 12 + 0.002, verify(13), n_evals=12, first_s=0.007, n_first=2)
        for _ in range(10):  # rounds off, each followed by a round whose first call catches up on them
            for _ in range(rounds_off):
                c.update(0, 0, 0.0, verify(1))
            catch_up = 0.001 * rounds_off
            c.update(12, 12, 0.005 * 12 + 0.002 + catch_up, verify(13), n_evals=12, first_s=0.007 + catch_up,
                     n_first=rounds_off + 1)
        return c.next()

    assert after_probes(40) == after_probes(1) == 12


def test_drafting_that_pays_stays_on_under_the_margin_to_turn_it_on():
    """Drafting must promise PAY_MARGIN over plain decoding to turn on, where catching the draft model up after
    rounds off is a cost the model does not see; once on, no catching up is due, so it stays while it promises no
    loss. With the margin both ways, a slow spell's starter (a draft token at 0.47 of a target step, a near-tie
    rejected every sixth token) went off on estimates a few percent under the margin and made 1.0x."""
    assert slow_spell_speedup(unsure_every=6) > 1.06


def test_an_answer_starts_by_measuring_where_drafting_could_pay():
    """A draft model has just read the prompt when an answer starts: its first rounds catch up on nothing, the
    cheapest look there is. An answer that starts off by what the last one measured (poor acceptance, drafting
    cheap) drafts a short measuring round there; one where drafting cannot pay even at full acceptance does not."""
    poor = Measured()
    feed(DraftLength(ADAPTIVE, measured=poor), 60, lambda k: 0, t_draft=0.002)
    assert poor.fresh() and DraftLength(ADAPTIVE, measured=poor).next() > 0
    costly = Measured()
    feed(DraftLength(ADAPTIVE, measured=costly), 60, lambda k: k, t_draft=0.011)
    assert costly.fresh() and DraftLength(ADAPTIVE, measured=costly).next() == 0


def test_a_long_look_ends_at_unsure_tokens():
    """A long look drafts up to LONG_LOOK tokens to time a long verification batch, but like any round it ends at a
    token the estimates say not to propose: forced through them, the first answer's long looks on the starter
    verified 16 tokens for 1 and 6 accepted, and the losses they priced kept probes away for the rest of it."""
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    looks = []
    for _ in range(12):
        k = c.next()
        looking = c._mode is Round.LONG_LOOK
        signals, _ = propose(c, k, lambda j: 3.0 if j < 3 else 0.0)  # three sure tokens, then near-ties
        if looking:
            looks.append(len(signals))
        c.update(len(signals), len(signals), 0.002 * len(signals), verify(len(signals) + 1), signals=signals,
                 n_evals=len(signals), first_s=0.002 if signals else 0.0)
    assert looks and all(n < DraftLength.LONG_LOOK for n in looks)


def test_what_each_signal_bucket_earned_carries_to_the_next_answer():
    """Near-ties the target accepted throughout the last answer are drafted from the start of the next: each signal
    bucket's counts are carried (worth CARRIED tokens at most). Restarting at the priors every answer, the starter's
    sure buckets read 0.96-0.97 where the target accepted 99% of them, and a slow spell's rounds looked too poor."""
    import copy

    m = Measured()
    run_with_signals(DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES,
                                 ModelDrafter.SIGNAL_PRIOR, m), 200, near_tie_accepted=True)
    forgetful = copy.deepcopy(m)
    forgetful.buckets = [[0.0, 0.0] for _ in forgetful.buckets]

    def start(measured: Measured) -> int:
        c = DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES,
                        ModelDrafter.SIGNAL_PRIOR, measured)
        return sum(run_with_signals(c, 6, near_tie_accepted=True))  # near-ties drafted in its first 6 rounds

    forgot = start(forgetful)
    assert start(m) >= 1.5 * forgot


def test_a_long_look_that_fails_does_not_turn_drafting_off():
    """A long look is a timing, not a verdict. Here the two looks' drafts, sure throughout, are turned down at their
    second token (16 verified for 1 accepted); the other rounds end before the near-tie that every third token is,
    and each makes 3 tokens in the time of 2.3 plain steps. Counted among the rounds that judge whether drafting
    lost time against plain decoding, the looks turned drafting off for the rest of the answer (the starter's
    first answer in a replay: 0.90x of plain, where the next answers ran at 1.5-1.7x)."""
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    looks, drafted = 0, []
    for r in range(60):
        k = c.next()
        looking = c._mode is Round.LONG_LOOK
        signals, _ = propose(c, k, lambda j: 3.0 if looking or j % 3 < 2 else 0.0)
        n = len(signals)
        accepted = min(n, 1) if looking else next((j for j, s in enumerate(signals) if s == 0.0), n)
        looks += looking
        c.update(n, accepted, 0.0076 * n + (0.0045 if n else 0.0), 0.0196 + 0.0029 * n, signals=signals,
                 n_evals=n, first_s=0.012 if n else 0.0)
        drafted.append(n)
    assert looks == DraftLength.LONG_LOOKS
    assert sum(n > 0 for n in drafted[-30:]) >= 25


def test_after_rounds_off_a_draft_comes_only_as_a_priced_probe():
    """An answer measures with short drafts while drafting could pay and few of its tokens were judged; once rounds
    went off, a draft is a probe and waits its turn: a draft model first catches up on every token made meanwhile
    (the starter on a slow spell, 57 rounds into an answer: 271 ms, 17 plain steps). Here the host slows, so that
    full acceptance comes to pay a few rounds into the answer while half the tokens are accepted: the answer must
    not measure again there."""
    m = Measured()
    feed(DraftLength(ADAPTIVE, measured=m), 40, lambda k: k // 2, t_draft=0.0072)
    c = DraftLength(ADAPTIVE, measured=m)
    asked = []
    for i in range(24):
        k = c.next()
        asked.append(k)
        plain = VERIFY_1 * (1.0 + 0.004 * i)  # the host slows: plain steps grow dearer
        c.update(k, k // 2, 0.0072 * k, plain + 0.002 * k, n_evals=k, first_s=0.0072 * (i + 1) if k else 0.0,
                 n_first=i + 1 if k else 0)
    assert asked[0] > 0 and not any(asked[1:])


def test_a_long_look_drafts_only_tokens_it_expects_accepted():
    """A long look times a long verification batch; a token after a likely rejection adds a draft call for nothing.
    Here its second token is a near-tie (the prior: accepted half the time), the rest sure: the look ends before it
    (in a replay of the starter's first answer, a look went on past near-ties and verified 13 tokens for 1)."""
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    looks = []
    for _ in range(12):
        k = c.next()
        looking = c._mode is Round.LONG_LOOK
        signals, _ = propose(c, k, lambda j: NEAR_TIE if j == 1 else 3.0)
        if looking:
            looks.append(len(signals))
        c.update(len(signals), len(signals), 0.002 * len(signals), verify(len(signals) + 1), signals=signals,
                 n_evals=len(signals), first_s=0.002 if signals else 0.0)
    assert looks and all(n == 1 for n in looks)


def test_a_long_look_ends_where_it_is_no_longer_likely_accepted_whole():
    """Each token of a look counts only while those before it are accepted: past where that is likely, each costs a
    draft call and a position for little. Here every token after the second is of a signal bucket expected accepted
    9 times in 10 (above the look's floor, each alone): the look ends once the round's reach is under it, after 4 (a
    replay of the starter's first held-out answer: a look went on through such tokens and verified 17 for 6)."""
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    looks = []
    for _ in range(12):
        k = c.next()
        looking = c._mode is Round.LONG_LOOK
        signals, _ = propose(c, k, lambda j: 3.0 if j < 2 else 0.2)
        if looking:
            looks.append(len(signals))
        c.update(len(signals), len(signals), 0.002 * len(signals), verify(len(signals) + 1), signals=signals,
                 n_evals=len(signals), first_s=0.002 if signals else 0.0)
    assert looks and all(3 <= n <= 4 for n in looks)


def test_a_token_drafted_to_judge_its_bucket_ends_the_round():
    """Now and then a round drafts a token the estimates say to stop at, to judge its signal bucket again
    (_explore); what follows it lies past where the round should end. Here every other round opens with a near-tie
    the target rejects, then sure tokens, and a draft token costs 0.05 of a target step: once the last answer has
    taught that near-ties are rejected, a round that explores one drafts it alone (drafted on, such a round cost
    the starter 15 draft calls and a 16-token batch for nothing)."""
    def explored(c: DraftLength, rounds: int) -> list[int]:  # tokens drafted by rounds that opened with a near-tie
        out = []
        for r in range(rounds):
            k = c.next()
            measuring, tie = c._mode.measures, r % 2 == 1
            signals, calls = propose(c, k, lambda j: NEAR_TIE if j == 0 and tie else 3.0)
            if tie and signals and not measuring:
                out.append(len(signals))
            c.update(len(signals), 0 if tie else len(signals), 0.0005 * calls, VERIFY_1 + 0.0005 * len(signals),
                     signals=signals or None, n_evals=calls, first_s=0.0005 if calls else 0.0)
        return out

    m = Measured()
    params = DraftParams(draft_max=16, adaptive=True)
    explored(DraftLength(params, ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR, m), 200)
    drafted = explored(DraftLength(params, ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR, m), 60)
    assert drafted and all(n == 1 for n in drafted)


def test_where_drafting_was_mostly_off_a_rounds_first_token_is_judged_by_every_draft_token():
    """The state the starter's controller was in at the start of a slow spell's fifth answer (a replay; times in
    seconds): drafting had been off for most of the earlier answers, so the few rounds' first tokens came from the
    short drafts that open each answer, unsure more often (5.4 of 13 in the lowest bucket), where 91% of the
    answers' tokens were sure. Valued by those first tokens alone, no round paid and the answer stayed off (1.00x
    of plain) where 12-token drafts ending at near-ties made 1.15x; how often a round starts sure is read off every
    draft token seen."""
    m = Measured()
    m.per_bucket(len(ModelDrafter.SIGNAL_EDGES) + 1)
    # (recorded with the buckets of that time, named here by a signal inside each: near-ties under 0.25, 0.25-0.5,
    # 0.5-1, 1-2, 2-4, 4 and over)
    at = [bisect_right(ModelDrafter.SIGNAL_EDGES, signal) for signal in (0.0, 0.4, 0.7, 1.5, 3.0, 5.0)]
    first = [5.4, 0.8, 0.0, 1.0, 3.3, 2.7]
    after = [[0.0, 0.0, 0.0, 2.0, 1.9, 0.0], [0.0, 2.8, 0.0, 0.0, 1.9, 1.0], [0.9, 2.0, 0.9, 0.0, 0.9, 2.8],
             [0.0, 0.0, 1.8, 1.9, 2.9, 0.9], [0.0, 0.0, 2.8, 2.4, 4.4, 2.7], [0.0, 0.8, 2.8, 5.5, 0.0, 0.9]]
    buckets = [[2.0, 3.9], [5.8, 6.8], [6.8, 6.8], [12.2, 12.2], [13.1, 13.1], [11.4, 11.4]]
    for i, a in enumerate(at):
        m.first[a] += first[i]
        m.buckets[a] = [x + y for x, y in zip(m.buckets[a], buckets[i])]
        for j, b in enumerate(at):
            m.after[a][b] += after[i][j]
    m.accepted, m.judged = 10.7, 11.3
    verify_s = {1: 0.0234, 3: 0.036, 12: 0.0857, 17: 0.1117}
    for _ in range(2):  # (a first timing only stands in until a second)
        m.t_draft.add(0.0139)
        m.first_extra.add(0.0037)
        m.between.add(0.0004)
        m.t_catch_up.add(0.0115)
        for n, t in verify_s.items():
            m.verify.add(n, t)
    m.draft_timed_at = time.monotonic()
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR, m)
    for _ in range(2):  # the answer's opening: two sure tokens, both accepted
        assert c.next() >= 2
        signals, calls = propose(c, 2, lambda j: 3.0)
        c.update(2, 2, 0.0037 + 0.0139 * calls, verify_s[3], signals=signals, n_evals=calls, first_s=0.0176,
                 n_first=2)
    assert c.next() > 0


SUPPORT_EDGES, SUPPORT_PRIOR = NgramSimple.SIGNAL_EDGES, NgramSimple.SIGNAL_PRIOR


def copy_rounds(c: DraftLength, rounds: int, first_accepted, run: int) -> tuple[int, int, float]:
    """Rounds of a copying lookup (free to draft) whose every draft opens at a support of 2, its key alone: the
    signal of its j-th token is 2 + j. The target accepts the first token where ``first_accepted(round)``, then
    the copy holds for ``run`` tokens in all. Returns (tokens drafted, tokens made, seconds) over the second half."""
    drafted = made = 0
    seconds = 0.0
    for r in range(rounds):
        k = c.next()
        taken = []
        for j in range(k):
            if not c.take(2.0 + j):
                break
            taken.append(2.0 + j)
        accepted = 0 if not first_accepted(r) else min(len(taken), run)
        c.update(len(taken), accepted, 1e-5 * len(taken), verify(len(taken) + 1), signals=taken)
        if r >= rounds // 2:
            drafted, made, seconds = drafted + len(taken), made + accepted + 1, seconds + verify(len(taken) + 1)
    return drafted, made, seconds


def test_a_lookups_rounds_go_on_past_the_unsure_tokens_that_open_them():
    """A copying lookup's least sure token opens its round, and the copy's tokens grow surer as the round goes on
    (their support). Three rounds in five, the first token holds, then the next eleven: rounds draft on past the
    opening token. Capped where a round's first token's acceptance (0.6) sets the length, rounds drafted 6 tokens
    and made 2.09x of plain's rate; they draft 9.9 and make 2.42x."""
    c = DraftLength(DraftParams(draft_max=16, adaptive=True), SUPPORT_EDGES, SUPPORT_PRIOR, signal_grows=True)
    drafted, made, seconds = copy_rounds(c, 200, lambda r: r % 5 < 3, run=12)
    assert drafted / 100 > 8
    assert made * VERIFY_1 / seconds > 2.25


def test_a_token_is_worth_what_it_spares_at_the_answers_pace():
    """Each verified position costs 0.2 of a target step. Where drafting made tokens at several times plain's pace,
    an accepted token spares that much less, and a token reached and accepted one time in two no longer pays its
    place; where every draft failed, it does. Low-support tokens are at their priors (0.7, then 0.8)."""
    def proposed(accepted: bool) -> int:
        c = DraftLength(DraftParams(draft_max=16, adaptive=True), SUPPORT_EDGES, SUPPORT_PRIOR, signal_grows=True)
        for _ in range(40):  # copies of full support (signal 40), all accepted or none
            k = c.next()
            taken = [40.0] * k if all(c.take(40.0) for _ in range(k)) else []
            c.update(len(taken), len(taken) if accepted else 0, 1e-5 * len(taken), verify(len(taken) + 1),
                     signals=taken)
        c.next()
        return next((j for j in range(16) if not c.take(2.0 + j)), 16)

    assert proposed(accepted=True) <= 2
    assert proposed(accepted=False) >= 4


def test_a_launch_starts_from_how_the_last_launchs_tokens_fared():
    """A profile kept from the last launch (``Measured.profile``, through the app's JSON file) is adopted without
    its costs, which are the host's: the first answer measures them again, and drafts the near-ties the target
    accepted last time; started from the priors alone, it drafts few of them. (The starter at two threads in
    replays: the first answer of a launch 0.96x of plain where the next ones made 1.2-1.3x; 1.10x from a kept
    profile.)"""
    import json

    last = Measured()
    run_with_signals(DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES,
                                 ModelDrafter.SIGNAL_PRIOR, last), 200, near_tie_accepted=True)
    relaunched = Measured()
    assert relaunched.adopt(json.loads(json.dumps(last.profile()))) and not relaunched.fresh()

    def first_answer(measured: Measured) -> int:
        c = DraftLength(DraftParams(draft_max=8, adaptive=True), ModelDrafter.SIGNAL_EDGES,
                        ModelDrafter.SIGNAL_PRIOR, measured)
        return sum(run_with_signals(c, 10, near_tie_accepted=True))  # near-ties drafted in its first 10 rounds

    assert first_answer(relaunched) >= 1.5 * first_answer(Measured())


def test_rounds_the_drafter_ends_before_a_first_token_are_priced():
    """With --draft-p-min a draft model too unsure of a round's first token ends the round there, having paid a draft
    call for nothing. Such ends count where the plan learns how often a round's first token is sure (as the least
    sure bucket's tokens), so it prices them: here the draft (0.6 of a target step) ends so in nine rounds of ten,
    and drafting, though every token it drafts is accepted, loses. Unpriced, only the measured loss turned it off,
    and each probe that won turned it back on (0.96x of plain)."""
    c = DraftLength(ADAPTIVE, ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR)
    t_draft, tries, tokens, seconds = 0.006, 0, 0, 0.0
    for r in range(600):
        k = c.next()
        tries += k > 0
        if k and tries % 10:
            c.update(0, 0, t_draft, verify(1), n_evals=1, first_s=t_draft, n_first=1, unsure=True)
            made, spent = 1, t_draft + verify(1)
        else:
            signals, calls = propose(c, k, lambda j: 3.0)
            n = len(signals)
            c.update(n, n, t_draft * calls, verify(n + 1), signals=signals or None, n_evals=calls,
                     first_s=t_draft if calls else 0.0, n_first=2 if calls else 0)
            made, spent = n + 1, t_draft * calls + verify(n + 1)
        if r >= 300:
            tokens, seconds = tokens + made, seconds + spent
    assert tokens / seconds * verify(1) > 0.97


def test_a_probes_catching_up_is_not_taken_for_a_rounds_first_call():
    """What a round's first call costs beyond the others is first timed where the round catches up on little. On
    Gemma 3 270M by its own Q4_K_M, --draft-p-min ended the first drafts before their first token, so the first
    round of two calls was a probe catching up on 46 tokens: taken for the first call's cost, 138 ms made drafting
    look hopeless at any acceptance. Here the probe that first drafts two tokens catches up on 17 (48 ms more than a
    draft step); from then on the draft's tokens are all accepted, at 0.3 of a target step each: drafting turns on."""
    c = DraftLength(ADAPTIVE)
    t_draft, asked, since = 0.003, [], 1  # since: tokens made since the draft last drafted
    for r in range(300):
        k = c.next()
        asked.append(k)
        if k and (r < 10 or not any(asked[-20:-1]) and len(asked) < 60):  # (until it went off a while)
            c.update(0, 0, t_draft, verify(1), n_evals=1, first_s=t_draft, n_first=since)
        elif k:
            first_s = t_draft * since  # (catching up on the tokens made since it last drafted)
            c.update(k, k, first_s + t_draft * (k - 1), verify(k + 1), n_evals=k, first_s=first_s, n_first=since)
        else:
            c.update(0, 0, 0.0, verify(1))
        since = 2 if k else since + 1
    assert sum(k > 0 for k in asked[200:]) > 90


def test_costs_carried_from_a_slow_spell_are_checked_when_the_next_answer_starts():
    """Only rounds that draft time the draft, so costs timed on a slow spell that turned drafting off outlived it, and
    the answers after it started off (replayed on the starter: 1.00x of plain after a spell of draft costs at 1.5x,
    1.16-1.25x without the spell). An answer whose carried costs say drafting cannot pay even at full acceptance
    opens with a short draft, RECHECK_S after the draft was last timed; where it drafts more than UNSEEN faster
    than they say, the draft's costs are timed afresh, and here drafting pays again. Where they hold, the round
    changes nothing, and it counts as a timing: the next answers within RECHECK_S do not check."""
    def answer(measured: Measured, t_draft: float) -> list[int]:
        return feed(DraftLength(ADAPTIVE, measured=measured), 60, lambda k: k, t_draft=t_draft)

    spell = Measured()
    answer(spell, 0.011)  # (a draft token as costly as a target step: it cannot pay)
    spell.draft_timed_at -= DraftLength.RECHECK_S
    after = answer(spell, 0.003)
    assert after[0] == 2 and all(after[-20:])

    held = Measured()
    answer(held, 0.011)
    assert not any(answer(held, 0.011))  # (timed just now)
    held.draft_timed_at -= DraftLength.RECHECK_S
    assert answer(held, 0.011) == [2] + [0] * 59
    assert not any(answer(held, 0.011))


def test_an_answer_whose_carried_costs_and_acceptance_pay_drafts_at_length_from_its_first_round():
    """Two short measuring drafts opened every answer, also where what the last answers measured already said to
    draft at length: each paid a round's fixed costs (a verification, a first call) for 3 tokens where the plan's
    rounds make up to 13 (replayed on the starter's held-out answers: 92.3% of the ceiling with them, 93.5%
    without). They stay where the carried estimates say not to draft: there they are the cheapest look."""
    m = Measured()
    feed(DraftLength(ADAPTIVE, measured=m), 30, lambda k: k, t_draft=0.002)
    assert feed(DraftLength(ADAPTIVE, measured=m), 3, lambda k: k, t_draft=0.002)[0] == ADAPTIVE.draft_max


def test_drafting_comes_back_after_rounds_off_where_it_repays_catching_up_before_the_answer_ends():
    """A plan that says to draft again while drafting is off has learned nothing of the text, only the host's
    timings drifting, and drafting again first catches the draft model up on every token made meanwhile (in a real
    run the starter's first answer went back on after 91 rounds off, 20 tokens from its end: a round of 448 ms, 20
    plain steps). It does so only where what drafting saves a token repays that before the answer runs out of room."""
    import copy

    m = Measured()
    for _ in range(5):
        m.t_draft.add(0.006)
        m.first_extra.add(0.001)
        m.between.add(0.0)
        m.t_catch_up.add(0.006)
        m.verify.add(1, 0.008)
        m.verify.add(9, 0.026)
    m.accepted = m.judged = 50.0
    m.calls_model, m.draft_timed_at = True, time.monotonic()
    c = DraftLength(ADAPTIVE, measured=m)
    for i in range(60):  # a plain step at 8 ms: drafting cannot pay; then the host slows to 14 ms a step
        if copy.deepcopy(c).next(1000):
            break
        assert c.next(1000) == 0
        c.update(0, 0, 0.0, 0.008 if i < 20 else 0.014)
    assert 20 < i < 60  # (on again by the plan alone, the answer having room)
    assert copy.deepcopy(c).next(3) == 0


def test_a_launch_that_timed_long_batches_tells_the_next_whether_a_long_look_could_pay():
    """Gemma 3 270M F16 drafted by its own Q4_K_M, as measured (2026-11-29): a plain step 50 ms, each more position
    of a verification batch 47 ms (its output layer of 262,144 rows is most of a position's work), a draft token
    27 ms. Short batches alone cannot say what a long one's positions cost, so each launch's first answer looked
    twice at 8 tokens (and probed, catching the draft up on the tokens made since: 0.85-0.88x of plain). What a long
    batch's positions weighed against a plain step is kept with the profile (``Measured.long_batch``) and, where
    the plain step is about as fast (this host, not another or a GPU), decides it without a look."""
    import json

    def answer(measured: Measured) -> list[int]:
        c, asked = DraftLength(ADAPTIVE, measured=measured), []
        for _ in range(128):
            k = c.next()
            asked.append(k)
            c.update(k, k, 0.027 * k + (0.01 if k else 0.0), 0.050 + 0.047 * k, n_evals=k,
                     first_s=0.037 if k else 0.0, n_first=1 if k else 0)
        return asked

    first = Measured()
    assert max(answer(first)) == 8  # guessed: it looks
    share, plain = first.long_batch()
    assert abs(share - 0.94) < 0.01 and plain == 0.050
    relaunched = Measured()
    assert relaunched.adopt(json.loads(json.dumps(first.profile())))
    asked = answer(relaunched)
    assert max(asked) <= 2 and sum(asked) <= 6  # measuring rounds (and a probe soon after: the costs unsettled)
    elsewhere = Measured()
    elsewhere.kept_long_batch = (share, plain / 10)  # kept at another speed (a GPU's): guessed again
    assert max(answer(elsewhere)) == 8


# --- the parts alone ---------------------------------------------------------------------------------------------
def settled_prices(t_draft: float = 0.002, probe_loss: float | None = None):
    """Prices over costs timed enough to be settled: a draft token four times, two batch sizes three times."""
    m = Measured()
    for _ in range(Probes.SETTLED + 1):  # (an Estimate's first sample only stands in)
        m.t_draft.add(t_draft)
    for _ in range(4):
        m.verify.add(1, verify(1))
        m.verify.add(3, verify(3))
    if probe_loss is not None:
        for _ in range(2):
            m.probe_loss.add(probe_loss)
    return Prices(m, 0, 8)


def rounds_to_probe(probes: Probes, calls_model: bool = True, could_pay=lambda: True, was_probe: bool = False,
                    limit: int = 10_000) -> int | None:
    """Rounds off until the probes say to probe (the first after a probe if ``was_probe``); None: none in ``limit``."""
    for n in range(1, limit + 1):
        if probes.off(was_probe and n == 1, calls_model, could_pay, 0.08):
            return n
    return None


def test_probes_alone_double_their_wait_after_each_failed_probe_up_to_the_costly_rate():
    probes = Probes(settled_prices())
    gaps = [rounds_to_probe(probes, was_probe=i > 0) for i in range(6)]
    assert gaps == [Probes.EVERY, 2 * Probes.EVERY, 4 * Probes.EVERY, Probes.EVERY_WHEN_COSTLY,
                    Probes.EVERY_WHEN_COSTLY, Probes.EVERY_WHEN_COSTLY]
    probes.on()  # a probe turned drafting back on: when it goes off again, the wait is the shortest again
    assert rounds_to_probe(probes) == Probes.EVERY


def test_probes_alone_are_priced_soon_while_unsettled_and_never_when_hopeless():
    loss = 0.05  # each probe lost 50 ms against a 10 ms plain step: 250 rounds off keep it under 2%
    assert rounds_to_probe(Probes(settled_prices(probe_loss=loss))) == math.ceil(loss / (Probes.BUDGET * verify(1)))
    assert rounds_to_probe(Probes(Prices(Measured(), 0, 8))) == Probes.EVERY_UNSETTLED
    assert rounds_to_probe(Probes(settled_prices()), could_pay=lambda: False) is None
    # a model-free drafter costs no catch-up: never hopeless, and its failed probes do not lengthen the wait
    probes = Probes(settled_prices())
    assert [rounds_to_probe(probes, calls_model=False, could_pay=lambda: False, was_probe=i > 0)
            for i in range(3)] == [Probes.EVERY] * 3


def test_while_off_the_probes_say_which_rounds_need_no_plan():
    probes = Probes(settled_prices())
    assert not probes.quiet(was_probe=False)  # on: every round is planned
    probes.off(False, True, lambda: True, 0.08)
    quiet = 0
    while probes.quiet(was_probe=False):
        quiet += 1
    assert quiet == Probes.REPLAN_OFF and probes.off_rounds == Probes.REPLAN_OFF + 1


def test_the_tallies_alone_lose_only_to_unseen_costs_and_pace_an_answer():
    slow = seen = DraftedRounds()
    for _ in range(12):  # (decayed: six rounds' worth)
        slow = slow.add(2, 0.05, modelled=0.03)  # 40 tokens/s against a plain step's 100, 67% over the costs
        seen = seen.add(2, 0.05, modelled=0.05)  # as slow, but the costs said so: rejections the plan sees
    assert slow.lose(VERIFY_1, 0.1) and not seen.lose(VERIFY_1, 0.1)
    assert not DraftedRounds().add(2, 0.05, 0.03).lose(VERIFY_1, 0.1)  # one round says little
    pace = Pace().add(5, 0.02)
    assert pace.token_time(VERIFY_1) == 0.004 and Pace().token_time(VERIFY_1) == VERIFY_1
    assert Pace().add(1, 0.05).token_time(VERIFY_1) == VERIFY_1  # never more than a plain step
