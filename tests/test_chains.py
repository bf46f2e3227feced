"""Chains of drafters (llama.cpp's comma-separated --spec-type): several drafters each round, the draft with the most
expected accepted tokens verified; exact as any drafter; Stats say which drafter each round used."""
import json
from pathlib import Path

import numpy as np
import pytest

from app.chat.live_answer import Live
from app.engine import Done, DraftParams, Engine, EngineError, GenerationParams, ModelSettings, TextDelta
from app.engine.drafters import Draft, Drafter, NgramParams, registry
from app.engine.drafters.chain import ChainDrafter, expected_accepted
from app.engine.drafters.ngram import NgramSimple
from app.engine.sampling import SamplingParams
from app.prompts import chat_tokens
from support.heads import HEADS

GREEDY = SamplingParams(temperature=0.0)
REPEAT = json.loads((Path(__file__).parent / "prompts" / "repeat.jsonl").read_text().splitlines()[0])["prompt"]


class Fixed(Drafter):
    """A drafter that proposes a fixed draft (and counts how often it was asked); a lookup drafts its own length, a
    model at most n_max."""

    def __init__(self, name, tokens, prior=0.9, lookup=False):
        self.name, self.tokens, self.asked, self.accepted, self.lookup = name, tokens, 0, [], lookup
        self.SIGNAL_PRIOR = (prior,)

    def draft_round(self, history, n_max, limit, sp, rng, gate):
        self.asked += 1
        return Draft(tokens=self.tokens[: limit if self.lookup else min(n_max, limit)])

    def accept(self, n_accepted):
        self.accepted.append(n_accepted)


def test_the_chain_verifies_the_draft_with_the_most_expected_accepted_tokens():
    rng = np.random.default_rng(0)
    short, long_ = Fixed("short", [1, 2], prior=0.9), Fixed("long", list(range(5, 25)), 0.95, lookup=True)
    chain = ChainDrafter([(long_, False), (short, True)])
    d = chain.draft_round([0], 8, 64, GREEDY, rng, None)
    assert d.tokens == list(range(5, 25)) and d.source == "long"
    assert expected_accepted(0.95, 20) > expected_accepted(0.9, 8) > expected_accepted(0.9, 2)
    assert short.asked == 0  # a model drafter's best possible draft could not beat it: not asked
    rounds = 0
    while d.source == "long" and rounds < 10:  # the long drafts keep failing at once: its acceptance falls
        chain.accept(0)
        d, rounds = chain.draft_round([0], 8, 64, GREEDY, rng, None), rounds + 1
    assert d.source == "short" and d.tokens == [1, 2] and long_.accepted == [0] * rounds and 2 <= rounds <= 6
    assert chain.name == "long,short"


class Priced:
    """The adaptive controller's say in a chain's draft (``DraftLength``'s Gate): what a verified position and a draft
    step cost, in accepted tokens' worth, and every token taken."""

    def __init__(self, position, step):
        self.position, self.step, self.taken = position, step, 0

    def prices(self):
        return self.position, self.step

    def take(self, signal):
        self.taken += 1
        return True

    def look_further(self):
        return True


class Signalled(Fixed):
    """A model drafter whose tokens come with signals, through the gate (as ``ModelDrafter.propose``), each draft
    call counted as the draft's ``n_evals``."""

    SIGNAL_EDGES, SIGNAL_PRIOR = (1.0,), (0.5, 0.9)

    def __init__(self, name, tokens, signals):
        super().__init__(name, tokens)
        self.signals = signals

    def draft_round(self, history, n_max, limit, sp, rng, gate):
        self.asked += 1
        d = Draft(signals=[], n_evals=1, first_s=0.01, n_first=1)
        for tok, sig in zip(self.tokens[: min(n_max, limit)], self.signals):
            if not gate.take(sig):
                break
            d.tokens.append(tok)
            d.signals.append(sig)
        d.n_evals = max(len(d.tokens), 1)
        return d


def judged(chain, member, rate, n=100):
    """``member`` of ``chain`` measured: ``rate`` of n tokens accepted (each signal bucket alike)."""
    m = chain.members[member]
    m.accepted, m.verified = rate * n, n
    for counts in m.buckets:
        counts[:] = [rate * n, n]


