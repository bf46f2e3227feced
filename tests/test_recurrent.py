"""Speculation on recurrent and hybrid models stays exact: tiny random-weight models of eight llama.cpp
architectures (tests/support/tiny_recurrent.py), each drafted by a noisy copy of itself so drafts are partly rejected.

Three roll a rejected tail back through llama.cpp's recurrent-state snapshots (qwen35, lfm2, nemotron_h: n_rs_seq);
the hybrids granitehybrid, falcon-h1 and kimi-linear and the purely recurrent mamba2 and rwkv7 cannot, and restore
the state saved before the batch, then replay the accepted tokens. "qwen35-rs4" keeps only 4 snapshots under drafts of up to 16 tokens, so both paths mix.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from support.tiny_recurrent import ROLLBACK_ARCHS, write_recurrent
from test_exact_sampling import N, compare, samples

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, Round
from app.engine.drafters import NgramParams
from app.prompts import chat_tokens

NOISE = {"qwen35": 0.2, "lfm2": 0.2, "nemotron_h": 0.2, "granitehybrid": 0.2, "mamba2": 0.2, "rwkv7": 0.15,
         "falcon-h1": 0.15, "kimi-linear": 0.15}
CASES = ["qwen35", "lfm2", "nemotron_h", "granitehybrid", "mamba2", "rwkv7", "falcon-h1", "kimi-linear", "qwen35-rs4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("recurrent")
    return {arch: (write_recurrent(d / f"{arch}.gguf", arch, seed=1),
                   write_recurrent(d / f"{arch}-draft.gguf", arch, seed=2, base_seed=1, noise=noise))
            for arch, noise in NOISE.items()}


@pytest.fixture(scope="module")
def engines(files):
    """Per case: (speculative engine, plain engine) on the same target."""
    made = {}
    for case in CASES:
        arch, _, rs = case.partition("-rs")
        target, draft = files[arch]
        n_rs = int(rs) if rs else ModelSettings.n_rs_seq
        made[case] = (Engine(ModelSettings(target, n_ctx=2048, n_rs_seq=n_rs), ModelSettings(draft, n_ctx=2048)),
                      Engine(ModelSettings(target, n_ctx=2048)))
    yield made
    for spec, plain in made.values():
        spec.close()
        plain.close()


def run(engine, ids, drafter, max_tokens=60, **draft) -> Done:
    params = GenerationParams(max_tokens=max_tokens, draft=DraftParams(**{"draft_p_min": 0.0, **draft}))
    return [e for e in engine.generate(ids, params, drafter) if isinstance(e, Done)][0]


def consistent(engine):
    """Bookkeeping agrees with llama.cpp's memory (tokens past n_held await replay)."""
    for loaded in (engine.target, engine.draft):
        if loaded:
            ctx = loaded.ctx
            assert ctx.memory_pos_max() == ctx.n_held - 1 and ctx.n_held <= len(ctx.tokens)
    return True


PROMPT = [{"role": "user", "content": "the cat sat on the mat and the dog ran to the big red sun"}]


def test_the_fixtures_are_what_they_claim(engines):
    for case, (spec, _) in engines.items():
        arch = case.partition("-rs")[0]
        assert spec.model.recurrent and spec.model.arch == arch and spec.draft.model.recurrent
        expected = 4 if case.endswith("rs4") else ModelSettings.n_rs_seq if arch in ROLLBACK_ARCHS else 0
        assert spec.target.ctx.n_rs_seq == expected  # llama.cpp clamps it to 0 where the arch keeps no snapshots
        assert spec.draft.ctx.n_rs_seq == 0


@pytest.mark.parametrize("case", CASES)
def test_greedy_speculation_is_token_identical_to_plain(engines, case):
    spec, plain = engines[case]
    ids = chat_tokens(spec.model, PROMPT)
    off = run(plain, ids, "none")
    before = spec.target.ctx.state_costs.rollbacks, spec.target.ctx.state_costs.restores
    drafted = accepted = 0
    # (the lookup copies at most 16 tokens here: a longer draft than the 16 snapshots is saved whole, see below)
    short_copies = NgramParams(simple_size_m=16)
    for drafter in ("model", "ngram"):
        for draft_max in (1, 2, 3, 5, 8, 12, 16):
            on = run(spec, ids, drafter, draft_max=draft_max, ngram=short_copies)
            assert on.token_ids == off.token_ids, (drafter, draft_max)
            if drafter == "model":
                drafted, accepted = drafted + on.stats.n_drafted, accepted + on.stats.n_accepted
            assert consistent(spec)
    assert 0 < accepted < drafted  # drafts were verified, some accepted and some rolled back
    costs = spec.target.ctx.state_costs
    rollbacks, restores = costs.rollbacks - before[0], costs.restores - before[1]
    assert costs.replayed <= 17 * costs.restores  # a restore replays at most a round's accepted tokens
    if spec.target.ctx.n_rs_seq >= 16:
        assert rollbacks > 0 and costs.saves <= 2 + len(spec.target.ctx.rollback.turns)  # snapshots did every round
    elif spec.target.ctx.n_rs_seq:
        assert rollbacks > 0 and restores > 0  # short drafts rolled back, long ones restored
    else:
        assert rollbacks == 0 and restores > 0


