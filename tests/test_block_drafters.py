"""What block drafts alone do (DFlash, DFlash2 and DSpark: a ``dflash`` GGUF given with -md; tiny ones written by
tiny_block): greedy output identical to speculation off at every block size 1 to 16; the block size, anchor layout,
causality and confidence head as the draft's metadata says; a hybrid target; llama.cpp's own llama-server drafting
with the same files to the same tokens; the CLI and the API under llama.cpp's names; and a draft for another target
refused in words. The checks every head passes (a second turn, the chi-square check, a grammar): test_heads.py."""
import json

import httpx
import numpy as np
import pytest
from gguf import GGUFReader
from support.heads import run
from support.llama_server import llama_server
from support.tiny_block import write_block_draft
from support.tiny_gguf import write_model

from app.engine import Done, DraftParams, Engine, EngineError, GenerationParams, ModelSettings, SamplingParams
from app.engine.events import Round
from app.prompts import chat_tokens

KINDS = {"dflash": dict(), "dspark": dict(markov=True)}  # llama.cpp's two types, by SpecChat's drafter names
VARIANTS = {  # name: (drafter, writer options)
    "dflash": ("dflash", {}),
    "dflash2": ("dflash", dict(selector_top_k=4)),
    "dflash-features": ("dflash", dict(feature_key=0.85)),  # what it drafts depends on every feature it holds
    "dflash-mrope": ("dflash", dict(feature_key=0.85, mrope=True)),  # as drafts for M-RoPE targets (Qwen3.5) are
    "dspark": ("dspark", dict(markov=True)),
    "dflash-bs4": ("dflash", dict(block_size=4)),
    "dspark-bs4": ("dspark", dict(markov=True, block_size=4)),
    "dspark-bs4-bonus": ("dspark", dict(markov=True, block_size=4, sample_from_anchor=False)),
    "dflash-causal": ("dflash", dict(causal=True)),
    "dspark-no-confidence": ("dspark", dict(markov=True, confidence=False)),
    # reduced-vocabulary exports: the head covers 200 of the target's ids, mapped back by d2t in llama.cpp's graph
    "dflash-d2t": ("dflash", dict(draft_vocab=200)),
    "dflash2-d2t": ("dflash", dict(selector_top_k=4, draft_vocab=200)),
    "dspark-d2t": ("dspark", dict(markov=True, draft_vocab=200)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny target (nearly a bigram model) and every variant's draft for it."""
    d = tmp_path_factory.mktemp("block")
    target = write_model(d / "tiny-block-target.gguf", seed=0, n_layer=3, context=0.2)
    return target, {name: write_block_draft(d / f"{name}.gguf", target, **opts) for name, (_, opts) in VARIANTS.items()}


@pytest.fixture(scope="module")
def engines(files):
    target, drafts = files
    made: dict[str, Engine] = {}

    def engine(name: str) -> Engine:
        if name not in made:
            made[name] = Engine(ModelSettings(target, n_ctx=1024), ModelSettings(drafts[name], n_ctx=1024))
        return made[name]

    yield engine
    for e in made.values():
        e.close()


@pytest.fixture(scope="module")
def chat(engines):
    return chat_tokens(engines("dflash").model, [{"role": "user", "content": "the cat sat on the mat"}])


@pytest.fixture(scope="module")
def plain(engines, chat):
    """Speculation off's answer (the same target in every engine)."""
    e = engines("dflash")
    e.reset()
    return run(e, chat, "none").token_ids


def rounds(engine: Engine, ids, drafter: str, max_tokens: int = 200, **draft) -> tuple[list[Round], Done]:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                              draft=DraftParams(**draft))
    engine.reset()
    events = list(engine.generate(ids, params, drafter))
    return [e for e in events if isinstance(e, Round)], events[-1]


@pytest.mark.parametrize("block", range(1, 17))
@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark"])
def test_greedy_block_drafting_is_token_identical_to_plain_at_every_block_size(engines, chat, plain, name, block):
    """A block of ``block`` tokens each round (the trained block is 16: DFlash and DFlash2 draft at most 15 of it,
    DSpark from its anchor 16): the answer is speculation off's, tokens were drafted and accepted, and no round
    drafted more."""
    drafter = VARIANTS[name][0]
    drafted, done = rounds(engines(name), chat, drafter, draft_max=block, draft_p_min=0.0)
    assert done.token_ids == plain and done.stats.drafter == drafter
    assert done.stats.n_drafted > 0 and done.stats.n_accepted > 0
    most = max(r.n_drafted for r in drafted)
    assert most == min(block, 16 if drafter == "dspark" else 15)


@pytest.mark.parametrize("name,most", [("dflash-bs4", 3), ("dspark-bs4", 4), ("dspark-bs4-bonus", 3),
                                       ("dflash-causal", 8)])
def test_block_size_anchor_and_causality_come_from_the_drafts_metadata(engines, chat, plain, name, most):
    """dflash.block_size 4 caps a DFlash block at 3 drafted tokens (the anchor's row drafts nothing), a DSpark one at
    4 (it drafts from the anchor's row), or 3 with dflash.sample_from_anchor = false; a draft trained causal
    (dflash.attention.causal) drafts all 8 asked. Each answer is speculation off's."""
    drafter = VARIANTS[name][0]
    drafted, done = rounds(engines(name), chat, drafter, draft_max=8, draft_p_min=0.0)
    assert done.token_ids == plain and done.stats.n_accepted > 0
    assert max(r.n_drafted for r in drafted) == most


def test_dspark_stops_where_its_confidence_head_falls_under_p_min(engines, chat, plain):
    """With --draft-p-min above 0 a DSpark block ends at the first row whose confidence (sigmoid of its head, about
    0.7 to 0.96 in the tiny draft) is under it, as llama.cpp does: nothing passes 0.99, everything 0.5, some 0.85.
    A DSpark draft without a confidence head is refused any p_min above 0 in words, and drafts with 0."""
    e = engines("dspark")
    n = {p: rounds(e, chat, "dspark", draft_max=8, draft_p_min=p)[1] for p in (0.0, 0.5, 0.85, 0.99)}
    assert all(done.token_ids == plain for done in n.values())
    assert n[0.99].stats.n_drafted == 0 and n[0.5].stats.n_drafted == n[0.0].stats.n_drafted
    assert 0 < n[0.85].stats.n_drafted < n[0.5].stats.n_drafted
    bare = engines("dspark-no-confidence")
    with pytest.raises(EngineError, match="no confidence head.*--draft-p-min 0"):
        rounds(bare, chat, "dspark", draft_p_min=0.5)
    assert rounds(bare, chat, "dspark", draft_max=8, draft_p_min=0.0)[1].token_ids == plain


@pytest.mark.parametrize("name", ["dflash-d2t", "dflash2-d2t", "dspark-d2t"])
def test_a_block_draft_with_its_own_draft_vocabulary_drafts_target_ids(files, engines, chat, plain, name):
    """A draft whose output head covers 200 of the target's ids (a ``d2t`` table maps its rows back, inside
    llama.cpp's graph; DSpark's Markov head and DFlash2's selector read it too): what it drafts are target ids from
    that table, some accepted, and greedy output is speculation off's at every block size tried."""
    d2t = {int(x) for t in GGUFReader(str(files[1][name])).tensors if t.name == "d2t" for x in np.array(t.data)}
    assert len(d2t) == 200
    drafter = VARIANTS[name][0]
    for block in (1, 4, 16):
        done = rounds(engines(name), chat, drafter, draft_max=block, draft_p_min=0.0)[1]
        assert done.token_ids == plain and done.stats.n_accepted > 0
        drafted = {t for t, from_draft in zip(done.token_ids, done.draft_flags) if from_draft}
        assert drafted and drafted <= d2t


def test_the_draft_follows_the_target_through_turns_other_drafters_and_resets(engines, chat):
    """The draft receives the target's features for every position the target evaluates, whatever drafts the turn
    (the block draft, speculation off, prompt lookup): a fourth turn after such turns drafts exactly as the same turn
    from a fresh start does, with a draft whose proposals depend on every feature it holds."""
    e = engines("dflash-features")
    e.reset()
    turns, answers = [chat], []
    for drafter in ("dflash", "none", "ngram", "dflash"):
        answers.append(run(e, turns[-1], drafter, max_tokens=30, draft_max=6, draft_p_min=0.0))
        turns.append(turns[-1] + answers[-1].token_ids + e.model.tokenize("and then?", add_special=False))
    assert answers[3].stats.prompt_cached > 0
    e.reset()
    again = run(e, turns[3], "dflash", max_tokens=30, draft_max=6, draft_p_min=0.0)
    assert again.token_ids == answers[3].token_ids and again.stats.prompt_cached == 0
    assert (again.stats.n_drafted, again.stats.n_accepted) == (answers[3].stats.n_drafted, answers[3].stats.n_accepted)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_hybrid_target_rolls_back_exactly_under_a_block_draft(tmp_path, kind):
    """A tiny Qwen3.5 (gated DeltaNet and attention layers, whose llama.cpp graph exposes layer inputs): rejected
    blocks roll the recurrent state back, so greedy output is as plain."""
    from support.tiny_recurrent import write_recurrent

    target = write_recurrent(tmp_path / "qwen35.gguf", "qwen35", seed=1)
    draft = write_block_draft(tmp_path / f"qwen35-{kind}.gguf", target, layers=(0, 1, 3), **KINDS[kind])
    e = Engine(ModelSettings(target, n_ctx=1024, n_rs_seq=8), ModelSettings(draft, n_ctx=1024))
    try:
        ids = chat_tokens(e.model, [{"role": "user", "content": "the cat sat"}])
        plain = run(e, ids, "none", max_tokens=60)
        e.reset()
        spec = run(e, ids, kind, max_tokens=60, draft_max=6, draft_p_min=0.0)
        assert spec.token_ids == plain.token_ids and spec.stats.n_drafted > 0
    finally:
        e.close()


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dflash-features", "dflash-mrope", "dspark", "dflash-d2t",
                                  "dflash2-d2t", "dspark-d2t"])