def test_where_verifying_costs_a_draft_is_worth_its_accepted_tokens_less_its_positions():
    """Each position of the verification batch is paid, held or not: on the starter's CPU a lookup's 18-token drafts
    (a key of 2 tokens), right from their first token one time in four, made a chain with the draft model slower
    than either alone (replays: 1.00-1.07x against 1.81x and 1.28x). Under the controller a draft is worth its expected
    accepted tokens less its positions at the controller's prices, and cut where it is worth most."""
    rng = np.random.default_rng(0)

    def chain(lookup_rate, model_rate):
        c = ChainDrafter([(Fixed("lookup", list(range(5, 25)), lookup=True), False),
                          (Signalled("model", [1, 2, 3, 4], [2.0] * 4), True)])
        judged(c, 0, lookup_rate)
        judged(c, 1, model_rate)
        return c

    # llama.cpp's rule (no controller): a lookup right 80% of the time, worth 3.95 accepted tokens, beats the
    # model's 3.1, all 20 of its tokens verified
    assert len(chain(0.8, 0.9).draft_round([0], 4, 64, GREEDY, rng, None).tokens) == 20
    # at 0.15 a position and 0.4 a draft step: its first 8 tokens are worth the most (0.8^9 = 0.13 < 0.15: the 9th
    # is reached and accepted too rarely to pay its place), 3.3 - 8 x 0.15; the model's four could not beat that
    # even before its draft steps (3.1 - 4 x 0.55): it is not asked
    c = chain(0.8, 0.9)
    d = c.draft_round([0], 4, 64, GREEDY, rng, Priced(0.15, 0.4))
    assert d.source == "lookup" and d.tokens == list(range(5, 13)) and c.members[1].drafter.asked == 0
    assert not d.sized  # the controller sizes the model's drafts: a lookup's say nothing of their acceptance
    # a lookup right 60% of the time is worth 0.73 (its first 3 tokens); a model draft accepted 99%, 3.3
    c = chain(0.6, 0.99)
    gate = Priced(0.15, 0.4)
    d = c.draft_round([0], 4, 64, GREEDY, rng, gate)
    assert d.source == "model" and d.tokens == [1, 2, 3, 4] and d.sized and gate.taken == 4
    assert d.signals == [2.0] * 4 and d.n_evals == 4  # the controller sees the model's own signals and calls


def test_a_lookup_round_reports_the_draft_calls_spent_and_leaves_the_controllers_acceptance():
    """A round the lookup won after the model drafted still cost the model's calls: the draft reports them (timed
    as the lookup's, a token's cost read 4 draft calls over 3 free tokens), and the controller, which sizes the
    model's drafts, learns nothing of the model's acceptance from the lookup's tokens."""
    from app.engine.draft_control import DraftLength

    rng = np.random.default_rng(0)
    c = ChainDrafter([(Fixed("lookup", [5, 6, 7], lookup=True), False),
                      (Signalled("model", [1, 2, 3, 4], [0.5] * 4), True)])
    judged(c, 0, 0.95)
    judged(c, 1, 0.95)
    c.members[1].buckets[0][:] = [30, 100]  # its near-ties (under 1.0), all four tokens here: worth less
    d = c.draft_round([0], 4, 64, GREEDY, rng, Priced(0.1, 0.0))
    assert d.source == "lookup" and d.tokens == [5, 6, 7] and d.n_evals == 4 and d.first_s == 0.01
    control = DraftLength(DraftParams(draft_max=8, adaptive=True), c.SIGNAL_EDGES, c.SIGNAL_PRIOR)
    control.record(Draft(tokens=[1, 2], signals=[2.0, 2.0], n_evals=2), 2, 2, 0.02, 0.05)  # a model round
    before = control.acceptance()
    control.record(d, 3, 0, 0.05, 0.08)
    assert control.acceptance() == before  # three lookup tokens, none accepted: not the model's to answer for
    c.accept(0)
    assert c.members[0].verified == 101 and c.members[1].verified == 100  # the lookup's own rate learned it


def test_the_lookups_draft_when_the_controller_turns_the_model_off():
    """The controller turns drafting off (0 tokens) where the model's drafts do not pay; a lookup costs nothing to ask,
    and drafts what it finds worth its positions. A round that replays recurrent state (limit 0) drafts nothing."""
    rng = np.random.default_rng(0)
    c = ChainDrafter([(Fixed("lookup", [7, 8, 9], lookup=True), False), (Signalled("model", [1], [2.0]), True)])
    judged(c, 0, 0.9)
    d = c.draft_round([0], 0, 64, GREEDY, rng, Priced(0.2, 0.5))
    assert d.tokens == [7, 8, 9] and c.members[1].drafter.asked == 0
    assert c.draft_round([0], 0, 0, GREEDY, rng, Priced(0.2, 0.5)).tokens == []
    assert c.SIGNAL_EDGES == Signalled.SIGNAL_EDGES  # the controller reads the model's signals


