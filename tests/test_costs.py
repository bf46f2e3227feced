"""The cost model behind bench's ceiling: arithmetic on known costs, and real timings on tiny models."""
import pytest

from app.engine import Costs
from app.engine.costs import batch_sizes
from app.engine.speedup import best_draft_length, round_shape
from app.prompts import plain_tokens


def test_verify_time_is_linear_between_and_beyond_measured_batches():
    c = Costs({1: 0.010, 2: 0.012, 4: 0.016})
    assert c.verify(1) == 0.010 and c.verify(4) == 0.016
    assert c.verify(3) == pytest.approx(0.014)
    assert c.verify(6) == pytest.approx(0.020)  # the last segment extended
    assert Costs({1: 0.010}).verify(3) == pytest.approx(0.030)  # one size known: proportional


def test_ceiling_takes_the_best_draft_length():
    c = Costs({1: 0.010, 2: 0.012, 4: 0.016}, draft_s=(0.004, 0.006))
    assert c.draft(0) == 0 and c.draft(1) == 0.006 and c.draft(3) == pytest.approx(0.014)
    # k=1: 2 tokens in 0.006+0.012; k=2: 3 in 0.010+0.014; k=3: 4 in 0.014+0.016 -> 4 * 0.010 / 0.030
    assert c.ceiling(3) == (pytest.approx(4 / 3), 3)
    assert c.ceiling(1) == (pytest.approx(0.02 / 0.018), 1)
    # drafting dearer than it saves: no draft length beats plain decoding
    assert Costs({1: 0.010, 2: 0.020}, draft_s=(0.010, 0.015)).ceiling(4) == (1.0, 0)
    # batches timed faster than one step (a busy moment during the step's timing): the ceiling stays within what
    # k + 1 tokens a round can give (bench's CI run of 256723b printed more than 9x for --draft-max 8)
    noisy = Costs({1: 0.010, 2: 0.006, 4: 0.005, 8: 0.005, 9: 0.005}, draft_s=(0.0001, 0.0001))
    assert noisy.ceiling(8) == (pytest.approx(9 * 0.010 / (0.0001 * 8 + 0.010)), 8)


def test_a_round_that_ends_at_unsure_tokens():
    # every token sure: k draft calls, k verified, the geometric model's tokens (1 - a^(k+1)) / (1 - a)
    for k, a, tokens in ((1, 0.5, 1.5), (4, 0.9, (1 - 0.9 ** 5) / 0.1), (12, 1.0, 13.0)):
        assert round_shape(k, a) == (pytest.approx(tokens), pytest.approx(k), pytest.approx(k))
    # 3 at most, the first sure half the time and each after a sure one always, all accepted: a round drafts 1 or
    # 3 (the unsure first stops it), verifies 0 or 3, commits 1 or 4
    assert round_shape(3, 1.0, 0.5, 1.0) == (pytest.approx(2.5), pytest.approx(2.0), pytest.approx(1.5))
    # each after a sure one sure half the time: 1 + .5 + .25 + .125 tokens; calls 1 + .5 + .25; verified .875
    assert round_shape(3, 1.0, 0.5) == (pytest.approx(1.875), pytest.approx(1.75), pytest.approx(0.875))
    assert round_shape(0, 0.9) == (1.0, 0.0, 0.0)


def test_where_the_rate_hardly_changes_with_the_length_the_longest_is_taken():
    """The starter's costs (a 24 ms target step, 4.5 ms more per verified position, 12.5 ms a draft token) and a
    sure token rejected one time in 70: from 6 to 12 tokens a round the rate changes by under 2%, so noise in the
    estimates picked the cap among them. Within ``flat`` of the best, the longest is taken, with its own rate."""
    def verify(n):
        return 0.024 + 0.0045 * (n - 1)

    def draft(k):
        return 0.0125 * k + 0.005 * (k > 0)

    best_k, best_rate = best_draft_length(verify, draft, range(1, 13), acceptance=1 - 1 / 70)
    k, rate = best_draft_length(verify, draft, range(1, 13), acceptance=1 - 1 / 70, flat=0.02)
    assert best_k < k == 12 and best_rate * 0.98 <= rate < best_rate
    assert best_draft_length(verify, draft, range(1, 13), acceptance=0.9, flat=0.02)[0] < 12  # (not where it does)
    assert best_draft_length(verify, draft, range(1, 13), acceptance=0.5, flat=0.02)[0] == 0  # nor where none pays
    just_under = best_rate * verify(1) * 0.999 - 1  # a margin the best length passes and the longer ones do not
    assert best_draft_length(verify, draft, range(1, 13), 1 - 1 / 70, just_under, flat=0.02)[0] == best_k


