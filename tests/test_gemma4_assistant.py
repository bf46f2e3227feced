"""Drafting with Gemma 4's assistant (a ``gemma4-assistant`` GGUF that reads the target's cache) on a tiny Gemma 4
pair written by tiny_gemma4: exact greedy output, the target's distribution when sampling, a second turn, the CLI
under llama.cpp's names, and refusals that leave the app running."""
import json
from pathlib import Path

import pytest

from app.engine import Engine, EngineError, ModelSettings
from support.drafter_checks import (greedy_under_a_grammar_stays_exact, run, samples_the_target_distribution,
                            second_turn_stays_exact)
from support.tiny_gemma4 import write_gemma4_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_gemma4_pair(tmp_path_factory.mktemp("gemma4"), context=0.2)  # (0.3 loops on a long second turn)


@pytest.fixture(scope="module")
def engine(pair):
    e = Engine(ModelSettings(pair[0], n_ctx=1024), ModelSettings(pair[1], n_ctx=1024))
    yield e
    e.close()



def test_the_assistant_is_the_pairs_draft_under_either_name(engine, pair):
    assert engine.draft is None and engine.draft_model.path == pair[1]  # no context of its own
    assert engine.drafters == ("model", "mtp", "ngram", "none")


@pytest.mark.parametrize("drafter, draft", [("model", dict(draft_max=1)), ("model", dict(draft_max=4, draft_p_min=0.0)),
                                            ("mtp", dict(draft_max=8, draft_p_min=0.0)),
                                            ("model", dict(draft_max=8, adaptive=True))])
def test_greedy_drafting_with_the_assistant_is_token_identical_to_plain(engine, drafter, draft):
    ids = engine.chat_tokens([{"role": "user", "content": "the cat sat on the mat"}])
    engine.reset()
    plain = run(engine, ids, "none")
    engine.reset()
    spec = run(engine, ids, drafter, **draft)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 200
    assert spec.stats.drafter == "assistant" and spec.stats.method == "Gemma 4 assistant"
    if not draft.get("adaptive"):
        assert spec.stats.n_accepted > 0
    if draft.get("draft_p_min") == 0.0:  # long drafts, never cut short: some fail (the reject path ran)
        assert spec.stats.n_accepted < spec.stats.n_drafted


def test_a_second_turn_reuses_the_prefix_and_stays_exact(engine):
    second_turn_stays_exact(engine, "model")


def test_assistant_drafting_samples_the_target_distribution(engine):
    samples_the_target_distribution(engine, "model")


def test_the_cli_drafts_with_it_under_llama_cpp_names(pair):
    """`--spec-type draft-mtp -md ASSISTANT` (llama.cpp's command line for it) and the plain `--draft` both draft with
    the assistant; output as with speculation off."""
    from test_cli import cli

    args = ("generate", "-m", pair[0], "--temperature", "0", "-n", "48", "--json", "--prompt", "the cat sat")
    runs = [cli(*args, *extra) for extra in (["--spec-type", "draft-mtp", "-md", pair[1], "--draft-p-min", "0"],
                                             ["--draft", pair[1], "--draft-p-min", "0"], ["--drafter", "none"])]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    mtp, model, plain = (json.loads(r.stdout) for r in runs)
    assert mtp["drafter"] == model["drafter"] == "assistant" and mtp["n_drafted"] > 0 and model["n_drafted"] > 0
    assert mtp["token_ids"] == model["token_ids"] == plain["token_ids"]


def test_an_assistant_for_another_target_is_refused_before_llama_cpp_sees_it(pair, tmp_path):
    """A target of another architecture would crash llama.cpp; an assistant made for another Gemma 4 size would
    abort it or draft garbage: each is a clear error, and the process goes on."""
    from support.tiny_gguf import write_model

    llama = write_model(tmp_path / "llama.gguf", seed=1)
    with pytest.raises(EngineError, match="drafts only for a Gemma 4 target, not llama"):
        Engine(ModelSettings(llama, n_ctx=256), ModelSettings(pair[1], n_ctx=256))
    other, other_assistant = write_gemma4_pair(tmp_path, a_target_embd=48, a_hd=16)
    with pytest.raises(EngineError, match="expects a target hidden size of 48, the target has 64.*key_length is 16"):
        Engine(ModelSettings(other, n_ctx=256), ModelSettings(other_assistant, n_ctx=256))
    e = Engine(ModelSettings(pair[0], n_ctx=256), ModelSettings(pair[1], n_ctx=256))  # and a good pair still loads
    try:
        assert run(e, [1, 300, 301], "model", max_tokens=8).stats.n_drafted > 0
    finally:
        e.close()


def test_the_pair_check_names_the_assistant_and_refuses_another_target(pair, tmp_path):
    from app.models.check import check_files, describe
    from support.tiny_gguf import write_model

    lines = describe(check_files(pair[0], pair[1], n_ctx=256))
    assert "compatible: the draft is Gemma 4's assistant, drafting from the target's own cache" in "\n".join(lines)
    lines = describe(check_files(write_model(tmp_path / "llama.gguf", seed=1), pair[1], n_ctx=256))
    assert "not usable: the draft is Gemma 4's assistant, which drafts only for a Gemma 4 target, not llama" in lines


def test_a_gemma4_target_given_alone_drafts_with_the_assistant_downloaded_beside_it(pair, tmp_path):
    """unsloth's repos ship the assistant in an MTP/ folder: a Gemma 4 target loaded alone uses the assistant made
    for it from there (or beside it), and nothing else that lies around."""
    import shutil

    from app.models.loader import LoadSpec, resolve
    from support.tiny_gguf import write_model
    from test_cli import cli

    repo = tmp_path / "gemma-4-tiny-GGUF"
    (repo / "MTP").mkdir(parents=True)
    target = Path(shutil.copy(pair[0], repo / "gemma-4-tiny-Q8_0.gguf"))
    write_model(repo / "aaa-other-model.gguf", seed=1)  # (first by name, and not an assistant)
    (tmp_path / "other").mkdir()
    _, other_size = write_gemma4_pair(tmp_path / "other", a_target_embd=48, a_hd=16)  # for another Gemma 4 size
    shutil.copy(other_size, repo / "MTP" / "a-assistant-for-another-size.gguf")
    assert resolve(LoadSpec(target=str(target))).draft is None
    assistant = Path(shutil.copy(pair[1], repo / "MTP" / "gemma-4-tiny-Q8_0-MTP.gguf"))
    assert resolve(LoadSpec(target=str(target))).draft == assistant
    assert resolve(LoadSpec(target=str(repo / "aaa-other-model.gguf"))).draft is None  # (not a Gemma 4 target)
    args = ("generate", "-m", target, "--temperature", "0", "-n", "32", "--json", "--prompt", "the cat sat")
    found, off = cli(*args, "--draft-p-min", "0"), cli(*args, "--drafter", "none")
    assert found.returncode == 0 and off.returncode == 0, found.stderr + off.stderr
    found, off = json.loads(found.stdout), json.loads(off.stdout)
    assert found["drafter"] == "assistant" and found["n_drafted"] > 0 and found["token_ids"] == off["token_ids"]


def test_assistant_drafting_under_a_grammar_stays_exact(engine):
    greedy_under_a_grammar_stays_exact(engine, "model")
