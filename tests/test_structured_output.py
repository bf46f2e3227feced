"""Structured output in the engine: answers under a grammar (llguidance), exact under speculation, with the tokens
the grammar forces drafted free. Real llama.cpp on the starter pair and on tiny written models."""
from __future__ import annotations

import json
import re
from collections import Counter

import jsonschema
import pytest

from app.engine import Done, DraftParams, EngineError, GenerationParams, SamplingParams
from app.engine.drafters import Draft, Drafter, stop_at
from app.engine.grammar import Grammar
from app.prompts import chat_tokens

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}}}
ASK = [{"role": "user", "content": "Describe a fictional person as JSON with a name, an age and hobbies."}]


def run(engine, ids, drafter, grammar, max_tokens=120, sampling=None, **draft) -> Done:
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling or SamplingParams(temperature=0.0),
                              draft=DraftParams(**draft), grammar=grammar)
    events = list(engine.generate(ids, params, drafter))
    assert isinstance(events[-1], Done)
    return events[-1]


@pytest.mark.parametrize("drafter, draft", [("model", dict(draft_max=8, draft_p_min=0.0)),
                                            ("model", dict(draft_max=12, adaptive=True)),
                                            ("ngram", dict(draft_max=8)),
                                            ("model,ngram-mod", dict(draft_max=12, adaptive=True))])
def test_greedy_answer_under_a_schema_is_valid_and_identical_with_speculation(starter_engine, drafter, draft):
    ids = chat_tokens(starter_engine.model, ASK)
    grammar = Grammar.json_schema(PERSON)
    plain = run(starter_engine, ids, "none", grammar, draft_max=0)
    starter_engine.forget_costs()  # (adaptive: measure afresh, so the first round drafts whatever earlier runs timed)
    spec = run(starter_engine, ids, drafter, grammar, **draft)
    assert plain.finish_reason == "stop"
    jsonschema.validate(json.loads(plain.text), PERSON)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    s = spec.stats
    assert s.n_drafted > 0 and 0 < s.n_accepted <= s.n_drafted  # drafted tokens went through the target
    assert 0 < s.n_forced_accepted <= s.n_forced <= s.n_drafted  # the grammar's own tokens joined the draft
    assert s.grammar_seconds > 0 and plain.stats.n_forced == 0  # (speculation off drafts nothing, forced or not)


def test_unconstrained_the_starter_does_not_answer_in_json(starter_engine):
    """The check above has teeth: without the schema this prompt does not give parseable JSON of that shape."""
    done = run(starter_engine, chat_tokens(starter_engine.model, ASK), "model", None, draft_max=8)
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(done.text), PERSON)