def test_under_a_grammar_a_lookups_proposal_does_not_pass_through_the_models_gate():
    """A grammar asks the chain for proposals directly: the controller's gate reads the model's signals (logit gaps),
    so a lookup proposes without it (its support read as a gap would be judged as one) and its draft is not sized."""
    rng = np.random.default_rng(0)
    c = ChainDrafter([(NgramSimple(NgramParams(simple_size_n=1, simple_size_m=3)), False),
                      (Signalled("model", [1], [2.0]), True)])
    gate = Priced(0.2, 0.5)
    c.begin([9, 4, 5, 6, 7, 8])
    d = c.propose([9, 4, 5, 6, 7, 8, 4], 3, GREEDY, rng, gate)
    assert d.tokens == [5, 6, 7] and d.source == "ngram-simple" and not d.sized and gate.taken == 0


def test_an_empty_draft_leaves_the_round_to_the_others_and_none_is_no_draft():
    rng = np.random.default_rng(0)
    chain = ChainDrafter([(Fixed("lookup", []), False), (Fixed("model", [3, 4]), True)])
    assert chain.draft_round([0], 8, 64, GREEDY, rng, None).source == "model"
    chain = ChainDrafter([(Fixed("a", []), False), (Fixed("b", []), False)])
    d = chain.draft_round([0], 8, 64, GREEDY, rng, None)
    assert d.tokens == [] and d.source == ""
    chain.accept(0)  # nothing was drafted: nothing to learn


def test_chains_are_named_as_llama_cpp_names_them():
    assert registry.drafter_for("draft-mtp,ngram-mod") == "mtp,ngram-mod"
    assert registry.drafter_for(["draft-simple", "ngram-map-k"]) == "model,ngram-map-k"
    assert registry.label("model,ngram-mod") == "draft model + n-gram lookup (ngram-mod)".replace(
        "draft model", registry.label("model"))
    with pytest.raises(EngineError, match="Unknown speculative type 'eagle'"):
        registry.drafter_for("draft-mtp,eagle")


def test_the_api_takes_speculative_type_as_a_list_or_a_comma_string():
    from app.chat.settings import Settings
    from app.server.requests.openai import ApiError, parse

    msgs = [{"role": "user", "content": "hi"}]
    usable = ("model", "ngram", "none")
    for given in (["draft-simple", "ngram-mod"], "draft-simple,ngram-mod"):
        job = parse({"messages": msgs, "speculative": {"type": given}}, True, Settings(), usable)
        assert job.drafter == "model,ngram-mod"
    job = parse({"messages": msgs, "speculative.type": "ngram-mod", "speculative": {"ngram_mod_n_match": 8},
                 "speculative.ngram_size_n": 3}, True, Settings(), usable)
    assert job.drafter == "ngram-mod" and job.params.draft.ngram.mod_n_match == 8
    assert job.params.draft.ngram.simple_size_n == 3  # llama-server's name for ngram-simple's
    with pytest.raises(ApiError, match="speculative.ngram_mod_n_match"):
        parse({"messages": msgs, "speculative": {"ngram_mod_n_match": "x"}}, True, Settings(), usable)
    with pytest.raises(ApiError, match="--spec-ngram-mod-n-match 0"):
        parse({"messages": msgs, "speculative": {"ngram_mod_n_match": 0}}, True, Settings(), usable)


def run(engine, ids, drafter, n, events=None, **draft):
    """The generation's Done (``events``: a list the events are put in)."""
    engine.reset()
    events = [] if events is None else events
    events += engine.generate(ids, GenerationParams(max_tokens=n, draft=DraftParams(**draft)), drafter)
    assert isinstance(events[-1], Done)
    return events[-1]


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", [False, True])  # llama.cpp's rule; drafts priced, the model's sized
def test_a_draft_model_and_ngram_mod_together_are_greedy_identical(starter_engine, adaptive):
    ids = chat_tokens(starter_engine.model, [{"role": "user", "content": REPEAT}])
    plain = run(starter_engine, ids, "none", 96)
    small = NgramParams(mod_n_match=4, mod_n_min=2, mod_n_max=16)
    events: list = []
    done = run(starter_engine, ids, "model,ngram-mod", 96, events, draft_max=6, draft_p_min=0.0, ngram=small,
               adaptive=adaptive)
    s = done.stats
    assert done.token_ids == plain.token_ids and s.drafter == "ngram-mod,model"
    assert set(s.by_drafter) == {"model", "ngram-mod"}  # both drafted some rounds
    assert sum(r for r, _, _ in s.by_drafter.values()) <= s.n_rounds
    assert sum(d for _, d, _ in s.by_drafter.values()) == s.n_drafted
    assert sum(a for _, _, a in s.by_drafter.values()) == s.n_accepted
    # each drafted piece of text says which member drafted it, as the chat colours it; the target's say none
    texts = [e for e in events if isinstance(e, TextDelta)]
    named = {e.drafter for e in texts if e.from_draft}
    assert {n for n, (_, _, a) in s.by_drafter.items() if a >= 3} <= named <= set(s.by_drafter) and named
    assert all(e.drafter == "" for e in texts if not e.from_draft)
    live = Live()
    for e in events:
        live.add(e)
    assert {o for _, o in live.segments} == {False, *named} and live.text == done.text


