import numpy as np
import pytest

from app.engine import EngineError, SamplingParams
from app.engine.sampling import accept_or_resample, distribution


def test_transform_keeps_top_k_then_top_p_then_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05]))
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.4, 0.3, 0.15, 0.1, 0.05])
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    assert np.count_nonzero(p) == 3 and np.isclose(p.sum(), 1.0)
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0))
    assert np.allclose(p[:2], [0.4 / 0.7, 0.3 / 0.7]) and p[2:].sum() == 0
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert np.count_nonzero(p) == 3  # 0.15 >= 0.3 * 0.4, 0.1 is not
    hot = distribution(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0))
    assert hot[4] > 0.05 and hot[0] < 0.4  # a higher temperature flattens


def test_speculative_step_reproduces_target_distribution_exactly():
    """P(output = x) = q(x) min(1, p(x)/q(x)) + P(reject) * residual(x) must equal p(x): check the algebra by
    enumerating every draft token and simulating the accept/reject coin with many draws."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6))
    counts = np.zeros(6)
    n = 200_000
    coin = np.random.default_rng(1)
    drafts = coin.choice(6, size=n, p=q)
    for x in drafts[:n]:
        _, tok = accept_or_resample(p, q, int(x), coin)
        counts[tok] += 1
    freq = counts / n
    # 5 sigma of a binomial proportion
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-4), (freq, p)


def test_deterministic_proposal_is_accepted_with_target_probability():
    p = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(2)
    results = [accept_or_resample(p, None, 1, rng) for _ in range(50_000)]
    accepted = np.mean([ok for ok, _ in results])
    assert abs(accepted - 0.3) < 0.01
    out = np.bincount([t for _, t in results], minlength=3) / len(results)
    assert np.allclose(out, p, atol=0.01)


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
        assert np.allclose(distribution(logits, sp), reference_distribution(logits, sp), atol=1e-9)
