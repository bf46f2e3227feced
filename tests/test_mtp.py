"""Drafting with a model's own MTP layer (--drafter mtp) on a tiny Qwen3.5 (hybrid: gated DeltaNet + attention)
that carries one, written by tiny_recurrent: exact greedy output, the target's distribution when sampling, prefix
reuse across turns, and clear errors."""
import json

import pytest

from app.engine import Done, DraftParams, Engine, EngineError, GenerationParams, ModelSettings, SamplingParams
from test_exact_sampling import N, compare, samples
from tiny_recurrent import write_recurrent


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    return write_recurrent(tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf", "qwen35", seed=3, mtp=1)


@pytest.fixture(scope="module")
def engine(mtp_path):
    e = Engine(ModelSettings(mtp_path, n_ctx=1024))
    yield e
    e.close()


def run(engine, ids, drafter, max_tokens=200, temperature=0.0, **draft) -> Done:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=temperature, seed=1),
                              draft=DraftParams(**draft))
    events = list(engine.generate(ids, params, drafter))
    assert isinstance(events[-1], Done)
    return events[-1]


def test_the_model_reports_its_mtp_layer(engine):
    assert engine.model.n_nextn == 1


@pytest.mark.parametrize("draft", [dict(draft_max=1), dict(draft_max=4, draft_p_min=0.0),
                                   dict(draft_max=8, draft_p_min=0.0), dict(draft_max=8, adaptive=True)])
def test_greedy_mtp_drafting_is_token_identical_to_plain(engine, draft):
    ids = engine.chat_tokens([{"role": "user", "content": "the cat sat on the mat"}])
    engine.reset()
    plain = run(engine, ids, "none")
    engine.reset()
    spec = run(engine, ids, "mtp", **draft)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 200
    assert spec.stats.n_accepted > 0
    if draft.get("draft_p_min") == 0.0 and not draft.get("adaptive"):  # long drafts, never cut short: some fail
        assert spec.stats.n_accepted < spec.stats.n_drafted  # (the reject path ran)
    assert spec.stats.drafter == "mtp"


def test_a_second_turn_reuses_the_prefix_and_stays_exact(engine):
    engine.reset()
    turn1 = engine.chat_tokens([{"role": "user", "content": "the cat sat"}])
    first = run(engine, turn1, "mtp", max_tokens=40, draft_max=4, draft_p_min=0.0)
    turn2 = engine.chat_tokens([{"role": "user", "content": "the cat sat"},
                                {"role": "assistant", "content": first.text},
                                {"role": "user", "content": "and then?"}])
    second = run(engine, turn2, "mtp", max_tokens=60, draft_max=4, draft_p_min=0.0)
    assert second.stats.prompt_cached > 0 and second.stats.n_accepted > 0
    engine.reset()
    assert run(engine, turn2, "none", max_tokens=60).token_ids == second.token_ids


def test_mtp_drafting_samples_the_target_distribution(engine):
    ids = [1, 300, 301, 302]
    engine.reset()
    plain, _ = samples(engine, ids, "none", seed0=40_000)
    spec, drafted = samples(engine, ids, "mtp", draft_max=3, draft_p_min=0.0)
    assert drafted > N
    compare(plain, spec)


def test_a_model_without_mtp_layers_is_refused_clearly(models):
    e = Engine(ModelSettings(models["target"], n_ctx=128))
    try:
        with pytest.raises(EngineError, match="no MTP"):
            list(e.generate([1, 300, 301], GenerationParams(max_tokens=4), "mtp"))
        assert run(e, [1, 300, 301], "none", max_tokens=4).token_ids  # and the engine still serves
    finally:
        e.close()


def test_hidden_states_stay_bounded_while_another_drafter_runs(engine, monkeypatch):
    """The target keeps hidden states for the MTP layer from the first MTP draft on; with speculation off they are
    not consumed, so the oldest go (and MTP drafting afterwards is still exact)."""
    ids = engine.chat_tokens([{"role": "user", "content": "the cat sat on the mat"}])
    ctx = engine.target.ctx
    monkeypatch.setattr(type(ctx), "HIDDEN_BYTES", 4 * engine.model.n_embd * ctx.n_batch)
    engine.reset()
    run(engine, ids, "mtp", max_tokens=8)
    plain = run(engine, ids, "none", max_tokens=600)
    assert len(ctx.hidden) <= ctx.n_batch < len(ids) + 600
    engine.reset()
    assert run(engine, ids, "mtp", max_tokens=600, draft_max=4, draft_p_min=0.0).token_ids == plain.token_ids


def test_the_cli_drafts_with_mtp_by_default_for_a_model_that_has_it(mtp_path):
    """No draft model given and the target carries an MTP layer: the CLI drafts with it, output as plain."""
    from test_cli import cli

    args = ("generate", "--target", mtp_path, "--temperature", "0", "-n", "48", "--json", "--prompt", "the cat sat")
    default, plain = cli(*args), cli(*args, "--drafter", "none")
    assert default.returncode == 0 and plain.returncode == 0, default.stderr + plain.stderr
    default, plain = json.loads(default.stdout), json.loads(plain.stdout)
    assert default["drafter"] == "mtp" and default["n_drafted"] > 0
    assert default["token_ids"] == plain["token_ids"]
