"""models.toml: the shipped catalog loads, bad catalogs are explained, pairs resolve to local files."""
import pytest

from app.models.catalog import get_pair, load_catalog, local_path
from app.engine import EngineError


def test_shipped_catalog_has_the_starter_pair():
    pairs = load_catalog()
    starter = pairs["starter"]
    assert starter.target.builtin and starter.draft.builtin
    assert starter.draft_params.adaptive and starter.draft_params.draft_p_min == 0.0
    for p in pairs.values():
        assert p.description and p.license and p.target.describe() and (p.draft is None or p.draft.describe())


@pytest.mark.parametrize("body,words", [
    ("[pairs.x]\nfoo = 1\n", "unknown keys: foo"),
    ("[pairs.x]\ndraft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "target is missing"),
    ("[pairs.x]\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\ndraft = 'small'\n", "draft must be a table"),
    ("[pairs.x]\ntarget = { repo = 'a/b' }\ndraft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "repo = ... and file"),
    ("[pairs.x]\ntarget = { builtin = 'nope' }\ndraft = { builtin = 'nope' }\n", "unknown builtin"),
    ("[pairs.x]\ndraft_max = 999\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "draft-max"),
    ("[pairs.x\n", "Cannot read the model catalog"),
    ("[pairs.x]\nuse = 'poetry'\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "use must be one of chat, code, reasoning"),
    ("[pairs.x]\ntarget = { repo = 'no-owner', file = 'a.gguf' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "repo must look like owner/name"),
    ("[pairs.x]\ntarget = { repo = 'a/b', file = 'model.safetensors' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "must be a .gguf file"),
    ("[pairs.x]\ntarget = { repo = 'a/b', file = 'a.gguf', size_gb = 'big' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "size_gb must be a number"),
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
    with pytest.raises(EngineError, match=r"qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf is not downloaded yet\. "
                       r"Download it with: specchat pull qwen2.5-7b-instruct"):
        local_path(pair.target, pair.name)


def test_catalog_offers_real_pairs_for_every_use():
    pairs = load_catalog()
    hub_pairs = [p for p in pairs.values() if p.target.repo]
    assert len(hub_pairs) >= 8
    assert {p.use for p in hub_pairs} == {"chat", "code", "reasoning"}
    for p in hub_pairs:
        for src in p.sources:
            assert src.repo.count("/") == 1 and src.file.endswith(".gguf") and src.quantization and src.size_gb > 0
        assert (p.draft is None or p.target.size_gb > p.draft.size_gb) and p.context >= 8192
        assert 1 <= p.draft_params.draft_max <= 32
    assert pairs["qwen2.5-7b-instruct"].target.files() == [
        "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"]
