"""The speculative loop on tiny GGUF models: exactness, rollback, cancellation, prefix reuse, limits, errors."""
import threading

import numpy as np
import pytest

from app.engine import Done, DraftParams, EngineError, GenerationParams, Round, SamplingParams, TextDelta
from app.engine import batch_invariant
from app.engine.gguf_file import read_info
from app.prompts import chat_tokens

PROMPTS = [[1, 300, 301, 302, 303], [1, 270, 280, 290, 270, 280], [1] + list(range(3, 60)), [1, 290]]


def run(engine, ids, drafter="model", **kw):
    draft = DraftParams(**{k: kw.pop(k) for k in list(kw) if k.startswith("draft") or k == "adaptive"})
    params = GenerationParams(draft=draft, **kw)
    events = list(engine.generate(ids, params, drafter))
    done = events[-1]
    assert isinstance(done, Done)
    return done, events


def assert_consistent(engine):
    """Bookkeeping matches llama.cpp's memory for both contexts."""
    for loaded in (engine.target, engine.draft):
        if loaded:
            assert loaded.ctx.memory_pos_max() == len(loaded.ctx.tokens) - 1


def test_build_is_batch_invariant():
    assert batch_invariant(), (
        "llama-cpp-python was built with llamafile kernels; reinstall with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF "
        "(see README) so greedy speculative output is bit-identical to plain decoding"
    )
    from app.engine import supports_gpu_offload

    # a GPU picks kernels by batch size (measured on an H100: docs/benchmarks.md), so offloaded layers are not
    assert batch_invariant(-1) is not supports_gpu_offload() and batch_invariant(0)


def test_a_k_quant_model_gives_each_token_the_same_logits_alone_or_in_a_batch(tmp_path):
    """Q4_K_M files (what people run) take other CPU kernels than F32: weights repacked for batches and ggml's tiled
    K-quant matmul for 8+ tokens round differently from one token's dot products. The engine turns both off, so a
    verification batch of any size computes exactly what plain decoding does."""
    from support.tiny_gguf import write_model
    from app.engine.llama import Context, Model, quantize

    f32 = write_model(tmp_path / "kq-f32.gguf", seed=5, n_embd=256, n_ff=512, n_layer=2)
    quantize(f32, tmp_path / "kq.gguf", "Q4_K_M", threads=2)
    model = Model(tmp_path / "kq.gguf")
    tokens = [1] + [270 + 7 * i % 50 for i in range(15)]
    rows = {}
    try:
        for name, chunks in (("one by one", [1] * 16), ("a batch of 12", [4, 12]), ("a batch of 9", [7, 9])):
            ctx = Context(model, n_ctx=64, n_threads=2)
            try:
                at, out = 0, []
                for n in chunks:
                    ctx.decode(tokens[at:at + n], n_logits=n)
                    out += [ctx.logits(i).copy() for i in range(n)]
                    at += n
                rows[name] = np.array(out)
            finally:
                ctx.close()
    finally:
        model.close()
    assert "Q4_K" in read_info(tmp_path / "kq.gguf").quantization
    for name in ("a batch of 12", "a batch of 9"):
        assert np.array_equal(rows[name], rows["one by one"]), f"{name}: logits differ from one token at a time"


@pytest.mark.parametrize("ids", PROMPTS)
@pytest.mark.parametrize("drafter,draft_max,p_min", [
    ("model", 1, 0.0), ("model", 4, 0.0), ("model", 8, 0.3), ("model", 16, 0.0), ("ngram", 8, 0.0),
])
def test_greedy_speculation_is_token_identical_to_plain(tiny_engine, ids, drafter, draft_max, p_min):
    plain, _ = run(tiny_engine, ids, "none", max_tokens=80)
    spec, events = run(tiny_engine, ids, drafter, max_tokens=80, draft_max=draft_max, draft_p_min=p_min)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    rounds = [e for e in events if isinstance(e, Round)]
    assert sum(r.n_accepted for r in rounds) == spec.stats.n_accepted
    assert len(spec.draft_flags) == len(spec.token_ids)
    # every accepted draft token is committed, except past an EOS/stop string inside the last round
    assert sum(spec.draft_flags) == spec.stats.n_accepted or (
        spec.finish_reason == "stop" and sum(spec.draft_flags) < spec.stats.n_accepted
    )
    if drafter == "model":
        assert 0 < spec.stats.n_accepted < spec.stats.n_drafted  # both accept and reject paths ran
    assert_consistent(tiny_engine)