@pytest.fixture(scope="module")
def mtp_engine(tmp_path_factory):
    e = Engine(ModelSettings(HEADS["mtp"].write(tmp_path_factory.mktemp("mtp"))[0], n_ctx=1024))
    yield e
    e.close()


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("chain", ["mtp,ngram-mod", "mtp,ngram-simple", "ngram-cache,mtp"])
def test_mtp_layers_with_a_lookup_are_greedy_identical(mtp_engine, chain, adaptive):
    ids = chat_tokens(mtp_engine.model, [{"role": "user", "content": "the cat sat on the mat " * 6}])
    plain = run(mtp_engine, ids, "none", 120)
    small = NgramParams(simple_size_n=2, simple_size_m=6, mod_n_match=2, mod_n_min=1, mod_n_max=6)
    done = run(mtp_engine, ids, chain, 120, draft_max=4, draft_p_min=0.0, ngram=small, adaptive=adaptive)
    assert done.token_ids == plain.token_ids and done.stats.n_drafted > 0
    assert sum(d for _, d, _ in done.stats.by_drafter.values()) == done.stats.n_drafted
    assert "mtp" in done.stats.by_drafter


def test_a_chain_the_pair_cannot_run_is_refused_in_words(models):
    e = Engine(ModelSettings(models["target"], n_ctx=128))
    try:
        with pytest.raises(EngineError, match="no MTP"):
            list(e.generate([1, 300, 301], GenerationParams(max_tokens=4), "mtp,ngram-mod"))
    finally:
        e.close()


def test_the_cli_runs_a_chain_and_says_what_each_member_contributed(models):
    from test_cli import cli

    common = ["--target", models["target"], "--draft", models["close_draft"], "--prompt", "the cat", "--json",
              "--max-tokens", 40, "--draft-p-min", 0, "--no-adaptive"]
    plain = json.loads(cli("generate", *common, "--drafter", "none").stdout)
    r = cli("generate", *common, "--spec-type", "draft-simple,ngram-simple", "--spec-ngram-simple-size-n", 1,
            "--spec-ngram-simple-size-m", 4)
    assert r.returncode == 0, r.stderr
    chain = json.loads(r.stdout)
    assert chain["token_ids"] == plain["token_ids"] and chain["drafter"] == "ngram-simple,model"
    assert sum(c["drafted"] for c in chain["by_drafter"].values()) == chain["n_drafted"] > 0


def test_the_live_panel_and_the_details_say_what_each_member_contributed():
    from app.engine import Stats
    from app.ui.render import live_panel, stats_details

    s = Stats(drafter="ngram-mod,model", n_drafted=10, n_accepted=9, n_rounds=3,
              by_drafter={"ngram-mod": (2, 8, 8), "model": (1, 2, 1)})
    panel, details = live_panel(s, [], "done"), stats_details(s)
    for text in (panel, details):
        assert "(ngram-mod): 2 rounds, 8/8 accepted" in text and ": 1 round, 1/2 accepted" in text
    assert list(Stats.from_dict(json.loads(json.dumps(s.as_dict()))).by_drafter["model"]) == [1, 2, 1]  # saved with the conversation and back


def test_a_wrapper_reads_its_drafter_through_and_a_chain_on_images_is_a_new_one():
    """What a wrapper does not change is its drafter's, read at the time (never a copy that could drift), and
    on a prompt with images a chain's text drafters are wrapped in a new chain: the one given is left as it was."""
    from app.engine.images import TextOnly, for_images

    model = Fixed("draft", [1, 2], prior=0.7)
    wrapped = TextOnly(model)
    assert (wrapped.name, wrapped.SIGNAL_PRIOR, wrapped.speculates, wrapped.p_min) == ("draft", (0.7,), True, 0.0)
    assert wrapped.with_p_min(0.4) is wrapped and model.p_min == wrapped.p_min == 0.4
    model.SIGNAL_PRIOR = (0.2,)
    assert wrapped.SIGNAL_PRIOR == (0.2,)
    chain = ChainDrafter([(model, True), (NgramSimple(NgramParams()), False)])
    on_images = for_images(chain)
    assert on_images is not chain and [m.drafter for m in chain.members][0] is model
    assert all(isinstance(m.drafter, TextOnly) for m in on_images.members) and on_images.name == chain.name