def test_the_ceiling_says_what_the_pair_can_reach_and_why():
    pays = Costs({1: 0.010, 2: 0.012, 4: 0.016}, draft_s=(0.004, 0.006)).ceiling_of(3)
    assert pays.pays and pays.draft_length == 3 and pays.speedup == pytest.approx(4 / 3)
    assert pays.draft_cost == pytest.approx(0.4) and pays.position_cost == pytest.approx(0.2)
    assert pays.explain() == ("This pair can reach at most 1.33x here (3 draft tokens a round, every one accepted): a "
                              "draft token costs 0.40 of a target step and each token verified in a batch 0.20.")
    # a draft costing 0.8 of a target step (Gemma 3 270M by its own Q4_K_M): it cannot pay, and says what could
    cannot = Costs({1: 0.013, 2: 0.023, 9: 0.046}, draft_s=(0.0105, 0.015)).ceiling_of(8)
    assert not cannot.pays and cannot.speedup == 1.0 and cannot.draft_cost == pytest.approx(0.0105 / 0.013)
    assert cannot.position_cost == pytest.approx((0.046 - 0.013) / 8 / 0.013)
    text = cannot.explain(("n-gram lookup", "MTP"))
    assert text.startswith("Drafting cannot pay with this pair here, even with every draft token accepted: a draft "
                           "token costs 0.81 of a target step")
    assert text.endswith("Try a smaller draft model, n-gram lookup or MTP.")
    assert cannot.explain().endswith("Try a smaller draft model.")


def test_mean_of_samples():
    a = Costs({1: 0.010, 2: 0.014}, (0.004, 0.006))
    b = Costs({1: 0.020, 2: 0.018}, (0.006, 0.010))
    m = Costs.mean([a, b])
    assert m.verify_s == {1: pytest.approx(0.015), 2: pytest.approx(0.016)}
    assert m.draft_s == (pytest.approx(0.005), pytest.approx(0.008))


def test_batch_sizes_cover_every_round_shape():
    assert batch_sizes(0) == [1]
    assert batch_sizes(8) == [1, 2, 4, 8, 9]
    assert batch_sizes(12) == [1, 2, 4, 8, 13]


def test_measured_on_real_models_and_caches_left_empty(tiny_engine):
    from app.engine import GenerationParams, SamplingParams

    costs = tiny_engine.measure_costs(6)
    assert sorted(costs.verify_s) == [1, 2, 4, 7] and all(t > 0 for t in costs.verify_s.values())
    assert costs.draft_s is not None and all(t > 0 for t in costs.draft_s)
    for loaded in (tiny_engine.target, tiny_engine.draft):
        assert loaded.ctx.tokens == [] and loaded.ctx.memory_pos_max() == -1
    assert tiny_engine.measure_costs(2, "ngram").draft_s is None
    # the engine generates normally afterwards
    ids = plain_tokens(tiny_engine.model, "the cat")
    done = list(tiny_engine.generate(ids, GenerationParams(max_tokens=8, sampling=SamplingParams(temperature=0))))[-1]
    assert done.stats.n_tokens > 0


def test_the_timings_include_the_picks_the_loop_makes_from_each_row(tiny_engine, monkeypatch):
    """The loop reads every row of logits it asks for and picks from it; on a GPU that is a good part of a position's
    cost (a 262,144-logit row: 0.1 of an H200's plain step), so the ceiling prices it. A pick slowed by 20 ms shows
    in each timing once per row: 9 rows in a 9-token batch, one in a draft call."""
    import time

    from app.engine import costs

    slow = 0.02
    for name in ("greedy_token", "_draft_pick"):
        real = getattr(costs, name)
        monkeypatch.setattr(costs, name, lambda row, real=real: (time.sleep(slow), real(row))[1])
    c = tiny_engine.measure_costs(8)
    assert c.verify_s[1] >= slow and c.verify_s[9] >= 9 * slow
    assert c.draft_s[0] >= slow and c.draft_s[1] >= slow
