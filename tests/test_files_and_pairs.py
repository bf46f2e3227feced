"""Bad files and mismatched pairs are refused before generation, in plain words."""

import pytest

from app.engine import Engine, EngineError, ModelSettings
from app.engine.compat import compatibility_problems
from app.engine.llama import Model
from app.prompts import chat_tokens


def test_missing_file(tmp_path):
    with pytest.raises(EngineError, match="not found"):
        Engine(ModelSettings(tmp_path / "nope.gguf"))


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("<html>404 Not Found</html>")
    with pytest.raises(EngineError, match="not a GGUF file"):
        Engine(ModelSettings(bad))


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(EngineError, match="folder"):
        Engine(ModelSettings(tmp_path))


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.01])
def test_truncated_gguf(models, tmp_path, keep):
    src = models["target"]
    cut = tmp_path / "cut.gguf"
    data = src.read_bytes()
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(EngineError, match="truncated|damaged"):
        Engine(ModelSettings(cut))


def test_corrupt_header(models, tmp_path):
    bad = tmp_path / "bad.gguf"
    data = bytearray(models["target"].read_bytes())
    data[8:24] = b"\xff" * 16  # absurd tensor and metadata counts
    bad.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="damaged|truncated"):
        Engine(ModelSettings(bad))


def test_a_vocabulary_with_a_token_twice_is_refused_not_aborted(tmp_path):
    from support.tiny_gguf import write_model

    bad = write_model(tmp_path / "dup.gguf", rename={2: "<|im_end|>"})  # the vocabulary already has <|im_end|>
    with pytest.raises(EngineError, match=r"dup.gguf has a damaged vocabulary: the token '<\|im_end\|>' appears "
                                          "more than once"):
        Engine(ModelSettings(bad))  # llama.cpp itself would abort the process


@pytest.mark.parametrize("kind,said", [
    ("mmproj", "is a vision projector, not a model: give it beside its model with --mmproj"),
    ("adapter", "is a LoRA adapter, not a model: merge it into its base model first"),
    ("imatrix", "is an importance matrix, not a model"),
])
def test_a_gguf_that_is_no_model_is_named_for_what_it_is(models, tmp_path, kind, said):
    """Projectors, LoRA adapters and importance matrices are GGUF files too (general.type; a projector's
    architecture is clip): as the target or the draft, each is refused saying what it is and what to do with it."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(tmp_path / f"{kind}.gguf"), "clip" if kind == "mmproj" else "llama")
    w.add_type(kind)
    w.add_tensor("x.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for settings in ([tmp_path / f"{kind}.gguf"], [models["target"], tmp_path / f"{kind}.gguf"]):
        with pytest.raises(EngineError, match=f"{kind}.gguf {said}"):
            Engine(*(ModelSettings(p, n_ctx=128) for p in settings))
    from app.models.check import check_files, describe

    lines = describe(check_files(models["target"], tmp_path / f"{kind}.gguf"))
    assert any(line.startswith(f"not usable as the draft: {kind}.gguf {said}") for line in lines), lines


def test_compatible_pair_has_no_problems(models):
    t, d = Model(models["target"], vocab_only=True), Model(models["draft"], vocab_only=True)
    assert compatibility_problems(t, d) == []


@pytest.mark.parametrize("variant,words", [
    ("other_text", "token 300 means"),
    ("other_size", "differ in size by 200 tokens"),
    ("other_type", "different tokenizer types"),
    ("other_bos", "start text differently"),
])
def test_each_vocabulary_mismatch_is_explained_and_the_pair_drafts_as_text(models, variant, words):
    from app.engine import Done, DraftParams, GenerationParams

    e = Engine(ModelSettings(models["target"], n_ctx=256), ModelSettings(models[variant], n_ctx=256))
    try:
        assert words in "; ".join(e.cross_vocab)
        plain = list(e.generate([1, 300, 301], GenerationParams(max_tokens=40), "none"))[-1]
        spec = list(e.generate([1, 300, 301], GenerationParams(max_tokens=40, draft=DraftParams(draft_p_min=0)),
                               "model"))[-1]
    finally:
        e.close()
    assert isinstance(spec, Done) and spec.token_ids == plain.token_ids
    assert spec.stats.drafter == "model (as text)" and spec.stats.n_drafted > 0


def test_vocab_size_within_128_is_allowed(models, tmp_path):
    from support.tiny_gguf import write_model

    near = write_model(tmp_path / "near.gguf", seed=5, base_seed=1, noise=0.1, extra_words=40 + 100)
    e = Engine(ModelSettings(models["target"], n_ctx=128), ModelSettings(near, n_ctx=128))
    from app.engine import GenerationParams, DraftParams, Done

    plain = [ev for ev in e.generate([1, 300, 301], GenerationParams(max_tokens=30), "none")][-1]
    spec = [ev for ev in e.generate([1, 300, 301], GenerationParams(max_tokens=30, draft=DraftParams(draft_p_min=0)), "model")][-1]
    assert isinstance(spec, Done) and spec.token_ids == plain.token_ids
    e.close()


def test_a_foreign_vocabulary_drafts_as_text_for_the_starter_model(models):
    """SmolLM2's byte-level BPE target, drafted by a tiny SentencePiece model: nothing in common but text."""
    from app.engine import DraftParams, GenerationParams
    from app.models import starter

    e = Engine(ModelSettings(starter.draft_path(), n_ctx=256), ModelSettings(models["target"], n_ctx=256))
    try:
        assert any("tokenizer types" in p for p in e.cross_vocab)
        ids = chat_tokens(e.model, [{"role": "user", "content": "Name a colour."}])
        plain = list(e.generate(ids, GenerationParams(max_tokens=24), "none"))[-1]
        spec = list(e.generate(ids, GenerationParams(max_tokens=24, draft=DraftParams(draft_p_min=0)), "model"))[-1]
    finally:
        e.close()
    assert spec.token_ids == plain.token_ids and spec.stats.n_drafted > 0


