"""What every hidden-state head drafter must do, checked for each (support.heads): MTP (a tiny Qwen3.5's own MTP
layer), EAGLE-3 (a head reading three layers of a tiny llama), Gemma 4's assistant (reading a tiny Gemma 4's
cache) and the DFlash, DFlash2 and DSpark block drafts (reading two layers of a tiny llama). Greedy output identical to speculation off at draft lengths 1 to 8 and adaptive, under each name the head
answers to; a second turn that reuses the prefix; the target's distribution when sampling; drafting under a grammar;
and, for a head given as a file, the CLI under llama.cpp's names. What one head alone does is tested in its own file
(test_mtp.py, test_eagle3.py, test_gemma4_assistant.py, test_block_drafters.py)."""
import json
from dataclasses import dataclass

import pytest
from support.heads import HEADS, run
from test_exact_sampling import N, compare, samples

from app.engine import Engine, EngineError, ModelSettings
from app.engine.grammar import Grammar
from app.prompts import chat_tokens


@dataclass(frozen=True)
class Expected:
    names: tuple[str, str, str, str]  # the drafter asked for at each of DRAFTS: a head answers to more than one name
    drafter: str  # what the stats (and the CLI's --json) call it
    method: str | None  # the stats' method (None: not checked)
    accepts_when_adaptive: bool  # the adaptive run must have accepted drafts
    spec_type: str | None  # llama.cpp's --spec-type for the head given with -md (None: MTP's layer is no file)


EXPECTED = {
    "mtp": Expected(("mtp", "mtp", "mtp", "mtp"), "mtp", None, True, None),
    "mtp-file": Expected(("mtp", "model", "mtp", "model"), "mtp", "MTP", True, "draft-mtp"),
    "eagle3": Expected(("eagle3", "eagle3", "model", "eagle3"), "eagle3", "EAGLE-3", False, "draft-eagle3"),
    "gemma4": Expected(("model", "model", "mtp", "model"), "assistant", "Gemma 4 assistant", False, "draft-mtp"),
    "dflash": Expected(("dflash", "dflash", "model", "dflash"), "dflash", "DFlash", False, "draft-dflash"),
    "dflash2": Expected(("dflash", "dflash", "model", "dflash"), "dflash", "DFlash", False, "draft-dflash"),
    "dspark": Expected(("dspark", "dspark", "model", "dspark"), "dspark", "DSpark", True, "draft-dspark"),
}
DRAFTS = [dict(draft_max=1), dict(draft_max=4, draft_p_min=0.0), dict(draft_max=8, draft_p_min=0.0),
          dict(draft_max=8, adaptive=True)]


@pytest.fixture(scope="module", params=list(HEADS))
def head(request):
    return HEADS[request.param]


@pytest.fixture(scope="module")
def files(head, tmp_path_factory):
    """(target, head file or None)."""
    return head.write(tmp_path_factory.mktemp(head.name))


@pytest.fixture(scope="module")
def engine(files):
    target, file = files
    e = Engine(ModelSettings(target, n_ctx=1024), file and ModelSettings(file, n_ctx=1024))
    yield e
    e.close()


@pytest.mark.parametrize("i", range(len(DRAFTS)), ids=["max1", "max4-p0", "max8-p0", "max8-adaptive"])
def test_greedy_drafting_is_token_identical_to_plain(head, engine, i):
    want, draft = EXPECTED[head.name], DRAFTS[i]
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat"}])
    engine.reset()
    plain = run(engine, ids, "none")
    engine.reset()
    engine.forget_costs()  # (adaptive: measure afresh, so the first round drafts whatever earlier runs timed)
    spec = run(engine, ids, want.names[i], **draft)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 200
    assert spec.stats.drafter == want.drafter
    if want.method is not None:
        assert spec.stats.method == want.method
    if not draft.get("adaptive") or want.accepts_when_adaptive:
        assert spec.stats.n_accepted > 0
    if draft.get("draft_p_min") == 0.0:  # long drafts, never cut short: some fail (the reject path ran)
        assert spec.stats.n_accepted < spec.stats.n_drafted