def test_llama_server_drafts_with_the_same_files_as_specchat_does(files, engines, name):
    """llama.cpp's own llama-server, given the draft as llama.cpp takes it (-md FILE --spec-type draft-dflash or
    draft-dspark), answers as SpecChat does and has as many drafts accepted, give or take one: the files are real
    block drafts, and SpecChat feeds and reads them as llama.cpp does (the draft whose proposals depend on every
    feature has 18 fewer accepted than the plain one at 100 tokens; an M-RoPE draft takes its features' positions in
    four sections). Its rounds differ at the edges (llama-server
    drafts nothing for the first token, and budgets the last rounds its own way), so drafted counts agree within a
    block."""
    target, drafts = files
    drafter, e = VARIANTS[name][0], engines(name)
    ids = e.model.tokenize("the cat sat")
    ours = rounds(e, ids, drafter, max_tokens=100, draft_max=8, draft_p_min=0.0)[1]
    with llama_server(target, None, "-md", str(drafts[name]), "--spec-type", f"draft-{drafter}",
                      "--spec-draft-p-min", "0", "--spec-draft-n-max", "8") as url:
        theirs = httpx.post(f"{url}/completion", timeout=120, json={
            "prompt": "the cat sat", "n_predict": 100, "temperature": 0, "return_tokens": True}).json()
    assert theirs["tokens"] == ours.token_ids
    timings = theirs["timings"]
    assert timings["draft_n_accepted"] > 0 and abs(timings["draft_n_accepted"] - ours.stats.n_accepted) <= 1
    assert abs(timings["draft_n"] - ours.stats.n_drafted) <= 8


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_cli_drafts_with_a_block_draft_as_llama_cpp_names_it(files, kind):
    """`specchat generate --target T --draft D --spec-type draft-dflash --temperature 0 --json` (and draft-dspark):
    the token ids of --drafter none, with tokens drafted."""
    from test_cli import cli

    target, drafts = files
    args = ("generate", "--target", target, "--temperature", "0", "-n", "48", "--json", "--prompt", "the cat sat")
    named, plain = (cli(*args, *extra) for extra in (["--draft", drafts[kind], "--spec-type", f"draft-{kind}"],
                                                     ["--drafter", "none"]))
    assert named.returncode == 0 and plain.returncode == 0, (named.stderr, plain.stderr)
    named, plain = json.loads(named.stdout), json.loads(plain.stdout)
    assert named["drafter"] == kind and named["n_drafted"] > 0
    assert named["token_ids"] == plain["token_ids"]


