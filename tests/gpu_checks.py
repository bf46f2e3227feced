"""What holds with layers on a GPU: run in a process whose llama.cpp can offload, by tests/test_vulkan_offload.py
on Mesa's lavapipe (every CI run) and by bench/gpu/run.sh on a real GPU. Not collected on its own (its name is not
test_*): on a CPU build there is nothing here to check.

    LLAMA_CPP_LIB_PATH=... python -m pytest -n 0 tests/gpu_checks.py

A GPU picks its kernels by batch size, so a verification batch rounds apart from one token decoded alone and greedy
output with speculation can leave plain decoding's at a near-tie (as llama.cpp's own speculation does). That cannot
be asserted away; what is asserted instead is the share of identical answers, and that each difference starts at
a near-tie whose logit gap is measured and printed.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.engine import (DraftParams, Engine, GenerationParams, ModelSettings, batch_invariant, inexact_note,
                        supports_gpu_offload)
from app.engine.llama import Context, Model, gpus, quantize
from support.tiny_gguf import write_model

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not supports_gpu_offload(), reason="this llama.cpp build cannot offload")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A target of the weights people run (Q4_K_M, 256 wide, a 2,300-token vocabulary) and a noisy copy as its
    draft, so rounds both accept and reject."""
    d = tmp_path_factory.mktemp("gpu-pair")
    shape = dict(n_embd=256, n_layer=2, n_head=4, n_ff=512, extra_words=2000)
    f32 = write_model(d / "target-f32.gguf", seed=11, **shape)
    quantize(f32, d / "target.gguf", "Q4_K_M", threads=2)
    draft = write_model(d / "draft.gguf", seed=12, base_seed=11, noise=0.3, **shape)
    return d / "target.gguf", draft


def test_the_device_is_a_gpu_with_its_memory():
    found = gpus()
    assert found, "llama.cpp offloads but lists no GPU device"
    assert all(g.total > 0 and 0 < g.free <= g.total for g in found), found
    print("GPUs:", found)


def test_the_default_fit_puts_the_pair_on_the_gpu_and_says_why(pair):
    from app.models.loader import LoadSpec, load_engine

    engine = load_engine(LoadSpec(target=str(pair[0]), draft=str(pair[1])))  # -ngl auto
    try:
        offload = engine.offload()
        name = gpus()[0].name
        for role in ("target", "draft"):
            assert offload[role]["n_gpu_layers"] == -1, offload  # a tiny pair fits whole
            assert name in offload[role]["why"] and "fit" in offload[role]["why"], offload[role]["why"]
    finally:
        engine.close()


def test_the_hardware_tab_names_the_device_and_the_layers_on_it(pair):
    from app.chat.runtime import Runtime
    from app.models import hardware
    from app.models.loader import LoadSpec
    from app.ui.render import hardware_panel

    rt = Runtime()
    try:
        rt.load(LoadSpec(target=str(pair[0]), draft=str(pair[1])))
        panel = hardware_panel(hardware.snapshot(), rt.info())
    finally:
        rt.close()
    assert f"<th>GPU</th><td>{gpus()[0].name} — " in panel and " GiB free of " in panel
    assert "<th>GPU layers</th><td>target 3 of 3; draft 3 of 3" in panel, panel


def test_the_engine_worker_loads_the_pair_offloaded_and_answers(pair):
    """The app's own load path (Model() in the engine worker, as `specchat serve -ngl 99` loads), which segfaulted on
    the H200 (bench/gpu/run.sh's crash step): the pair stays on the device and answers, with no crash notice."""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    rt = Runtime(worker=True)
    try:
        rt.load(LoadSpec(target=str(pair[0]), draft=str(pair[1]), ngl=99, ngld=99, ctx=512))
        info = rt.info()
        assert info["worker"]["state"] == "ready" and info["worker"]["restarts"] == 0 and not rt.engine.notice
        assert [info["offload"][role]["n_gpu_layers"] for role in ("target", "draft")] == [99, 99], info["offload"]
        *_, live = rt.answer([{"role": "user", "content": "Name three rivers."}],
                             Settings(temperature=0, max_tokens=24))
        assert live.text and live.stats.n_drafted > 0, live.stats
    finally:
        rt.close()


