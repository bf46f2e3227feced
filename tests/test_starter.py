"""Real-model checks on the offline starter pair (SmolLM2-135M-Instruct F32 target, Q4_1 draft)."""
import json
from pathlib import Path

import pytest

from app.engine import Done, DraftParams, GenerationParams
from app.engine.drafters import NgramParams
from app.prompts import chat_tokens

PROMPTS = [json.loads(line) for f in ("chat.jsonl", "repeat.jsonl")
           for line in (Path(__file__).parent / "prompts" / f).read_text().splitlines() if line.strip()]


def generate(engine, messages, drafter, max_tokens, **draft):
    engine.reset()  # each run starts cold: no run profits from another's cache
    params = GenerationParams(max_tokens=max_tokens, draft=DraftParams(**draft))
    done = list(engine.generate(chat_tokens(engine.model, messages), params, drafter))[-1]
    assert isinstance(done, Done)
    return done


@pytest.mark.slow
@pytest.mark.parametrize("case", PROMPTS, ids=[f"{p['category']}{i}" for i, p in enumerate(PROMPTS)])
def test_greedy_output_identical_with_model_and_ngram_drafting(starter_engine, case):
    messages = [{"role": "user", "content": case["prompt"]}]
    n = 192 if case["category"] in ("repeat", "edit", "code-edit") else 160
    plain = generate(starter_engine, messages, "none", n)
    assert plain.stats.n_tokens >= 64
    model = generate(starter_engine, messages, "model", n, draft_max=8, draft_p_min=0.0)
    assert model.token_ids == plain.token_ids
    assert model.stats.acceptance_rate > 0.5
    ngram = generate(starter_engine, messages, "ngram", n, draft_max=12)  # ngram-mod, llama.cpp's settings
    assert ngram.token_ids == plain.token_ids
    if case["category"] in ("repeat", "edit", "code-edit"):  # (elsewhere it verifies as ngram-mod did: 110 s saved)
        # short keys and drafts (llama.cpp's defaults, 12-24 token keys, suit long contexts)
        short = generate(starter_engine, messages, "ngram-simple", n,
                         ngram=NgramParams(simple_size_n=3, simple_size_m=12))
        assert short.token_ids == plain.token_ids
        assert short.stats.n_accepted > 0.3 * short.stats.n_tokens  # the answer repeats the prompt: lookups pay


@pytest.mark.slow
def test_adaptive_mode_is_identical_too(starter_engine):
    messages = [{"role": "user", "content": PROMPTS[0]["prompt"]}]
    plain = generate(starter_engine, messages, "none", 128)
    for drafter in ("model", "ngram"):
        spec = generate(starter_engine, messages, drafter, 128, draft_max=12, adaptive=True)
        assert spec.token_ids == plain.token_ids


@pytest.mark.slow
def test_second_chat_turn_reuses_the_cache_and_matches_a_cold_run(starter_engine):
    turn1 = [{"role": "user", "content": "Name three primary colors."}]
    first = generate(starter_engine, turn1, "model", 48)
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Now three more."}]
    params = GenerationParams(max_tokens=48)
    warm = list(starter_engine.generate(chat_tokens(starter_engine.model, turn2), params, "model"))[-1]
    assert warm.stats.prompt_cached > 0.6 * len(chat_tokens(starter_engine.model, turn1))
    cold = generate(starter_engine, turn2, "none", 48)
    assert warm.token_ids == cold.token_ids


@pytest.mark.slow
def test_continue_after_the_token_limit_writes_what_one_longer_answer_would(specchat_home):
    """Greedy, an answer cut at 24 tokens and continued for 24 more is the 48-token answer: the prompt continues
    the answer's text (as llama-server continues a final assistant message) and the cache it left is reused."""
    from app.chat.live_answer import Live
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    rt = Runtime()
    rt.load(LoadSpec(pair="starter"))
    try:
        msgs = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
        whole = list(rt.answer(msgs, Settings(max_tokens=48, temperature=0.0)))[-1]
        part = list(rt.answer(msgs, Settings(max_tokens=24, temperature=0.0)))[-1]
        assert part.done.finish_reason == "length" and whole.text.startswith(part.text) and whole.text != part.text
        more = list(rt.answer(msgs, Settings(max_tokens=24, temperature=0.0),
                              continues=Live.going_on(part.text, part.segments, part.stats.as_dict())))[-1]
        assert more.text == whole.text and more.stats.n_tokens == whole.stats.n_tokens == 48
        assert more.stats.n_drafted > 0 and more.done.stats.prompt_tokens < 8  # only the tail read anew
    finally:
        rt.close()


@pytest.mark.slow
def test_chat_template_comes_from_the_gguf(starter_engine):
    ids = chat_tokens(starter_engine.model, [{"role": "user", "content": "Hi"}])
    text = "".join(starter_engine.model.piece_special(t) for t in ids)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" in text  # the template's own default system prompt