class Proposes(Drafter):
    """A drafter that proposes given tokens whatever the history (to put a forbidden token before the grammar)."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens
        self.calls = 0

    def begin(self, prompt_ids):
        pass

    def propose(self, history, n_max, sp, rng, gate=None, stop=None):
        self.calls += 1
        tokens = list(self.tokens[:n_max])
        tokens = tokens[: stop_at(tokens, stop)]
        return Draft(tokens=tokens)


def test_forbidden_and_end_of_generation_draft_tokens_are_rejected_not_fed_to_the_grammar(starter_engine):
    ids = chat_tokens(starter_engine.model, ASK)
    grammar = Grammar.json_schema(PERSON)
    model = starter_engine.model
    letter = model.tokenize("x", add_special=False)[0]  # never allowed where JSON structure is expected... mostly
    eog = model.eos  # an end of generation while the object is unfinished
    plain = run(starter_engine, ids, "none", grammar, draft_max=0)
    for tokens in ([eog, eog], [letter, eog, letter]):
        drafter = Proposes(tokens)
        done = run(starter_engine, ids, drafter, grammar, draft_max=4, draft_p_min=0.0)
        assert drafter.calls > 0 and done.token_ids == plain.token_ids  # greedy: cut where the grammar forbids
    sampled = SamplingParams(temperature=0.8, seed=5)
    for tokens in ([eog, eog], [letter, letter]):
        done = run(starter_engine, ids, Proposes(tokens), grammar, sampling=sampled, draft_max=4, draft_p_min=0.0)
        # sampling keeps the forbidden token in the draft (cutting before it would bias the output): the target
        # rejects it and the answer still follows the grammar
        assert done.stats.n_drafted > done.stats.n_accepted
        assert done.finish_reason in ("stop", "length")
        if done.finish_reason == "stop":
            jsonschema.validate(json.loads(done.text), PERSON)


def test_a_drafters_run_ends_where_the_grammar_starts_forcing_and_the_forced_tokens_come_free(starter_engine):
    """A drafter proposing the right JSON is stopped after `",`: from there the grammar forces ` "age": `, whose
    tokens join the draft as forced (a draft model would pay a step for each). Called again after them, it proposes
    the same text, which the grammar forbids where the integer goes: greedy, that run is cut."""
    from app.engine.constraint import Constrained, Constraint
    from app.engine.sampling import Noise

    model = starter_engine.model
    grammar = Grammar.json_schema(PERSON)
    constraint = Constraint(grammar, model)
    for tok in model.tokenize('{"name": "', add_special=False):
        constraint.commit(tok)
    proposes = Proposes(model.tokenize('Ann", "age": 30, "hobbies": []}', add_special=False))
    pieces = lambda ids: [model.piece(t).decode() for t in ids]  # noqa: E731
    assert pieces(proposes.tokens[:2]) == ["Ann", '",']
    draft = Constrained(proposes, constraint).draft_round([], n_max=8, limit=20, sp=SamplingParams(temperature=0.0),
                                                         rng=Noise(0), gate=None)
    n = len(draft.tokens)
    assert pieces(draft.tokens[:2]) == ["Ann", '",'] and draft.forced[:2] == [False, False]
    assert "".join(pieces(draft.tokens[2:])) == ' "age": ' and draft.forced[2:] == [True] * (n - 2)
    assert proposes.calls == 2
    # the grammar is left where it was: the rest of the object, from the name on, still completes it
    assert constraint.valid_prefix(proposes.tokens) == len(proposes.tokens)


def test_prompt_lookup_does_not_draft_after_forced_tokens(starter_engine):
    """A lookup keyed on forced tokens finds the structure that repeats at every key: after ` "age": ` it would
    propose the `30` of an earlier object. It drafts only where nothing was forced before it in the round."""
    from app.engine.constraint import Constrained, Constraint
    from app.engine.drafters import NgramParams
    from app.engine.drafters.ngram import NgramSimple
    from app.engine.sampling import Noise

    model = starter_engine.model
    constraint = Constraint(Grammar.json_schema(PERSON), model)
    answer = model.tokenize('{"name": "Ann",', add_special=False)
    for tok in answer:
        constraint.commit(tok)
    history = model.tokenize('Like {"name": "Bo", "age": 30, "hobbies": []} ', add_special=False) + answer
    ngram = NgramSimple(NgramParams(simple_size_n=2, simple_size_m=8))  # llama.cpp's ngram-simple, short keys
    ngram.begin(history)
    draft = Constrained(ngram, constraint).draft_round(history, n_max=8, limit=20,
                                                      sp=SamplingParams(temperature=0.0), rng=Noise(0), gate=None)
    text = lambda ids: "".join(model.piece(t).decode() for t in ids)  # noqa: E731
    assert text(draft.tokens) == ' "age": ' and all(draft.forced)
    # (asked, the lookup would have gone on with the earlier object's age)
    looked_up = ngram.propose(history + draft.tokens, 8, SamplingParams(temperature=0.0), Noise(0)).tokens
    assert text(looked_up).startswith("30")


def test_an_answer_cut_by_max_tokens_inside_the_structure_ends_as_length(starter_engine):
    done = run(starter_engine, chat_tokens(starter_engine.model, ASK), "model", Grammar.json_schema(PERSON),
               max_tokens=6, draft_max=8)
    assert done.finish_reason == "length" and len(done.token_ids) == 6 and done.text.startswith('{"name": "')


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/nope"}}}, "nope"),
    ({"type": "strnig"}, "strnig"),
    ("{not json", "not valid JSON"),
    ([1, 2], "must be an object"),
])
def test_a_schema_the_library_rejects_is_a_clear_error_before_anything_runs(schema, words):
    with pytest.raises(EngineError, match=re.escape(words)):
        Grammar.json_schema(schema)


def test_gbnf_grammars_constrain_the_answer(starter_engine):
    g = Grammar.gbnf('root ::= "The answer is " ("yes" | "no") "."')
    ids = chat_tokens(starter_engine.model, [{"role": "user", "content": "Is the sky blue?"}])
    plain = run(starter_engine, ids, "none", g, draft_max=0)
    spec = run(starter_engine, ids, "model", g, draft_max=8, draft_p_min=0.0)
    assert plain.text in ("The answer is yes.", "The answer is no.") and plain.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids and spec.stats.n_forced > 0
    with pytest.raises(EngineError, match="GBNF|grammar"):
        Grammar.gbnf('root ::= "unclosed')


# --- sampling under a grammar follows the target's masked distribution -------------------------------------------
N = 1500
SP = SamplingParams(temperature=1.3, top_k=6, top_p=1.0, min_p=0.0)
PATTERN = r"((a|b|c)(d|e)xy)+"


def test_sampled_output_under_a_grammar_follows_the_target_distribution(tiny_engine):
    """Letters (byte tokens in the tiny vocabulary): a mask that keeps three tokens, then two, then forces two.
    Two-sample chi-square per position, as tests/test_exact_sampling.py does without a grammar."""
    from test_exact_sampling import compare

    grammar = Grammar.gbnf(f"start: /{PATTERN}/")
    ids = [1, 300, 301, 302]

    def samples(drafter, seed0, **draft):
        out, drafted, forced = [], 0, 0
        for s in range(seed0, seed0 + N):
            sp = SamplingParams(SP.temperature, SP.top_k, SP.top_p, SP.min_p, seed=s)
            done = run(tiny_engine, ids, drafter, grammar, max_tokens=3, sampling=sp, **draft)
            assert len(done.token_ids) == 3
            out.append(tuple(done.token_ids))
            drafted += done.stats.n_drafted
            forced += done.stats.n_forced
        return out, drafted, forced

    plain, _, _ = samples("none", 50_000, draft_max=0)
    spec, drafted, forced = samples("model", 60_000, draft_max=3, draft_p_min=0.0)
    text = tiny_engine.detokenize
    assert all(re.fullmatch(r"[abc][de]x", text(list(t))) for t in plain + spec)
    assert len(Counter(t[0] for t in plain)) == 3 and len(Counter(t[1] for t in plain)) == 2  # they compete
    assert drafted > N and forced > 0  # speculation ran, forced tokens (the x) included
    compare(plain, spec)
    # The random tiny draft seldom proposes a letter; this one proposes d or a forbidden z, from a known q, so
    # the grammar's cut and the residual draw are really exercised (cutting before a forbidden token fails here).
    spec, drafted, forced = samples(SamplesQ({"d": 0.6, "z": 0.4}, tiny_engine.model), 70_000, draft_max=3)
    assert drafted > N and forced > 0
    compare(plain, spec)


class SamplesQ(Drafter):
    """Drafts one letter sampled from a fixed distribution q (and reports q, as a draft model does)."""

    name = "fixed-q"

    def __init__(self, q: dict[str, float], model):
        import numpy as np

        from app.engine.sampling import Dist

        ids = {model.tokenize(c, add_special=False)[-1]: p for c, p in q.items()}
        order = sorted(ids)
        self.q = Dist(np.array(order), np.array([ids[i] for i in order]))

    def begin(self, prompt_ids):
        pass

    def propose(self, history, n_max, sp, rng, gate=None, stop=None):
        from app.engine.sampling import sample

        tok = sample(self.q, rng)
        if stop:
            stop(tok)
        return Draft(tokens=[tok])


def test_a_draft_that_ends_the_answer_early_leaves_the_grammar_where_the_target_is(starter_engine):
    """A draft closing the object and ending the answer (`"}` then the end token) is valid wherever a string value
    is open, and the target rejects it there. The end token must not be fed to the grammar while drafting: rolling
    it back took one token too many (llguidance keeps no history entry for it), the grammar fell a token behind the
    target, and the answer went wrong (a json_object answer that did not parse, from adaptive drafting)."""
    ids = chat_tokens(starter_engine.model, [{"role": "user", "content": "Name three colours of the rainbow."}])
    model = starter_engine.model
    grammar = Grammar.json_object()
    plain = run(starter_engine, ids, "none", grammar, max_tokens=80, draft_max=0)
    drafter = Proposes(model.tokenize('"}', add_special=False) + [model.eos])
    spec = run(starter_engine, ids, drafter, grammar, max_tokens=80, draft_max=4, draft_p_min=0.0)
    assert drafter.calls > 3 and spec.stats.n_drafted > spec.stats.n_accepted  # proposed, and turned down
    assert spec.token_ids == plain.token_ids
    assert plain.finish_reason == "length" or isinstance(json.loads(plain.text), dict)
