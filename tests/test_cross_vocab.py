"""Drafting across vocabularies (issue 24): a draft whose tokenizer differs from the target's proposes through text.

Tiny fixtures: the target, and drafts computing nearly the same text function in other vocabularies: the same
pieces at other token ids, and in one also pieces the target lacks (so its tokenizer merges "the" and "cat" where
the target's spells them in bytes).
"""
from dataclasses import replace

import pytest

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, Round, SamplingParams
from app.engine.llama import Context, Model
from app.engine.drafters import TextDrafter
from app.prompts import chat_tokens
from support.tiny_gguf import write_model

MERGES = ("▁t", "▁th", "▁c", "▁ca", "he", "at")  # with the existing "▁the" and "▁cat": merges the target lacks


@pytest.fixture(scope="module")
def xv(tmp_path_factory):
    d = tmp_path_factory.mktemp("cross-vocab")
    target = write_model(d / "target.gguf", seed=1)
    drafts = {
        "permuted": write_model(d / "permuted.gguf", seed=2, base_seed=1, noise=0.05, permute_seed=7),
        "merges": write_model(d / "merges.gguf", seed=3, base_seed=1, noise=0.05, permute_seed=9,
                              extra_pieces=MERGES),
    }
    engine = Engine(ModelSettings(target, n_ctx=512))
    models = {k: Model(p) for k, p in drafts.items()}
    ctxs = {k: Context(m, 512, 1, n_outputs_max=1) for k, m in models.items()}
    yield engine, ctxs
    for c in ctxs.values():
        c.close()
    for m in models.values():
        m.close()
    engine.close()


def run(engine, ids, drafter, sp=SamplingParams(), max_tokens=160, cancel_after=None):
    params = GenerationParams(max_tokens=max_tokens, sampling=sp, draft=DraftParams(draft_max=6, draft_p_min=0.0))
    rounds = []
    for ev in engine.generate(ids, params, drafter):
        if isinstance(ev, Round):
            rounds.append(ev)
        if isinstance(ev, Done):
            return ev, rounds


@pytest.mark.parametrize("kind", ["permuted", "merges"])
def test_vocabularies_really_differ(xv, kind):
    engine, ctxs = xv
    t, d = engine.model, ctxs[kind].model
    text = "I like code, you ran to a big red sun. the cat"
    assert t.tokenize(text) != d.tokenize(text)
    assert t.token_text(283) != d.token_text(283)


@pytest.mark.parametrize("kind", ["permuted", "merges"])
@pytest.mark.parametrize("prompt", ["I like code, you", "the cat sat on the mat and the dog ran to", "héllo wörld ☀ 🐱 ,"])
def test_greedy_output_is_identical_with_a_draft_of_another_vocabulary(xv, kind, prompt):
    engine, ctxs = xv
    ids = chat_tokens(engine.model, [{"role": "user", "content": prompt}])
    plain, _ = run(engine, ids, "none")
    spec, rounds = run(engine, ids, TextDrafter(ctxs[kind], engine.model))
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    assert spec.stats.n_drafted > 0 and 0 < spec.stats.n_accepted < spec.stats.n_drafted  # partial acceptance


def test_a_stop_string_across_a_token_boundary_stops_both_alike(xv):
    engine, ctxs = xv
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat and the dog ran to"}])
    plain, _ = run(engine, ids, "none")
    text = plain.text
    stop = next(text[i : i + 5] for i in range(20, len(text) - 5) if text[i : i + 5].isprintable())
    params = GenerationParams(max_tokens=160, stop=(stop,), draft=DraftParams(draft_max=6, draft_p_min=0.0))
    a = list(engine.generate(ids, params, "none"))[-1]
    b = list(engine.generate(ids, params, TextDrafter(ctxs["merges"], engine.model)))[-1]
    assert a.finish_reason == b.finish_reason == "stop" and stop not in a.text
    assert (a.text, a.token_ids) == (b.text, b.token_ids)


def test_cancel_mid_answer_then_the_next_answer_is_still_identical(xv):
    import threading

    engine, ctxs = xv
    drafter = TextDrafter(ctxs["permuted"], engine.model)
    ids = chat_tokens(engine.model, [{"role": "user", "content": "I like code, you"}])
    cancel = threading.Event()
    params = GenerationParams(max_tokens=160, draft=DraftParams(draft_max=6, draft_p_min=0.0))
    for ev in engine.generate(ids, params, drafter, cancel=cancel):
        if isinstance(ev, Round) and ev.stats.n_rounds == 5:
            cancel.set()
        if isinstance(ev, Done):
            assert ev.finish_reason == "cancelled"
    plain, _ = run(engine, ids, "none")
    spec, _ = run(engine, ids, drafter)
    assert spec.token_ids == plain.token_ids


def test_sampled_output_keeps_the_target_distribution(xv):
    """A text proposal is deterministic (one-hot q): the target's distribution is kept exactly."""
    from test_exact_sampling import compare, samples

    engine, ctxs = xv
    drafter = TextDrafter(ctxs["merges"], engine.model)
    plain, _ = samples(engine, [1, 300, 301, 302], "none", seed0=40_000)
    spec, drafted = samples(engine, [1, 300, 301, 302], drafter, draft_max=3, draft_p_min=0.0)
    assert drafted > 500
    compare(plain, spec)


def test_greedy_output_under_a_grammar_is_identical_with_a_draft_of_another_vocabulary(xv):
    """The target's tokens of the draft's text go to the grammar one by one, as any drafter's."""
    from app.engine.grammar import Grammar

    engine, ctxs = xv
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat and the dog ran to"}])
    params = GenerationParams(max_tokens=60, sampling=SamplingParams(temperature=0.0), grammar=Grammar.lark(
        r"start: /([^xyz]{1,6}xyz)+/", "test"), draft=DraftParams(draft_max=6, draft_p_min=0.0))
    plain = list(engine.generate(ids, replace(params, draft=DraftParams(draft_max=0)), "none"))[-1]
    spec = list(engine.generate(ids, params, TextDrafter(ctxs["merges"], engine.model)))[-1]
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 60
    assert spec.stats.n_forced > 0 and spec.stats.n_drafted > spec.stats.n_forced