def test_a_plain_answer_on_the_device_keeps_its_speed_for_the_models_view(pair, tmp_path, monkeypatch):
    """Speculation off with the target wholly on the device: its tokens/s is kept for this GPU, and the catalog's
    pairs that fit there are said to run at least as fast as that allows, where that says something
    (app/models/gpu_speed.py)."""
    from app.engine import OFF, SamplingParams
    from app.models import downloads, gpu_speed
    from app.models.expected_speed import CRAWL_TPS
    from app.models.loader import LoadSpec, load_engine

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    engine = load_engine(LoadSpec(target=str(pair[0])))  # -ngl auto: all of it
    try:
        params = GenerationParams(max_tokens=40, sampling=SamplingParams(temperature=0, ignore_eos=True))
        done = list(engine.generate([1, 300, 301, 302], params, OFF))[-1]
    finally:
        engine.close()
    found = gpu_speed.recall(gpus())
    assert found and found.measured[0].model == pair[0].name, found
    assert found.measured[0].tokens_per_second == pytest.approx(done.stats.tokens_per_second, abs=0.01)
    print(f"kept for {gpu_speed.device_key(gpus())}: {found.measured[0]}")
    catalog = downloads.load_catalog()
    on_gpu = [r for r in downloads.rows() if r["fit"].startswith("fits in GPU")]  # (lavapipe's 2 GiB: 1.2B and less)
    assert on_gpu
    for r in on_gpu:  # the floor this tiny target's speed sets each catalog target, said where it says something
        floor, _ = found.floor(catalog[r["pair"]].target.read_per_token_gb * 1e9)
        assert r["expected_tps"] == (round(floor, 1) if floor >= CRAWL_TPS else None), (r, floor)
        print(f"{r['pair']}: {r['expected']} (floor {floor:.2f} tok/s)")


@pytest.mark.parametrize("n_gpu_layers", [1, -1])
def test_a_model_with_some_or_all_layers_offloaded_decodes_as_on_the_cpu(pair, n_gpu_layers):
    """Model(n_gpu_layers=N) really puts layers on the device, and its logits stay those of the CPU's up to the
    device's rounding."""
    f32 = pair[0].with_name("target-f32.gguf")
    tokens = [1] + [300 + 37 * i % 1900 for i in range(40)]
    rows = {}
    for ngl in (0, n_gpu_layers):
        model = Model(f32, n_gpu_layers=ngl)
        ctx = Context(model, n_ctx=128, n_threads=2)
        try:
            ctx.decode(tokens)
            rows[ngl] = ctx.logits(-1).copy()
        finally:
            ctx.close()
            model.close()
    gap = float(np.max(np.abs(rows[0] - rows[n_gpu_layers])))
    print(f"-ngl {n_gpu_layers}: largest logit difference from the CPU {gap:.2e}")
    # computed elsewhere (not bit-equal to the CPU: 4e-6 on lavapipe), the same numbers up to a GPU's rounding
    assert 0 < gap < 0.5
    assert np.argmax(rows[0]) == np.argmax(rows[n_gpu_layers])