def test_the_api_drafts_by_llama_server_names_and_refuses_the_other_kind(files):
    """The API's speculative.type draft-dspark drafts with a DSpark draft, its answer as with speculation off;
    draft-dflash on the same pair is refused in words that name what the draft is for."""
    from support.servers import serve_in_thread

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.app import ApiServer

    target, drafts = files
    rt = Runtime()
    rt.load(LoadSpec(target=str(target), draft=str(drafts["dspark"]), ctx=1024))
    try:
        with serve_in_thread(lambda port: ApiServer(rt).app()) as url:
            assert httpx.get(f"{url}/models", timeout=30).json()["data"][0]["speculation"] == "DSpark dspark.gguf"
            ask = lambda **extra: httpx.post(f"{url}/completions", timeout=120, json={  # noqa: E731
                "prompt": "the cat sat", "max_tokens": 48, "temperature": 0, "speculative.p_min": 0, **extra})
            named, off = ask(**{"speculative.type": "draft-dspark"}).json(), ask(**{"speculative.n_max": 0}).json()
            assert named["choices"][0]["text"] == off["choices"][0]["text"]
            assert named["timings"]["draft_n"] > 0 and off["timings"]["draft_n"] == 0
            bad = ask(**{"speculative.type": "draft-dflash"})
            assert bad.status_code == 400 and "no DFlash block draft" in bad.json()["error"]["message"]
            assert "DSpark (dspark)" in bad.json()["error"]["message"]
    finally:
        rt.close()