@pytest.mark.parametrize("adaptive", [False, True])
def test_chained_with_prompt_lookup_it_stays_exact(head, engine, adaptive):
    """``check --measure`` times each model method chained with prompt lookup too (``HEAD,ngram``): greedy output is
    speculation off's, on a prompt that repeats, with fixed lengths (llama.cpp's rule) and adaptive (priced)."""
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat " * 4}])
    engine.reset()
    plain = run(engine, ids, "none", max_tokens=80)
    engine.reset()
    engine.forget_costs()
    spec = run(engine, ids, f"{head.drafter},ngram", max_tokens=80, draft_max=4, draft_p_min=0.0, adaptive=adaptive)
    assert spec.token_ids == plain.token_ids and spec.stats.n_drafted > 0
    assert sum(d for _, d, _ in spec.stats.by_drafter.values()) == spec.stats.n_drafted


def test_a_second_turn_reuses_the_prefix_and_stays_exact(head, engine):
    """A second chat turn reuses the cached prefix, drafts with tokens accepted, and says what speculation off
    says from a cleared cache."""
    engine.reset()
    turn1 = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat"}])
    first = run(engine, turn1, head.drafter, max_tokens=40, draft_max=4, draft_p_min=0.0)
    turn2 = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat"},
                                {"role": "assistant", "content": first.text},
                                {"role": "user", "content": "and then?"}])
    second = run(engine, turn2, head.drafter, max_tokens=60, draft_max=4, draft_p_min=0.0)
    assert second.stats.prompt_cached > 0 and second.stats.n_accepted > 0
    engine.reset()
    assert run(engine, turn2, "none", max_tokens=60).token_ids == second.token_ids


def test_drafting_samples_the_target_distribution(head, engine):
    """Sampled output with the head drafting follows the target's distribution (chi-square against speculation
    off), with plenty drafted."""
    engine.reset()
    plain, _ = samples(engine, [1, 300, 301, 302], "none", seed0=40_000)
    spec, drafted = samples(engine, [1, 300, 301, 302], head.drafter, draft_max=3, draft_p_min=0.0)
    assert drafted > N
    compare(plain, spec)


def test_greedy_drafting_under_a_grammar_stays_exact(head, engine):
    """Under a grammar where free text alternates with runs it forces, the head drafts the free text (its run ends
    where the grammar starts forcing), the forced runs join the draft, and the answer is speculation off's."""
    grammar = Grammar.lark(r"start: /([^xyz]{1,4}xyz)+/", "test")
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat"}])
    engine.reset()
    plain = run(engine, ids, "none", max_tokens=60, grammar=grammar)
    engine.reset()
    spec = run(engine, ids, head.drafter, max_tokens=60, grammar=grammar, draft_max=4, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 60
    s = spec.stats
    assert s.n_forced > 0 and s.n_drafted > s.n_forced  # forced runs, and the head's own tokens beside them


@pytest.mark.parametrize("head", [name for name, want in EXPECTED.items() if want.spec_type], indirect=True)
def test_the_cli_drafts_with_it_under_llama_cpp_names(head, files):
    """`--spec-type draft-eagle3 -md HEAD` for an EAGLE-3 head, `--spec-type draft-mtp -md ASSISTANT` for Gemma 4's
    assistant (llama.cpp's command line for each) and the plain `--draft FILE` both draft with the head; output as
    with speculation off."""
    from test_cli import cli

    want, (target, file) = EXPECTED[head.name], files
    args = ("generate", "-m", target, "--temperature", "0", "-n", "48", "--json", "--prompt", "the cat sat")
    runs = [cli(*args, *extra) for extra in (["--spec-type", want.spec_type, "-md", file, "--draft-p-min", "0"],
                                             ["--draft", file, "--draft-p-min", "0"], ["--drafter", "none"])]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    named, model, plain = (json.loads(r.stdout) for r in runs)
    assert named["drafter"] == model["drafter"] == want.drafter and named["n_drafted"] > 0 and model["n_drafted"] > 0
    assert named["token_ids"] == model["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize("head", [name for name, want in EXPECTED.items() if want.spec_type], indirect=True)
def test_given_as_the_target_it_is_refused_in_words(head, files):
    """A head is no model: llama.cpp crashes running some as one (a side file of MTP layers) and drafts nonsense
    with others (a block draft). Given as the target, it is an error that says what it is and where it goes."""
    with pytest.raises(EngineError, match=r"\.gguf is (an? |Gemma 4).*, not a model: give it as the draft \(--draft\)"):
        Engine(ModelSettings(files[1], n_ctx=256))
