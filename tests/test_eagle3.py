"""Drafting with an EAGLE-3 head (an ``eagle3`` GGUF that reads three of the target's layers) on tiny pairs written
by tiny_eagle3: what EAGLE-3 alone does (exact greedy output with a mapped draft vocabulary and with a recurrent
target, the API under llama.cpp's names, the head's cache after speculation off) and refusals that leave the process
running. Exact greedy output, a second turn, the target's distribution when sampling, grammars and the CLI under
llama.cpp's names: test_heads.py, as for every head."""
import pytest

from app.engine import Engine, EngineError, ModelSettings
from app.engine.llama.heads import Capture
from app.prompts import chat_tokens
from support.heads import HEADS, run
from support.tiny_eagle3 import write_eagle3_head, write_eagle3_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return HEADS["eagle3"].write(tmp_path_factory.mktemp("eagle3"))


@pytest.fixture(scope="module")
def engine(pair):
    e = Engine(ModelSettings(pair[0], n_ctx=1024), ModelSettings(pair[1], n_ctx=1024))
    yield e
    e.close()



def prompt(engine, text="the cat sat on the mat"):
    return chat_tokens(engine.model, [{"role": "user", "content": text}])


def test_the_head_is_the_pairs_draft_under_either_name(engine, pair):
    assert engine.draft is None and engine.draft_model.path == pair[1]  # no context of its own
    assert engine.drafters == ("model", "eagle3", "ngram", "suffix", "none")
    assert engine.head == ("eagle3", "eagle3")


def test_a_head_with_its_own_draft_vocabulary_drafts_target_ids(tmp_path):
    """A head whose output covers 200 of the target's tokens (mapped by its d2t table inside llama.cpp's graph):
    what it drafts are target ids from that table, and greedy output is as plain."""
    import numpy as np
    from gguf import GGUFReader

    target, head = write_eagle3_pair(tmp_path, draft_vocab=200)
    d2t = {int(x) for t in GGUFReader(str(head)).tensors if t.name == "d2t" for x in np.array(t.data)}
    e = Engine(ModelSettings(target, n_ctx=1024), ModelSettings(head, n_ctx=1024))
    try:
        ids = prompt(e)
        plain = run(e, ids, "none")
        e.reset()
        spec = run(e, ids, "eagle3", draft_max=4, draft_p_min=0.0)
        assert spec.token_ids == plain.token_ids and spec.stats.n_accepted > 0
        drafted = [t for t, from_draft in zip(spec.token_ids, spec.draft_flags) if from_draft]
        assert drafted and set(drafted) <= d2t
    finally:
        e.close()


def test_a_recurrent_target_rolls_back_exactly_under_the_head(tmp_path):
    """A tiny Qwen3.5 (recurrent and attention layers, a llama.cpp graph that exposes layer inputs): rejected drafts
    roll the recurrent state back, so greedy output is as plain."""
    from support.tiny_recurrent import write_recurrent

    target = write_recurrent(tmp_path / "qwen35.gguf", "qwen35", seed=1)
    head = write_eagle3_head(tmp_path / "qwen35-eagle3.gguf", target, layers=(0, 1, 3))
    e = Engine(ModelSettings(target, n_ctx=1024, n_rs_seq=8), ModelSettings(head, n_ctx=1024))
    try:
        ids = prompt(e)
        plain = run(e, ids, "none", max_tokens=60)
        e.reset()
        spec = run(e, ids, "eagle3", max_tokens=60, draft_max=4, draft_p_min=0.0)
        assert spec.token_ids == plain.token_ids and spec.stats.n_drafted > 0
    finally:
        e.close()


def test_the_cli_refuses_draft_eagle3_without_a_head(pair):
    """`--spec-type draft-eagle3` with no `-md HEAD` is a clear error. (The CLI drafting with a head under llama.cpp's
    names: test_heads.py.)"""
    from test_cli import cli

    no_head = cli("generate", "-m", pair[0], "--spec-type", "draft-eagle3", "--prompt", "x")
    assert no_head.returncode != 0 and "needs an EAGLE-3 head" in no_head.stderr