def test_a_block_draft_for_another_target_is_refused_before_llama_cpp_sees_it(files, tmp_path):
    """A target whose llama.cpp graph does not expose layer inputs would abort the process; a draft for another
    hidden size, or reading layers the target lacks, would draft garbage: each is a clear error naming what the
    draft needs, and the pair check says the same before anything loads."""
    from app.models.check import check_files, describe

    target, drafts = files
    gemma3 = write_model(tmp_path / "gemma3.gguf", seed=1, sliding_window=8)
    with pytest.raises(EngineError, match="only for llama, .* targets, not gemma3"):
        Engine(ModelSettings(gemma3, n_ctx=256), ModelSettings(drafts["dflash"], n_ctx=256))
    wide = write_model(tmp_path / "wide.gguf", seed=1, n_embd=128, n_layer=3)
    with pytest.raises(EngineError, match="features 64 wide per layer, the target's hidden size is 128"):
        Engine(ModelSettings(wide, n_ctx=256), ModelSettings(drafts["dflash"], n_ctx=256))
    deep = write_block_draft(tmp_path / "deep.gguf", target, layers=(0, 5), markov=True)
    with pytest.raises(EngineError, match=r"inputs of layers \[0, 5\], the target has 3 \(0 to 2\)"):
        Engine(ModelSettings(target, n_ctx=256), ModelSettings(deep, n_ctx=256))
    good = "\n".join(describe(check_files(target, drafts["dspark"], n_ctx=256)))
    assert "compatible: the draft is a DSpark block draft" in good and "--spec-type draft-dspark" in good
    assert "hidden size 64 whose layers [0, 2]" in good and "blocks of 16 positions" in good
    assert "a selector over each row's top 4 (DFlash2)" in "\n".join(describe(check_files(target, drafts["dflash2"])))
    bad = "\n".join(describe(check_files(target, deep, n_ctx=256)))
    assert "not usable: the draft is a DSpark block draft" in bad and "but it reads the inputs of layers [0, 5]" in bad
    assert "not gemma3" in "\n".join(describe(check_files(gemma3, drafts["dflash"], n_ctx=256)))
