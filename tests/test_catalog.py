"""models.toml: the shipped catalog loads, bad catalogs are explained, pairs resolve to local files."""
import pytest

from app.catalog import get_pair, load_catalog, local_path
from app.engine import EngineError


def test_shipped_catalog_has_the_starter_pair():
    pairs = load_catalog()
    starter = pairs["starter"]
    assert starter.target.builtin and starter.draft.builtin
    assert starter.draft_params.adaptive and starter.draft_params.draft_p_min == 0.0
    for p in pairs.values():
        assert p.description and p.license and p.target.describe() and p.draft.describe()


@pytest.mark.parametrize("body,words", [
    ("[pairs.x]\nfoo = 1\n", "unknown keys: foo"),
    ("[pairs.x]\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n", "draft is missing"),
    ("[pairs.x]\ntarget = { repo = 'a/b' }\ndraft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "repo = ... and file"),
    ("[pairs.x]\ntarget = { builtin = 'nope' }\ndraft = { builtin = 'nope' }\n", "unknown builtin"),
    ("[pairs.x]\ndraft_max = 999\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "draft-max"),
    ("[pairs.x\n", "Cannot read the model catalog"),
])
def test_bad_catalog_entries_are_explained(tmp_path, body, words):
    f = tmp_path / "models.toml"
    f.write_text(body)
    with pytest.raises(EngineError, match=words):
        load_catalog(f)


def test_unknown_pair_lists_the_known_ones():
    with pytest.raises(EngineError, match="Known pairs: starter"):
        get_pair("nope")


def test_hub_pair_not_downloaded_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pair = get_pair("qwen2.5-7b-instruct")
    with pytest.raises(EngineError, match=r'hf download Qwen/Qwen2.5-7B-Instruct-GGUF --include "qwen2.5-7b-instruct-q4_k_m-\*.gguf"'):
        local_path(pair.target)