def test_batch_invariance_is_reported_false_and_the_cli_says_so(pair):
    assert batch_invariant(0) and not batch_invariant(-1)
    run = subprocess.run([sys.executable, "-m", "app", "generate", "--target", str(pair[0]), "--draft", str(pair[1]),
                          "-ngl", "all", "-ngld", "all", "--temperature", "0", "-n", "16", "--json", "-p", "hello"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert '"batch_invariant": false' in run.stdout
    assert f"specchat: note: {inexact_note(-1)}" in run.stderr and "-ngl 0" in inexact_note(-1)
    assert inexact_note(0) == ""  # (on the CPU: bit-identical)


def test_compare_says_why_only_where_its_two_answers_part(pair):
    """Compare in the app, greedy, with every layer on the device: where the answers with speculation off and on part
    (at a near-tie, rare: the test below), its summary says why and what keeps them identical; where they do not, it
    says nothing. (Near-ties cannot be made to order: a target's logits scaled down scale the batch's rounding too.)"""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    rt = Runtime()
    try:
        rt.load(LoadSpec(target=str(pair[0]), draft=str(pair[1])))
        *_, cmp = rt.compare([{"role": "user", "content": "Name some rivers."}], Settings(temperature=0, max_tokens=48))
    finally:
        rt.close()
    parted = cmp.first_difference()
    print(f"Compare: the answers {'part at token ' + str(parted) if parted is not None else 'are identical'}; "
          f"note: {cmp.note!r}")
    assert cmp.on.stats.n_accepted > 0 and cmp.note == (inexact_note(-1) if parted is not None else "")


def plain_rows(ctx: Context, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The target's rows for ``tokens`` as plain decoding computes them: the prompt, then one token at a time."""
    ctx.truncate(0)
    ctx.decode(prompt)
    rows = []
    for t in tokens:
        rows.append(ctx.logits(-1).copy())
        ctx.decode([t])
    return np.array(rows)


def test_greedy_speculation_leaves_plain_decoding_only_at_near_ties(pair):
    """Each answer with speculation is compared with plain decoding's; where one differs, plain decoding's row at the
    first difference is computed again and the gap between its two tokens measured. A verification batch can move
    a logit by as much as this device's rounding of a batch (measured here, on the same target), so a difference
    is a near-tie's if the gap is at most twice that. The target's two best logits are about 1.2 apart at the
    median here (0.2 at the 10th percentile), so a loop that accepted a wrong token would not pass."""
    engine = Engine(ModelSettings(pair[0], n_ctx=512, n_gpu_layers=-1),
                    ModelSettings(pair[1], n_ctx=512, n_gpu_layers=-1))
    rng = np.random.default_rng(3)
    prompts = [[1] + [int(t) for t in rng.integers(261, 2300, 12)] for _ in range(16)]
    answers = []
    try:
        for ids in prompts:
            out = {d: list(engine.generate(ids, GenerationParams(max_tokens=48, draft=DraftParams(draft_max=8)), d))[-1]
                   for d in ("none", "model")}
            answers.append((ids, out["none"].token_ids, out["model"].token_ids, out["model"].stats.n_accepted))
        ctx = Context(engine.target.model, n_ctx=512, n_threads=2)
        try:
            ids, plain = answers[0][:2]
            alone = plain_rows(ctx, ids, plain[:16])
            ctx.truncate(len(ids) - 1)  # the same 16 rows from one verification batch
            ctx.decode([ids[-1]] + plain[:15], n_logits=16)
            batched = np.array([ctx.logits(i).copy() for i in range(16)])
            rounding = float(np.max(np.abs(batched - alone)))
            gaps = []
            for ids, plain, spec, _ in answers:
                first = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
                if first is not None:
                    row = plain_rows(ctx, ids, plain[:first + 1])[-1]
                    assert int(np.argmax(row)) == plain[first]
                    gaps.append(float(row[plain[first]] - row[spec[first]]))
        finally:
            ctx.close()
    finally:
        engine.close()
    same = sum(plain == spec for _, plain, spec, _ in answers)
    accepted = sum(n for *_, n in answers)
    print(f"identical greedy answers: {same} of {len(answers)}, {accepted} draft tokens accepted; "
          f"a 16-token batch moved logits by up to {rounding:.4f}; the gap where the others first differ: "
          f"{', '.join(f'{g:.4f}' for g in gaps) or 'none'}")
    assert accepted > 0
    assert same >= len(answers) // 2
    assert all(0 <= g <= 2 * rounding for g in gaps), (gaps, rounding)