def test_full_acceptance_and_bonus_tokens_stay_identical(close_engine):
    ids = PROMPTS[2]
    plain, _ = run(close_engine, ids, "none", max_tokens=120)
    spec, events = run(close_engine, ids, "model", max_tokens=120, draft_max=6, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids
    assert any(isinstance(e, Round) and e.n_drafted == e.n_accepted == 6 for e in events)
    assert spec.stats.acceptance_rate > 0.7
    assert_consistent(close_engine)


def test_a_long_prompt_is_read_by_the_draft_while_the_target_answers(close_engine):
    """The draft model reads a long prompt after the target has: read first, it held up the first token as long
    again (the starter). So the first token comes from the target alone, the draft reads on a piece a round while
    the target answers plainly, then drafts; the answer is the same tokens, and a next turn reads only what it
    added, before its first token."""
    from app.engine.drafters.draft_model import READ_AT_ONCE, READ_PIECE

    ids = [1] + [300 + i % 27 for i in range(399)]  # 398 tokens for the draft to read: more than at once
    assert len(ids) - 1 > READ_AT_ONCE
    close_engine.reset()
    plain, _ = run(close_engine, ids, "none", max_tokens=40)
    close_engine.reset()
    spec, events = run(close_engine, ids, "model", max_tokens=40, draft_max=4, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids
    rounds = [e for e in events if isinstance(e, Round)]
    reading = -(-(len(ids) - 1) // READ_PIECE)
    assert all(r.n_drafted == 0 for r in rounds[:reading])  # the target alone, while the draft reads
    assert spec.stats.n_drafted > 0 and rounds[reading].n_drafted > 0  # then it drafts at once
    assert_consistent(close_engine)
    more = ids + spec.token_ids + [301, 302]  # a next turn: its few new tokens are read before its first token
    _, events = run(close_engine, more, "model", max_tokens=8, draft_max=4, draft_p_min=0.0)
    assert next(e for e in events if isinstance(e, Round)).n_drafted > 0
    assert_consistent(close_engine)


def test_adaptive_mode_is_exact_and_measured(models):
    """A fresh engine (no costs remembered from earlier answers) measures first: a short draft, then plain steps,
    whatever the host's speed; then the draft length follows what it measured."""
    from app.engine import Engine, ModelSettings

    engine = Engine(ModelSettings(models["target"], n_ctx=512), ModelSettings(models["draft"], n_ctx=512))
    try:
        ids = PROMPTS[0]
        plain, _ = run(engine, ids, "none", max_tokens=100)
        spec, events = run(engine, ids, "model", max_tokens=100, draft_max=8, draft_p_min=0.0, adaptive=True)
        assert spec.token_ids == plain.token_ids
        sizes = [e.n_drafted for e in events if isinstance(e, Round)]
        assert sizes[0] == 2 and 0 in sizes[1:]  # the draft length moved with what it measured
        again, _ = run(engine, ids, "model", max_tokens=100, draft_max=8, draft_p_min=0.0, adaptive=True)
        assert again.token_ids == plain.token_ids  # (the next answer starts from the costs this one measured)
    finally:
        engine.close()


def test_events_stream_text_and_running_stats(tiny_engine):
    done, events = run(tiny_engine, PROMPTS[0], "model", max_tokens=40, draft_max=4, draft_p_min=0.0)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == done.text
    rounds = [e for e in events if isinstance(e, Round)]
    assert rounds and all(r.verify_seconds > 0 for r in rounds)
    s = done.stats
    assert s.n_tokens == 40 and done.finish_reason == "length"
    assert s.tokens_per_second > 0 and s.time_to_first_token_s > 0 and s.decode_seconds > 0
    assert s.n_rounds == len(rounds)
    assert abs(s.acceptance_rate - s.n_accepted / s.n_drafted) < 1e-12


def test_cancel_mid_generation_leaves_both_caches_consistent(tiny_engine, models):
    ids = PROMPTS[1]
    fresh, _ = run(tiny_engine, ids, "model", max_tokens=60, draft_max=4, draft_p_min=0.0)
    cancel = threading.Event()
    params = GenerationParams(max_tokens=60, draft=DraftParams(draft_max=4, draft_p_min=0.0))
    seen = []
    for ev in tiny_engine.generate(ids, params, "model", cancel):
        if isinstance(ev, Round) and ev.stats.n_tokens >= 10:
            cancel.set()
        seen.append(ev)
    done = seen[-1]
    assert done.finish_reason == "cancelled"
    assert 10 <= done.stats.n_tokens < 60
    assert done.token_ids == fresh.token_ids[: len(done.token_ids)]
    assert_consistent(tiny_engine)
    # the half-finished caches are reused and still give the same answer
    again, _ = run(tiny_engine, ids, "model", max_tokens=60, draft_max=4, draft_p_min=0.0)
    assert again.token_ids == fresh.token_ids


def test_abandoning_the_stream_keeps_caches_consistent(tiny_engine):
    ids = PROMPTS[0]
    params = GenerationParams(max_tokens=60, draft=DraftParams(draft_max=5, draft_p_min=0.0))
    gen = tiny_engine.generate(ids, params, "model")
    for i, _ in enumerate(gen):
        if i == 7:
            break
    gen.close()
    assert_consistent(tiny_engine)
    plain, _ = run(tiny_engine, ids, "none", max_tokens=60)
    spec, _ = run(tiny_engine, ids, "model", max_tokens=60, draft_max=5, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids


def test_prefix_is_reused_across_turns(tiny_engine):
    turn1 = chat_tokens(tiny_engine.model, [{"role": "user", "content": "the cat sat"}])
    first, _ = run(tiny_engine, turn1, "model", max_tokens=20, draft_max=4, draft_p_min=0.0)
    turn2 = chat_tokens(tiny_engine.model, [
        {"role": "user", "content": "the cat sat"},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "and then?"},
    ])
    second, _ = run(tiny_engine, turn2, "model", max_tokens=20, draft_max=4, draft_p_min=0.0)
    assert second.stats.prompt_cached >= len(turn1) - 1
    assert second.stats.prompt_tokens == len(turn2) - second.stats.prompt_cached
    tiny_engine.reset()
    cold, _ = run(tiny_engine, turn2, "none", max_tokens=20)
    assert cold.stats.prompt_cached == 0
    assert cold.token_ids == second.token_ids


def test_common_prefix_is_the_first_difference():
    from app.engine.llama import common_prefix

    rng = np.random.default_rng(3)
    for _ in range(3000):
        a = rng.integers(0, 3, int(rng.integers(0, 14))).tolist()
        b = a[: int(rng.integers(0, len(a) + 1))] + rng.integers(0, 3, int(rng.integers(0, 6))).tolist()
        first_difference = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(b, a) == first_difference


def test_stops_on_eos(models):
    from app.engine import Engine, ModelSettings
    from support.tiny_gguf import write_model

    # A model whose EOS is the token greedy decoding picks first from this prompt.
    probe = Engine(ModelSettings(models["target"], n_ctx=256))
    first, _ = run(probe, PROMPTS[0], "none", max_tokens=5)
    probe.close()
    eos_model = write_model(models["target"].parent / "eos.gguf", seed=1, eos=first.token_ids[2])
    e = Engine(ModelSettings(eos_model, n_ctx=256))
    done, _ = run(e, PROMPTS[0], "ngram", max_tokens=50)
    assert done.finish_reason == "stop" and done.token_ids == first.token_ids[:2]
    e.close()


def test_stop_strings_and_max_tokens(tiny_engine):
    plain, _ = run(tiny_engine, PROMPTS[0], "none", max_tokens=60)
    stop = plain.text[20:24]
    assert stop.strip()
    done, events = run(tiny_engine, PROMPTS[0], "model", max_tokens=60, stop=(stop,), draft_max=4)
    assert done.finish_reason == "stop"
    assert done.text == plain.text[: plain.text.find(stop)]
    assert stop not in "".join(e.text for e in events if isinstance(e, TextDelta))


def test_context_full_ends_with_length(models):
    from app.engine import Engine, ModelSettings

    e = Engine(ModelSettings(models["target"], n_ctx=64), ModelSettings(models["draft"]))
    done, _ = run(e, PROMPTS[0], "model", max_tokens=500, draft_max=8, draft_p_min=0.0)
    assert done.finish_reason == "length"
    # the last token needs no cache slot; llama.cpp may round the context up (to 256 here)
    assert e.n_ctx - 8 <= len(PROMPTS[0]) + done.stats.n_tokens <= e.n_ctx + 1
    assert_consistent(e)
    e.close()


def test_prompt_longer_than_context_is_refused(models):
    from app.engine import Engine, ModelSettings

    e = Engine(ModelSettings(models["target"], n_ctx=64))
    with pytest.raises(EngineError, match=f"prompt is 300 tokens but the context holds {e.n_ctx}"):
        run(e, [1] + [300] * 299, "none", max_tokens=5)
    done, _ = run(e, PROMPTS[0], "none", max_tokens=5)  # still usable afterwards
    assert done.stats.n_tokens == 5
    e.close()


@pytest.mark.parametrize("kw,match", [
    (dict(max_tokens=0), "max-tokens"),
    (dict(draft_max=-1), "draft-max"),
    (dict(draft_max=65), "draft-max"),
    (dict(draft_max=4, draft_min=5), "draft-min"),
    (dict(draft_p_min=1.0), "draft-p-min"),
    (dict(sampling=SamplingParams(temperature=-0.5)), "temperature"),
])
def test_invalid_settings_raise_clear_errors(tiny_engine, kw, match):
    with pytest.raises(EngineError, match=match):
        run(tiny_engine, PROMPTS[0], "model", **kw)


def test_unknown_drafter_and_missing_draft(models, tiny_engine):
    from app.engine import Engine, ModelSettings

    with pytest.raises(EngineError, match="Unknown drafter"):
        tiny_engine.generate(PROMPTS[0], None, "medusa")
    e = Engine(ModelSettings(models["target"], n_ctx=128))
    with pytest.raises(EngineError, match="has no draft model"):
        e.generate(PROMPTS[0], None, "model")
    e.close()


def test_adaptive_mode_backs_off_a_draft_that_loses(models, tmp_path):
    """A draft that is mostly wrong: adaptive mode learns it and drafts far less than fixed mode."""
    from app.engine import Engine, ModelSettings
    from support.tiny_gguf import write_model

    bad = write_model(tmp_path / "bad_draft.gguf", seed=9)  # unrelated weights, same vocabulary
    e = Engine(ModelSettings(models["target"], n_ctx=512), ModelSettings(bad, n_ctx=512))
    fixed, _ = run(e, PROMPTS[0], "model", max_tokens=200, draft_max=8, draft_p_min=0.0)
    adaptive, _ = run(e, PROMPTS[0], "model", max_tokens=200, draft_max=8, draft_p_min=0.0, adaptive=True)
    assert adaptive.token_ids == fixed.token_ids
    assert fixed.stats.acceptance_rate < 0.2
    assert adaptive.stats.n_drafted < 0.3 * fixed.stats.n_drafted
    e.close()


def test_cancel_interrupts_prompt_processing(tiny_engine):
    cancel = threading.Event()
    cancel.set()
    long_prompt = [1] + list(range(3, 300))
    events = list(tiny_engine.generate(long_prompt, GenerationParams(max_tokens=20), "model", cancel))
    done = events[-1]
    assert done.finish_reason == "cancelled" and done.stats.n_tokens == 0
    assert len(tiny_engine.target.ctx.tokens) < len(long_prompt)  # the prompt was not (fully) evaluated
    assert_consistent(tiny_engine)
    again, _ = run(tiny_engine, long_prompt, "model", max_tokens=20)
    plain, _ = run(tiny_engine, long_prompt, "none", max_tokens=20)
    assert again.token_ids == plain.token_ids