@pytest.mark.parametrize("case", ["qwen35", "granitehybrid", "mamba2"])
def test_sampling_keeps_the_target_distribution(engines, case):
    spec, plain = engines[case]
    ids = [1, 300, 301, 302]
    off, _ = samples(plain, ids, "none", seed0=10_000)
    on, drafted = samples(spec, ids, "model", draft_max=3, draft_p_min=0.0)
    assert drafted > N
    compare(off, on)


TURNS = ["the cat sat on the mat", "and the dog ran to the big red sun", "it was a hot day", "we like code",
         "one and two"]


def chat_answer(engine, messages, drafter, fresh=False) -> Done:
    if fresh:
        engine.reset()
    return run(engine, chat_tokens(engine.model, messages), drafter, max_tokens=40, draft_max=6)


@pytest.mark.parametrize("case", ["qwen35", "nemotron_h", "granitehybrid", "mamba2"])
def test_chat_turns_regenerate_and_an_edited_turn_restart_from_checkpoints(engines, case):
    spec, plain = engines[case]
    spec.reset()
    messages: list[dict] = []
    prompt_lens = []
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        prompt = chat_tokens(spec.model, messages)
        done = chat_answer(spec, messages, "model")
        assert done.token_ids == chat_answer(plain, messages, "none", fresh=True).token_ids
        if prompt_lens:  # a turn reads its new tokens, from at worst the previous prompt's checkpoint on
            assert done.stats.prompt_cached >= prompt_lens[-1] - 1
            assert done.stats.prompt_tokens == len(prompt) - done.stats.prompt_cached
        prompt_lens.append(len(prompt))
        messages.append({"role": "assistant", "content": spec.detokenize(done.token_ids)})
        assert consistent(spec)

    again = chat_answer(spec, messages[:-1], "model")  # Regenerate the last answer
    assert again.token_ids == chat_answer(plain, messages[:-1], "none", fresh=True).token_ids
    assert again.stats.prompt_tokens == 1  # restored to the checkpoint before the prompt's last token

    edited = messages[:2] + [{"role": "user", "content": "hi"}]  # the second question rewritten
    done = chat_answer(spec, edited, "model")
    assert done.token_ids == chat_answer(plain, edited, "none", fresh=True).token_ids
    assert prompt_lens[0] - 1 <= done.stats.prompt_cached < prompt_lens[1]  # the first turn's checkpoint
    assert consistent(spec)


