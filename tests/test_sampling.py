import numpy as np
import pytest

from app.engine import EngineError, SamplingParams
from app.engine.sampling import Dist, Noise, distribution, sample


def dense(logits, sp) -> np.ndarray:
    return distribution(logits, sp).dense(len(logits))


def test_transform_keeps_top_k_then_top_p_then_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05]))
    p = dense(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.4, 0.3, 0.15, 0.1, 0.05])
    p = dense(logits, SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    assert np.count_nonzero(p) == 3 and np.isclose(p.sum(), 1.0)
    p = dense(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0))
    assert np.allclose(p[:2], [0.4 / 0.7, 0.3 / 0.7]) and p[2:].sum() == 0
    p = dense(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert np.count_nonzero(p) == 3  # 0.15 >= 0.3 * 0.4, 0.1 is not
    hot = dense(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0))
    assert hot[4] > 0.05 and hot[0] < 0.4  # a higher temperature flattens


def _within_5_sigma(counts, p):
    n = counts.sum()
    freq = counts / n
    return np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-4), (freq, p)


def test_speculative_step_reproduces_target_distribution_exactly():
    """Every committed token is the target's own draw at its position, whether the draft's token (drawn from q with
    the same numbers) was accepted or not: the output has p's distribution, even where the supports differ."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6))
    q[4] = 0.0  # the draft never proposes token 4 ...
    q /= q.sum()
    p[5] = 0.0  # ... and proposes token 5, which the target never takes: supports differ
    p /= p.sum()
    P, Q = Dist.from_dense(p), Dist.from_dense(q)
    noise = Noise(7)
    counts, accepted, n = np.zeros(6), 0, 100_000
    for i in range(n):
        noise.at = i
        tok = sample(P, noise)  # what the loop commits: the target's draw, the draft's token accepted if it is that
        counts[tok] += 1
        accepted += tok == sample(Q, noise)
    ok, detail = _within_5_sigma(counts, p)
    assert ok, detail
    # drawn from the same numbers, q's token is p's about as often as any coupling allows: the Gumbel coupling's
    # bound is (1 - TV) / (1 + TV) (the best, 1 - TV)
    tv = 0.5 * np.abs(p - q).sum()
    assert accepted / n > (1 - tv) / (1 + tv) - 0.01 and accepted / n < 1 - tv + 0.01


def test_deterministic_proposal_is_accepted_with_target_probability():
    p = np.array([0.5, 0.3, 0.2])
    noise = Noise(2)
    results = []
    for i in range(50_000):
        noise.at = i
        tok = sample(Dist.from_dense(p), noise)
        results.append((tok == 1, tok))
    accepted = np.mean([ok for ok, _ in results])
    assert abs(accepted - 0.3) < 0.01
    out = np.bincount([t for _, t in results], minlength=3) / len(results)
    assert np.allclose(out, p, atol=0.01)


def test_a_draw_depends_on_the_seed_and_the_position_only():
    """The same (seed, position) gives the same token whatever else was drawn; another seed or position is an
    independent draw (the uniforms are spread evenly), and an unseeded Noise picks a seed of its own."""
    d = Dist.from_dense(np.full(50, 0.02))
    a, b = Noise(3), Noise(3)
    a.at = b.at = 40
    sample(d, a, 5)  # (another position drawn first changes nothing)
    assert sample(d, a) == sample(d, b) and sample(d, a, 2) == sample(d, b, 2)
    draws = [sample(d, Noise(3), i) for i in range(2000)]
    assert len(set(draws)) == 50 and [sample(d, Noise(4), i) for i in range(2000)] != draws
    u = Noise(5).uniforms(0, np.arange(200_000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 19_000
    assert Noise().seed != Noise().seed


@pytest.mark.parametrize("bad", [
    dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
    dict(min_p=1.0), dict(min_p=-0.1),
])
def test_invalid_sampling_settings_are_refused(bad):
    with pytest.raises(EngineError):
        SamplingParams(**bad).validate()


def reference_distribution(logits, sp):
    """llama.cpp's chain written the slow, obvious way: sort everything, cut, renormalise."""
    x = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-x, kind="stable")
    if 0 < sp.top_k < len(x):
        order = order[: sp.top_k]
    p = np.exp(x[order] - x[order[0]])
    p /= p.sum()
    keep = len(order)
    if sp.top_p < 1.0:
        keep = min(keep, int(np.argmax(np.cumsum(p) >= sp.top_p)) + 1)
    if sp.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(p >= sp.min_p * p[0])))
    out = np.zeros(len(x))
    t = np.exp((x[order[:keep]] - x[order[0]]) / sp.temperature)
    out[order[:keep]] = t / t.sum()
    return out


