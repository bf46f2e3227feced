"""Speculative sampling must sample from the target's exact distribution.

Thousands of seeded generations with speculation on and off; the empirical distributions of the sampled tokens
(per position, and jointly for two positions) are compared with a chi-square two-sample test at p = 1e-4.
The same test is first shown to reject a real difference (the draft's own distribution), so it has teeth.
"""
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams
from app.engine.drafters.ngram import NgramParams

N = 2500
SP = SamplingParams(temperature=1.3, top_k=6, top_p=1.0, min_p=0.0)


def chi2_threshold(df: int, z: float = 3.72) -> float:
    """Upper quantile of chi-square(df) (Wilson-Hilferty), z = 3.72 is p = 1e-4."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def same_distribution(a: Counter, b: Counter) -> tuple[bool, float, float]:
    """Two-sample chi-square; categories with few observations are pooled so expected counts stay >= 5."""
    na, nb = sum(a.values()), sum(b.values())
    cats = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    rows, pool = [], [0, 0]
    for c in cats:
        if a[c] + b[c] >= 20:
            rows.append((a[c], b[c]))
        else:
            pool[0] += a[c]
            pool[1] += b[c]
    if sum(pool):
        rows.append(tuple(pool))
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ex, ey = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    df = max(len(rows) - 1, 1)
    return stat < chi2_threshold(df), stat, chi2_threshold(df)


def samples(engine: Engine, ids, drafter: str, n_tokens: int = 3, seed0: int = 0, sp: SamplingParams = SP,
            **draft):
    params = lambda s: GenerationParams(  # noqa: E731
        max_tokens=n_tokens, sampling=replace(sp, seed=s),
        draft=DraftParams(**draft))
    out, drafted = [], 0
    for s in range(seed0, seed0 + N):
        done = list(engine.generate(ids, params(s), drafter))[-1]
        assert isinstance(done, Done) and len(done.token_ids) == n_tokens
        out.append(tuple(done.token_ids))
        drafted += done.stats.n_drafted
    return out, drafted


def compare(plain, spec):
    for pos in range(len(plain[0])):
        ok, stat, thr = same_distribution(Counter(t[pos] for t in plain), Counter(t[pos] for t in spec))
        assert ok, f"position {pos}: chi2 {stat:.1f} > {thr:.1f}"
    ok, stat, thr = same_distribution(Counter(t[1:3] for t in plain), Counter(t[1:3] for t in spec))
    assert ok, f"joint (1, 2): chi2 {stat:.1f} > {thr:.1f}"


@pytest.fixture(scope="module")
def plain_samples(tiny_engine):
    return samples(tiny_engine, [1, 300, 301, 302], "none", seed0=10_000)[0]


def test_the_test_detects_a_different_distribution(models, plain_samples):
    draft_as_target = Engine(ModelSettings(models["draft"], n_ctx=128))
    wrong, _ = samples(draft_as_target, [1, 300, 301, 302], "none")
    draft_as_target.close()
    with pytest.raises(AssertionError):
        compare(plain_samples, wrong)


def test_model_drafter_samples_the_target_distribution(tiny_engine, plain_samples):
    spec, drafted = samples(tiny_engine, [1, 300, 301, 302], "model", draft_max=3, draft_p_min=0.0)
    assert drafted > N  # speculation really ran (and was partly rejected: see the acceptance test below)
    compare(plain_samples, spec)


def test_a_logit_bias_is_sampled_exactly_with_speculation(tiny_engine, plain_samples):
    """The bias moves the target's distribution (its most sampled first token banned, another raised); drafts from
    the unbiased draft model are verified against the biased one, so speculation samples exactly that."""
    ids = [1, 300, 301, 302]
    top, second = (t for t, _ in Counter(t[0] for t in plain_samples).most_common(2))
    sp = replace(SP, logit_bias=((top, float("-inf")), (second, 1.0)))
    plain, _ = samples(tiny_engine, ids, "none", seed0=30_000, sp=sp)
    spec, drafted = samples(tiny_engine, ids, "model", sp=sp, draft_max=3, draft_p_min=0.0)
    assert drafted > N and all(t[0] != top for t in plain + spec)
    compare(plain, spec)


def test_ngram_drafter_samples_the_target_distribution(tiny_engine):
    """Deterministic proposals (q one-hot). A prompt holding every token and 1-gram lookup make the n-gram
    drafter (ngram-simple, as llama.cpp's, with 1-grams) propose every round, whatever the random model samples."""
    from app.engine.drafters import NgramParams
    from app.engine.drafters.ngram import NgramSimple

    ids = [1] + list(range(3, 320))
    plain, _ = samples(tiny_engine, ids, "none", seed0=20_000)
    spec, drafted = samples(tiny_engine, ids, NgramSimple(NgramParams(simple_size_n=1, simple_size_m=3)),
                             draft_max=3)
    assert drafted > N
    compare(plain, spec)


def test_a_2026_sized_vocabulary_is_sampled_exactly_with_the_default_transform(tmp_path_factory):
    """151,936 tokens (Qwen's vocabulary size) and the default top-k 40 / top-p 0.95 / min-p 0.05: the candidates
    come from column maxima and the distributions are sparse, and the output must still follow the target's."""
    from support.tiny_gguf import write_model

    from app.engine.llama import quantize

    d = tmp_path_factory.mktemp("vocab-151936")
    extra = 151_936 - 288  # tiny_gguf's fixed tokens: 3 specials, 256 bytes, 2 chat markers, 27 words
    # Q8_0, as llama.cpp's quantizer writes it: the output matrix is nearly all of each step's work at this size, and
    # read in 8 bits the test takes half the time it took in F32.
    target, draft = d / "t.gguf", d / "d.gguf"
    quantize(write_model(d / "t-f32.gguf", seed=1, extra_words=extra, n_embd=32, n_layer=1), target, "Q8_0")
    quantize(write_model(d / "d-f32.gguf", seed=2, base_seed=1, noise=0.3, extra_words=extra, n_embd=32, n_layer=1),
             draft, "Q8_0")
    sp = SamplingParams(temperature=1.0)  # the defaults otherwise
    engine = Engine(ModelSettings(target, n_ctx=128), ModelSettings(draft, n_ctx=128))
    try:
        assert engine.model.n_vocab == 151_936
        plain, _ = samples(engine, [1, 300, 301, 302], "none", seed0=30_000, sp=sp)
        spec, drafted = samples(engine, [1, 300, 301, 302], "model", sp=sp, draft_max=3, draft_p_min=0.0)
    finally:
        engine.close()
    assert drafted > N
    assert len({t[0] for t in plain}) > 10  # many candidates really compete
    compare(plain, spec)
    draft_as_target = Engine(ModelSettings(draft, n_ctx=128))
    try:
        wrong, _ = samples(draft_as_target, [1, 300, 301, 302], "none", seed0=30_000, sp=sp)
    finally:
        draft_as_target.close()
    with pytest.raises(AssertionError):  # and at this size the check still tells the draft's distribution apart
        compare(plain, wrong)


def test_sampled_speculation_accepts_some_and_rejects_some(tiny_engine):
    params = GenerationParams(max_tokens=200, sampling=SamplingParams(temperature=1.0, seed=3),
                              draft=DraftParams(draft_max=4, draft_p_min=0.0))
    done = list(tiny_engine.generate([1, 300, 301], params, "model"))[-1]
    assert 0.05 < done.stats.acceptance_rate < 0.95


@pytest.mark.parametrize("drafter, draft", [
    ("model", dict(draft_max=4, draft_p_min=0.0)),
    ("model", dict(draft_max=12, draft_p_min=0.0, adaptive=True)),
    ("ngram-simple", dict(draft_max=6, ngram=NgramParams(simple_size_n=2, simple_size_m=6))),
])
def test_a_seed_gives_the_same_sampled_answer_with_speculation_on_and_off(tiny_engine, close_engine, drafter, draft):
    """Each token is the target's draw at its position, made from (seed, position, token) alone: drafting changes
    how fast the answer comes, never which answer, at any temperature and however many drafts were rejected."""
    drafted = rejected = 0
    prompt = [1, 300, 301, 302, 303, 300, 301, 302, 303, 300, 301]  # (a pattern for the n-gram lookup to draft)
    for engine in (tiny_engine, close_engine):
        for seed in range(12):
            sp = SamplingParams(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0, seed=seed)
            off = list(engine.generate(prompt, GenerationParams(
                max_tokens=40, sampling=sp, draft=DraftParams(draft_max=0)), "none"))[-1]
            engine.forget_costs()  # (adaptive: its first rounds measure with short drafts, whatever the host's
            # speed; with costs an earlier answer timed on a busy host it may draft nothing at all: CI, 2026-11-27)
            on = list(engine.generate(prompt, GenerationParams(
                max_tokens=40, sampling=sp, draft=DraftParams(**draft)), drafter))[-1]
            assert on.token_ids == off.token_ids, (seed, drafter)
            drafted += on.stats.n_drafted
            rejected += on.stats.n_drafted - on.stats.n_accepted
    assert drafted > 0 and rejected > 0  # speculation ran, and the target turned some drafts down


def test_same_seed_same_output(tiny_engine):
    params = GenerationParams(max_tokens=50, sampling=SamplingParams(temperature=0.9, seed=42),
                              draft=DraftParams(draft_max=4, draft_p_min=0.0))
    a = list(tiny_engine.generate([1, 300, 301], params, "model"))[-1]
    b = list(tiny_engine.generate([1, 300, 301], params, "model"))[-1]
    assert a.token_ids == b.token_ids
