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