class CancelAfter(threading.Event):
    """A cancel event that turns itself on at its n-th poll: llama.cpp polls it between graph nodes of a long
    decode, the loop between rounds, so any n lands somewhere deterministic mid-work."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        if self.left == 0:
            self.set()
        return super().is_set()


@pytest.mark.parametrize("case", ["qwen35", "granitehybrid", "mamba2"])
def test_cancel_anywhere_leaves_a_cache_the_next_generation_continues_from(engines, case):
    spec, plain = engines[case]
    ids = chat_tokens(spec.model, [{"role": "user", "content": " ".join(TURNS * 3)}])  # > 64 tokens: abortable prefill
    expected = run(plain, ids, "none").token_ids
    params = GenerationParams(max_tokens=60, draft=DraftParams(draft_max=5, draft_p_min=0.0))

    def generate(cancel, cached_prefix: bool) -> Done:
        spec.reset()
        if cached_prefix:  # a state that moved past a shorter prompt, and the checkpoint before its last token
            run(spec, ids[:40], "model")
        return list(spec.generate(ids, params, "model", cancel))[-1]

    polls = CancelAfter(10**9)
    assert generate(polls, False).token_ids == expected
    n_polls = 10**9 - polls.left  # graph nodes of the prefill, then one per round
    for cached_prefix in (False, True):
        for n in (3, n_polls // 3, n_polls * 2 // 3, n_polls - 20, n_polls - 5):
            done = generate(CancelAfter(n), cached_prefix)
            assert done.finish_reason == "cancelled", n
            assert done.token_ids == expected[: len(done.token_ids)]
            assert consistent(spec)
            assert run(spec, ids, "model", draft_max=5).token_ids == expected


def test_specchat_generate_speculates_on_a_hybrid_pair(files):
    target, draft = files["qwen35"]

    def generate(*args):
        r = subprocess.run([sys.executable, "-m", "app", "generate", "--target", str(target), "--prompt",
                            "the cat sat", "--temperature", "0", "--max-tokens", "40", "--json", *args],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    on = generate("--draft", str(draft), "--drafter", "model", "--draft-p-min", "0")
    off = generate("--drafter", "none")
    assert on["token_ids"] == off["token_ids"]
    assert on["n_drafted"] > 0 and on["n_accepted"] > 0  # verified, not refused


def test_bench_reports_identical_output_and_what_state_cost_per_round(files, tmp_path):
    target, draft = files["granitehybrid"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the cat sat on the mat"}\n{"prompt": "it was a hot day", "category": "b"}\n')
    r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(target), "--draft", str(draft),
                        "--draft-max", "6", "--draft-p-min", "0", "--prompts", str(prompts), "-n", "40", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["overall"]["all_identical"] and report["overall"]["acceptance"] > 0
    state = report["recurrent_state"]
    assert set(state) == {"target", "draft"}  # both hybrid, neither with snapshots: saved states every round
    assert state["target"]["saves"] > 0.5 and state["target"]["rollbacks"] == 0
    assert 0 < state["target"]["replayed_tokens"] <= 7


def test_round_events_report_drafts_on_a_recurrent_model(engines):
    spec, _ = engines["mamba2"]
    params = GenerationParams(max_tokens=30, draft=DraftParams(draft_max=4, draft_p_min=0.0))
    rounds = [e for e in spec.generate(chat_tokens(spec.model, PROMPT), params, "model") if isinstance(e, Round)]
    assert rounds and sum(r.n_drafted for r in rounds) > 0


def test_memory_estimates_count_the_state_its_snapshots_and_saved_states(engines, files, monkeypatch):
    from dataclasses import replace

    import app.models.check as check
    from app.engine.gguf_file import read_info

    for case, (spec, _) in engines.items():
        run(spec, chat_tokens(spec.model, PROMPT), "model", max_tokens=10)
        ctx, model = spec.target.ctx, spec.model
        assert ctx.state_costs.bytes > 0  # states were saved (prompt checkpoints at least)
        # the header's estimate is the state llama.cpp saves, less a few bytes of cell metadata
        assert 0 <= ctx.state_costs.bytes - model.recurrent_bytes < 1024, case
        held = ctx.recurrent_state()
        assert held["snapshots"] == ctx.n_rs_seq and held["saved"] >= 1
        assert held["bytes"] == model.recurrent_bytes * (1 + ctx.n_rs_seq) + held["saved_bytes"]
        assert spec.memory_bytes() >= model.size_bytes + held["bytes"]
    # Before loading (specchat check, the Models tab): the target's state with 16 snapshots, the draft's alone, and
    # each one's 8 chat-turn states plus the one saved per round, beside the KV caches and buffers.
    target, draft = files["qwen35"]
    r = read_info(target).recurrent_bytes
    with_state = check.check_files(target, draft, n_ctx=2048).fit.cache_need
    monkeypatch.setattr(check, "read_info", lambda p: replace(read_info(p), recurrent_bytes=0))
    without = check.check_files(target, draft, n_ctx=2048).fit.cache_need
    assert with_state - without == r * ((1 + 16) + 1 + (8 + 1) * 2)


def test_the_hardware_tab_shows_the_recurrent_state(files):
    from app.chat.runtime import Runtime
    from app.models.hardware import snapshot
    from app.models.loader import LoadSpec
    from app.ui.render import hardware_panel

    target, draft = files["nemotron_h"]
    rt = Runtime()
    rt.load(LoadSpec(target=str(target), draft=str(draft), ctx=1024))
    try:
        info = rt.info()
        assert [r["snapshots"] for r in info["recurrent"]] == [16, 0]  # the target's, the draft's
        html = hardware_panel(snapshot(), info)
        assert "recurrent state" in html and "16 snapshots" in html
    finally:
        rt.close()
