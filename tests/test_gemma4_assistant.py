"""Drafting with Gemma 4's assistant (a ``gemma4-assistant`` GGUF that reads the target's cache) on a tiny Gemma 4
pair written by tiny_gemma4: what the assistant alone does (the pair check names it, a target loaded alone finds it)
and refusals that leave the app running. Exact greedy output, the target's distribution when sampling, a second
turn, grammars and the CLI under llama.cpp's names: test_heads.py, as for every head."""
import json
from pathlib import Path

import pytest

from app.engine import Engine, EngineError, ModelSettings
from support.heads import HEADS, drafted
from support.tiny_gemma4 import write_gemma4_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return HEADS["gemma4"].write(tmp_path_factory.mktemp("gemma4"))


@pytest.fixture(scope="module")
def engine(pair):
    e = Engine(ModelSettings(pair[0], n_ctx=1024), ModelSettings(pair[1], n_ctx=1024))
    yield e
    e.close()



def test_the_assistant_is_the_pairs_draft_under_either_name(engine, pair):
    assert engine.draft is None and engine.draft_model.path == pair[1]  # no context of its own
    assert engine.drafters == ("model", "mtp", "ngram", "suffix", "none")


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
    assert drafted(*pair, "model") > 0  # and a good pair still loads


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


def test_the_hub_offers_the_assistant_in_the_targets_repo_as_what_it_is(pair, tmp_path):
    """Gemma 4's assistant ships in the target's own repo, as unsloth's MTP/ folder holds it: `check -hf` offers it
    first, named as the assistant (not as a draft model that shares the tokenizer) and judged from the two headers
    as the engine judges it before loading; one made for another Gemma 4 size is left out. Nothing comes down."""
    from support.fake_hub import FakeHub, child_env
    from test_hub import no_traffic_beyond_loopback, specchat

    (tmp_path / "other").mkdir()
    _, other_size = write_gemma4_pair(tmp_path / "other", a_target_embd=48, a_hd=16)
    repo = "tests/gemma-4-tiny-GGUF"
    hub = FakeHub()
    hub.add(repo, {"gemma-4-tiny-Q8_0.gguf": pair[0].read_bytes(), "MTP/mtp-gemma-4-tiny-Q8_0.gguf": pair[1].read_bytes(),
                   "MTP/mtp-gemma-4-other-Q8_0.gguf": other_size.read_bytes()}, downloads=5)
    env = child_env(hub.url, tmp_path)
    try:
        r = specchat(env, "check", "-hf", f"{repo}:Q8_0")
        assert r.returncode == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  ")]
        assert rows[0][:2] == ["OK", f"{repo}:MTP/mtp-gemma-4-tiny-Q8_0.gguf"], r.stdout
        assert "compatible: the draft is Gemma 4's assistant, drafting from the target's own cache" in r.stdout
        assert "the tokenizers match" not in r.stdout and "mtp-gemma-4-other" not in r.stdout
        assert not any((tmp_path / "hub").rglob("*.gguf"))
        no_traffic_beyond_loopback(env)
    finally:
        hub.close()
