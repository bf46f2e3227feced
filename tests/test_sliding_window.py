"""Gemma 3's sliding-window attention (llama.cpp's SWA cache) stays exact through everything the chat does with a
cache: rejected-draft rollback, chat-turn prefix reuse, Regenerate and an edited earlier turn, in a conversation
far longer than the window. A tiny gemma3-architecture pair the tests write attends to 32 positions (every sixth
layer to all) in a chat of ~2500 tokens. Each greedy answer must equal the one computed in a fresh context with
speculation off. (The engine keeps llama.cpp's full-size SWA cache: with the window-sized one, 256 cells here, this
chat's edited turn drifts although llama-server's llama_memory_seq_pos_min test passes; see Context in
app/engine/llama/context.py.)"""
from __future__ import annotations

import pytest
from support.tiny_gguf import write_model

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings
from app.prompts import chat_tokens

WINDOW = 32
TURNS = ["the cat sat on the mat", "and the dog ran to the big red sun", "it was a hot day", "we like code",
         "one and two", "the sun is hot"]


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    shape = dict(n_layer=6, n_ctx=4096, sliding_window=WINDOW)
    return (write_model(d / "target.gguf", seed=1, **shape),
            write_model(d / "draft.gguf", seed=2, base_seed=1, noise=0.6, **shape))


@pytest.fixture(scope="module")
def engines(gemma_pair):
    target, draft = gemma_pair
    spec = Engine(ModelSettings(target, n_ctx=4096, n_batch=64), ModelSettings(draft, n_ctx=4096, n_batch=64))
    plain = Engine(ModelSettings(target, n_ctx=4096, n_batch=64))
    yield spec, plain
    spec.close()
    plain.close()


def answer(engine: Engine, messages: list[dict], drafter: str, fresh: bool = False) -> tuple[list[int], Done]:
    if fresh:
        engine.reset()
    params = GenerationParams(max_tokens=120, draft=DraftParams(draft_max=6))
    done = [e for e in engine.generate(chat_tokens(engine.model, messages), params, drafter) if isinstance(e, Done)][0]
    return done.token_ids, done


def test_the_tiny_model_really_uses_a_sliding_window(engines):
    import llama_cpp as ll

    spec, _ = engines
    assert ll.llama_model_n_swa(spec.model.ptr) == WINDOW


def test_a_long_chat_regenerate_and_an_edited_turn_stay_exact_with_a_sliding_window(engines):
    spec, plain = engines
    spec.reset()
    plain.reset()
    messages: list[dict] = []
    drafted = accepted = 0
    for text in TURNS:  # each turn reuses the cached conversation (speculation on, and off, in their engines)
        messages.append({"role": "user", "content": text})
        on, done = answer(spec, messages, "model")
        off, _ = answer(plain, messages, "none")
        fresh, _ = answer(plain, messages, "none", fresh=True)
        assert on == off == fresh
        drafted, accepted = drafted + done.stats.n_drafted, accepted + done.stats.n_accepted
        messages.append({"role": "assistant", "content": spec.detokenize(on)})
        plain.reset()
        answer(plain, messages[:-1], "none")  # plain's cache holds the same conversation as spec's again
    assert len(chat_tokens(spec.model, messages)) > 6 * 256  # far past the window and the SWA cache's 256 cells
    assert 0 < accepted < drafted  # both accepted and rejected drafts were rolled back through

    regenerated, done = answer(spec, messages[:-1], "model")  # Regenerate: the last answer dropped from the cache
    assert regenerated == answer(plain, messages[:-1], "none", fresh=True)[0]
    # the window before the answer is still cached: only the prompt's last token is evaluated again
    assert done.stats.prompt_cached == len(chat_tokens(spec.model, messages[:-1])) - 1

    edited = messages[:2] + [{"role": "user", "content": "hi"}]  # an early turn edited, ~2000 positions back
    on, done = answer(spec, edited, "model")
    assert on == answer(plain, edited, "none", fresh=True)[0]
    assert done.stats.prompt_cached > 2 * WINDOW  # continued from the cached prefix, its window intact