def test_the_api_names_the_head_and_drafts_by_llama_server_names(pair):
    import httpx
    from support.servers import serve_in_thread

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(pair[0]), draft=str(pair[1]), ctx=1024))
    try:
        with serve_in_thread(lambda port: ApiServer(rt).app()) as url:
            listed = httpx.get(f"{url}/models", timeout=30).json()["data"][0]
            assert listed["speculation"] == f"EAGLE-3 {pair[1].name}"
            ask = lambda **extra: httpx.post(f"{url}/completions", timeout=120, json={  # noqa: E731
                "prompt": "the cat sat", "max_tokens": 48, "temperature": 0, "speculative.p_min": 0, **extra}).json()
            named, off = ask(**{"speculative.type": "draft-eagle3"}), ask(**{"speculative.n_max": 0})
            assert named["choices"][0]["text"] == off["choices"][0]["text"]
            assert named["timings"]["draft_n"] > 0 and off["timings"]["draft_n"] == 0
            bad = httpx.post(f"{url}/completions", timeout=30, json={"prompt": "x", "speculative.type": "draft-mtp"})
            assert bad.status_code == 400 and "no MTP" in bad.json()["error"]["message"]
    finally:
        rt.close()


def test_a_head_for_another_target_is_refused_before_llama_cpp_sees_it(pair, tmp_path):
    """A target whose llama.cpp graph does not expose layer inputs would abort the process; a head trained for another
    hidden size or reading layers the target lacks would draft garbage: each is a clear error, and the process goes
    on. The pair check says the same before anything loads."""
    from app.models.check import check_files, describe
    from support.tiny_gguf import write_model

    gemma3 = write_model(tmp_path / "gemma3.gguf", seed=1, sliding_window=8)
    with pytest.raises(EngineError, match="only for llama, .* targets, not gemma3"):
        Engine(ModelSettings(gemma3, n_ctx=256), ModelSettings(pair[1], n_ctx=256))
    wrong = write_eagle3_head(tmp_path / "wrong.gguf", pair[0], layers=(0, 1, 7), target_hidden=48)
    with pytest.raises(EngineError, match="hidden size 48, this one has 64.*reads layers \\[0, 1, 7\\], the target "
                                          "has 3"):
        Engine(ModelSettings(pair[0], n_ctx=256), ModelSettings(wrong, n_ctx=256))
    assert "compatible: the draft is an EAGLE-3 head" in "\n".join(describe(check_files(pair[0], pair[1], n_ctx=256)))
    assert any(line.startswith("not usable: the draft is an EAGLE-3 head") and "not gemma3" in line
               for line in describe(check_files(gemma3, pair[1], n_ctx=256)))
    e = Engine(ModelSettings(pair[0], n_ctx=256), ModelSettings(pair[1], n_ctx=256))  # and a good pair still loads
    try:
        assert run(e, [1, 300, 301], "model", max_tokens=8).stats.n_drafted > 0
    finally:
        e.close()


def test_a_turn_after_speculation_off_starts_the_heads_cache_over(engine, monkeypatch):
    """Speculation off for a long answer: the target keeps only its newest layer inputs, so when the head drafts
    again the positions after what its cache holds have none; it starts over from those kept (llama.cpp requires
    each row to follow the last it holds), and the output stays exact."""
    ctx = engine.target.ctx
    monkeypatch.setattr(Capture, "MAX_BYTES", 4 * 3 * engine.model.n_embd * ctx.n_batch)
    ids = prompt(engine)
    engine.reset()
    run(engine, ids, "eagle3", max_tokens=8)
    plain = run(engine, ids, "none", max_tokens=700)
    assert len(ctx.captures[0].rows) <= ctx.n_batch < 700
    longer = ids + plain.token_ids
    spec = run(engine, longer, "eagle3", max_tokens=40, draft_max=4, draft_p_min=0.0)
    assert spec.stats.prompt_cached > 700 and spec.stats.n_accepted > 0
    engine.reset()
    assert run(engine, longer, "none", max_tokens=40).token_ids == spec.token_ids


def test_a_build_without_the_staging_api_is_refused_clearly(pair, monkeypatch):
    """The layer-input calls are C++ names outside llama.cpp's stable API: a build that lacks them gets a clear
    error at load time, not a crash."""
    from app.engine.llama import backend

    monkeypatch.setitem(backend._EXT, "llama_get_embeddings_layer_inp", ("Xgone", "Xgone", [], None))
    monkeypatch.setattr(backend, "ext", backend.functools.cache(backend.ext.__wrapped__))
    with pytest.raises(EngineError, match="does not export llama_get_embeddings_layer_inp, which an EAGLE-3 head"):
        Engine(ModelSettings(pair[0], n_ctx=256), ModelSettings(pair[1], n_ctx=256))