def test_starter_pair_is_compatible():
    from app.models import starter

    t, d = Model(starter.target_path(), vocab_only=True), Model(starter.draft_path(), vocab_only=True)
    assert compatibility_problems(t, d) == []
    assert t.n_vocab == d.n_vocab == 49152


def test_pair_that_does_not_fit_in_memory_is_refused_before_loading(models, monkeypatch):
    import psutil
    from collections import namedtuple

    vm = namedtuple("vm", "total available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm(total=64 * 1024**2, available=32 * 1024**2))
    with pytest.raises(EngineError, match="need about .* GiB but this machine has 0.1 GiB"):
        Engine(ModelSettings(models["target"]), ModelSettings(models["draft"]))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm(total=64 * 1024**3, available=100 * 1024**2))
    with pytest.raises(EngineError, match="only 0.1 GiB of memory is free"):
        Engine(ModelSettings(models["target"], n_ctx=512))


def test_kv_estimate_matches_the_model_shape(models):
    m = Model(models["target"])  # tiny model: 2 layers, 64 dims, 4 heads (all KV heads)
    assert m.kv_bytes_per_token == 2 * 2 * 64 * 2
    m.close()


@pytest.mark.parametrize("add_bos", [True, False])
def test_a_draft_without_a_bos_id_shares_the_targets_tokens(tmp_path, add_bos):
    """A draft file that lacks tokenizer.ggml.bos_token_id (byte-level BPE: llama.cpp then assumes id 11, not the
    target's 1) but has the target's vocabulary drafts in the target's tokens, judged alike from the headers and from
    llama.cpp's vocabularies, and speculates exactly. Where neither adds a BOS (Qwen3.5/3.6 GGUFs, some of which name
    no BOS id) the ids never mattered; where both add one, the missing id no longer sends the pair to drafting as
    text."""
    from support.tiny_gguf import write_model

    from app.engine import Done, DraftParams, GenerationParams
    from app.engine.gguf_file import read_info

    kw = dict(vocab_model="gpt2", add_bos=add_bos)
    target = write_model(tmp_path / "target.gguf", seed=1, **kw)
    draft = write_model(tmp_path / "draft.gguf", seed=2, base_seed=1, noise=0.3, bos=None, **kw)
    other = write_model(tmp_path / "other.gguf", seed=2, base_seed=1, noise=0.3, bos=3, **kw)
    t, d = Model(target, vocab_only=True), Model(draft, vocab_only=True)
    try:
        assert not d.bos_named and d.bos != t.bos  # llama.cpp's default id
        assert compatibility_problems(t, d) == []
    finally:
        t.close()
        d.close()
    assert not read_info(draft).bos_named and compatibility_problems(read_info(target), read_info(draft)) == []
    named_other = compatibility_problems(read_info(target), read_info(other))  # a BOS id that differs still counts
    assert ("start text differently" in "; ".join(named_other)) == add_bos
    e = Engine(ModelSettings(target, n_ctx=256), ModelSettings(draft, n_ctx=256))
    try:
        assert e.cross_vocab == []
        plain = list(e.generate([1, 300, 301], GenerationParams(max_tokens=40), "none"))[-1]
        spec = list(e.generate([1, 300, 301], GenerationParams(max_tokens=40, draft=DraftParams(draft_p_min=0)),
                               "model"))[-1]
    finally:
        e.close()
    assert isinstance(spec, Done) and spec.token_ids == plain.token_ids
    assert spec.stats.drafter == "model" and spec.stats.n_drafted > 0