@pytest.mark.parametrize("sp", [
    SamplingParams(0.8, 40, 0.95, 0.05), SamplingParams(0.8, 0, 0.95, 0.05), SamplingParams(1.0, 0, 1.0, 0.0),
    SamplingParams(1.3, 0, 0.9, 0.0), SamplingParams(0.5, 0, 1.0, 0.1), SamplingParams(2.0, 7, 1.0, 0.0),
    SamplingParams(1.0, 1000, 0.5, 0.2),
])
def test_fast_transform_matches_the_reference(sp):
    rng = np.random.default_rng(5)
    for scale in (0.5, 3.0, 8.0):
        logits = (rng.standard_normal(5000) * scale).astype(np.float32)
        assert np.allclose(dense(logits, sp), reference_distribution(logits, sp), atol=1e-9)


def test_a_sparse_draw_picks_the_token_a_dense_one_would():
    """The draw over the kept tokens is the one over the whole vocabulary-sized array: each token's number is keyed
    on its id, and a zero probability never wins."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        logits = (rng.standard_normal(3000) * 3).astype(np.float32)
        d = distribution(logits, SamplingParams(0.8, 40, 0.95, 0.05))
        noise = Noise(int(rng.integers(1 << 30)))
        with np.errstate(divide="ignore"):
            assert sample(d, noise) == sample(Dist(np.arange(3000), d.dense(3000)), noise)


def test_top_k_is_exact_when_few_logits_are_near_the_top():
    logits = np.full(1000, -100.0, dtype=np.float32)
    logits[[3, 500, 999]] = [5.0, 4.0, 3.0]  # only three within reach of the top: the rest tie far below
    logits[[10, 20]] = [-50.0, -60.0]
    d = distribution(logits, SamplingParams(1.0, 5, 1.0, 0.0))
    assert list(d.idx) == [3, 10, 20, 500, 999]


@pytest.mark.parametrize("order", ["random", "ascending", "descending", "ties"])
def test_top_k_without_a_full_partition_is_the_top_k(order):
    from app.engine.sampling import _Blocks

    rng = np.random.default_rng(11)
    for n, k in ((1000, 40), (262_144, 40), (151_936, 1), (5000, 300)):
        x = (rng.standard_normal(n) * 4).astype(np.float32)
        if order == "ascending":
            x.sort()
        elif order == "descending":
            x[::-1].sort()
        elif order == "ties":
            x = np.round(x).astype(np.float32)  # many equal logits around the k-th
        got = _Blocks(x).top_k(k)
        assert len(got) == k == len(set(got.tolist()))
        kth = np.sort(x)[n - k]
        assert x[got].min() >= kth and np.count_nonzero(x > kth) <= k  # exactly a top-k set (ties: any of them)


def test_greedy_draft_step_is_llama_cpps_top_10_softmax_without_the_vocabulary():
    """A greedy draft token's confidence is its probability among the 10 most likely tokens, as llama.cpp's draft
    sampler (top-k 10) has it, decided without a softmax over the vocabulary, also where p_min is within 3% of it;
    the token is np.argmax's (the first of tied maxima) and the gap the exact top-1 minus top-2 logit."""
    from app.engine.sampling import draft_pick

    rng = np.random.default_rng(5)
    decided = {True: 0, False: 0}
    for trial in range(600):
        n = int(rng.choice([3, 50, 5000, 151_936, 262_144]))
        x = (rng.standard_normal(n) * rng.uniform(0.3, 6)).astype(np.float32)
        if trial % 5 == 0:
            x = np.round(x)  # ties, the top's included
        if trial % 7 == 0:
            x[np.argmax(x)] += rng.uniform(0, 25)
        top10 = np.sort(x.astype(np.float64))[::-1][:10]
        p_top = 1.0 / np.exp(top10 - top10[0]).sum()
        p_min = float(rng.choice([0.0, 0.3, 0.5, 0.9, min(0.999, p_top * rng.uniform(0.97, 1.03))]))
        before = x.copy()
        tok, confident, gap = draft_pick(x, p_min)
        assert np.array_equal(x, before)  # llama.cpp's buffer is left as it was
        assert tok == int(np.argmax(x))
        assert confident == (p_top >= p_min or p_min == 0.0), (p_top, p_min)
        assert gap == (top10[0] - top10[1] if n > 1 else np.inf)
        decided[confident] += 1
    assert min(decided.values()) > 100  # both answers were exercised
