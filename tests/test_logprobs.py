"""Token probabilities (app/engine/logprobs.py): the target's own, at the position that chose each committed token,
the same with speculation on as off, and never a change to which tokens are chosen."""
import numpy as np
import pytest

from app.engine import DraftParams, EngineError, GenerationParams, SamplingParams, TextDelta
from app.engine.logprobs import MAX_TOP, from_dist, from_logits
from app.engine.sampling import distribution

PROMPTS = [[1, 300, 301, 302, 303], [1, 270, 280, 290, 270, 280]]
# Verification batches and single steps may round the last bits of a logit differently on builds that are not batch
# invariant (GPU kernels, llamafile): a log-probability of the same token then moves by ~1e-6, far below 1e-3.
TOLERANCE = 1e-3


def run(engine, ids, drafter, **kw):
    draft = DraftParams(**{k: kw.pop(k) for k in list(kw) if k.startswith("draft")})
    events = list(engine.generate(ids, GenerationParams(draft=draft, **kw), drafter))
    return events[-1], [e for e in events if isinstance(e, TextDelta)]


def test_log_softmax_and_its_top_entries_match_a_plain_computation():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 1000).astype(np.float32)
    logits[[7, 8]] = logits.max() + 1  # a tie at the top: the lower id first
    exact = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    p = from_logits(logits, 42, 5)  # (its exponentials are float32's: ~1e-8 off float64's)
    assert p.logprob == pytest.approx(exact[42], abs=1e-6)
    assert [t for t, _ in p.top] == [7, 8] + list(np.argsort(-exact, kind="stable")[2:5])
    assert [lp for _, lp in p.top] == pytest.approx(sorted(exact, reverse=True)[:5], abs=1e-6)
    assert from_logits(logits, 42, 0).top == ()


def test_post_sampling_probabilities_are_the_chains_distribution():
    logits = np.array([0.0, 3.0, 2.0, 1.0, -5.0], dtype=np.float32)
    dist = distribution(logits, SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    p = from_dist(dist, 2, 10)
    assert [t for t, _ in p.top] == [1, 2, 3]  # top-k cut the rest: they are not listed (probability 0)
    assert sum(np.exp(lp) for _, lp in p.top) == pytest.approx(1.0)
    assert p.logprob == pytest.approx(np.log(dist.prob(2)))


@pytest.mark.parametrize("ids", PROMPTS)
def test_greedy_logprobs_are_the_same_with_speculation_on_and_off(tiny_engine, ids):
    plain, _ = run(tiny_engine, ids, "none", max_tokens=60, logprobs=5)
    spec, deltas = run(tiny_engine, ids, "model", max_tokens=60, logprobs=5, draft_max=6, draft_p_min=0.0)
    assert 0 < spec.stats.n_accepted < spec.stats.n_drafted  # drafts both accepted and rejected
    assert spec.token_ids == plain.token_ids
    assert len(spec.logprobs) == len(plain.logprobs) == len(spec.token_ids)
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=TOLERANCE)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=TOLERANCE)
    for p, tok in zip(spec.logprobs, spec.token_ids):
        assert p.token == tok and p.top[0][0] == tok  # greedy: the chosen token is the most likely
        assert p.logprob == p.top[0][1] and len(p.top) == 5
        values = [lp for _, lp in p.top]
        assert all(lp <= 0 for lp in values) and values == sorted(values, reverse=True)
    # the deltas carry each token's probabilities, in order, beside its id
    assert [t for d in deltas for t in d.token_ids] == spec.token_ids
    assert [p for d in deltas for p in d.logprobs] == spec.logprobs


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_asking_for_logprobs_never_changes_the_tokens_chosen(tiny_engine, temperature):
    for post in (False, True):
        kw = dict(max_tokens=50, sampling=SamplingParams(temperature=temperature, seed=7), draft_max=4, draft_p_min=0.0)
        without, deltas = run(tiny_engine, PROMPTS[0], "model", **kw)
        asked, _ = run(tiny_engine, PROMPTS[0], "model", logprobs=3, post_sampling_probs=post, **kw)
        assert asked.token_ids == without.token_ids and asked.text == without.text
        assert without.logprobs is None and all(d.logprobs is None for d in deltas)  # nothing computed unasked
        assert len(asked.logprobs) == len(asked.token_ids)


def test_post_sampling_probabilities_under_sampling_and_greedy(tiny_engine):
    sp = SamplingParams(temperature=1.0, top_k=8, seed=3)
    done, _ = run(tiny_engine, PROMPTS[1], "model", max_tokens=30, sampling=sp, logprobs=10,
                  post_sampling_probs=True)
    for p in done.logprobs:
        probs = [np.exp(lp) for _, lp in p.top]
        assert 0 < np.exp(p.logprob) <= 1 and 0 < len(probs) <= 8  # top-k 8: at most 8 candidates
        assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1.0)
        assert p.token in [t for t, _ in p.top]  # the token drawn was one of the chain's candidates
    greedy, _ = run(tiny_engine, PROMPTS[1], "model", max_tokens=10, logprobs=4, post_sampling_probs=True)
    assert all(p.logprob == 0.0 and p.top == ((p.token, 0.0),) for p in greedy.logprobs)  # greedy: certain


@pytest.mark.parametrize("n", [-1, MAX_TOP + 1])
def test_out_of_range_logprobs_are_refused(tiny_engine, n):
    with pytest.raises(EngineError, match="logprobs"):
        list(tiny_engine.generate(PROMPTS[0], GenerationParams(logprobs=n), "none"))


def test_under_a_grammar_forced_drafts_give_the_same_logprobs_and_they_are_the_models_own(starter_engine):
    """The grammar's forced tokens join the draft; what is reported is still the target's softmax before the mask
    (llama-server's default), so the model's own favourite may be a token the grammar forbade."""
    from app.engine.grammar import Grammar
    from app.prompts import chat_tokens

    ask = [{"role": "user", "content": "Describe a fictional person as JSON with a name and an age."}]
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}}
    ids = chat_tokens(starter_engine.model, ask)
    kw = dict(max_tokens=40, grammar=Grammar.json_schema(schema), logprobs=2)
    plain, _ = run(starter_engine, ids, "none", **kw)
    spec, _ = run(starter_engine, ids, "model", draft_max=8, draft_p_min=0.0, **kw)
    assert spec.stats.n_forced_accepted > 0 and spec.token_ids == plain.token_ids
    assert [p.logprob for p in spec.logprobs] == pytest.approx([p.logprob for p in plain.logprobs], abs=TOLERANCE)
    assert any(p.top[0][0] != p.token for p in plain.logprobs)  # the mask chose otherwise than the model would
    post, _ = run(starter_engine, ids, "model", post_sampling_probs=True, sampling=SamplingParams(temperature=0.7,
                  seed=1), **kw)
    assert all(p.logprob > -30 for p in post.logprobs)  # (the token drawn was one the chain kept)
    # after the chain (the grammar's mask, min-p...), a token that alone survives is certain, the rest not listed
    assert any(p.logprob == 0.0 and p.top == ((p.token, 0.0),) for p in post.logprobs)
