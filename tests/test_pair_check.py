"""Judging a pair before loading: GGUF metadata read without llama.cpp agrees with llama.cpp, memory fit and
offload recommendations, draft suggestions, `specchat check`."""
import json
import re

import pytest
from support.tiny_gguf import write_model

from app.models import starter
from app.chat import method_ranking
from app.chat.method_ranking import recall
from app.cli import main
from app.engine.compat import compatibility_problems
from app.engine.drafters import registry
from app.engine.gguf_file import read_info
from app.engine.llama import Model, devices
from app.engine.fit import ALL, FIT_MARGIN, GIB, OVERHEAD, Gpu, Load, estimate, recommend_offload
from app.models.check import _family, check_files, describe, fitted_offload, suggest_drafts
from app.paths import data_dir

VARIANTS = ["draft", "close_draft", "other_text", "other_size", "other_type", "other_bos"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_metadata_verdict_matches_llama_cpp(models, variant):
    by_meta = compatibility_problems(read_info(models["target"]), read_info(models[variant]))
    t, d = Model(models["target"], vocab_only=True), Model(models[variant], vocab_only=True)
    try:
        assert by_meta == compatibility_problems(t, d)
    finally:
        t.close()
        d.close()
    assert bool(by_meta) == variant.startswith("other_")


def test_starter_pair_metadata(specchat_home):
    t, d = read_info(starter.target_path()), read_info(starter.draft_path())
    assert (t.quantization, d.quantization) == ("F32", "Q4_1")
    assert t.architecture == "llama" and t.n_vocab == d.n_vocab == 49152 and t.context_length == 8192
    assert compatibility_problems(t, d) == []
    m = Model(starter.target_path())
    try:
        assert t.kv_bytes_per_token == m.kv_bytes_per_token and t.n_layer == m.n_layer
        assert abs(t.size_bytes - m.size_bytes) / m.size_bytes < 0.01
    finally:
        m.close()


def test_starter_draft_with_another_vocabulary_is_refused(models, specchat_home):
    problems = compatibility_problems(read_info(models["target"]), read_info(starter.draft_path()))
    assert any("differ in size" in p for p in problems) and any("tokenizer types" in p for p in problems)


def test_split_gguf_metadata_counts_every_shard(tmp_path):
    first = write_model(tmp_path / "s.gguf", seed=1, split_max_tensors=8)
    info = read_info(first)
    shards = sorted(tmp_path.glob("s-*.gguf"))
    assert info.n_shards == len(shards) == 3
    assert info.size_bytes == sum(p.stat().st_size for p in shards)
    assert info.n_vocab > 0 and info.n_layer == 2


def test_ggml_devices_are_read_from_llama_cpp():
    kinds = {kind for _, kind, _, _ in devices()}
    assert 0 in kinds  # the CPU device is always there
    assert all(total > 0 for _, _, _, total in devices())


def _model(gb: float, layers: int = 31, kv_per_token: int = 128 * 1024, ctx: int = 4096, gpu: int = 0) -> Load:
    return Load("m.gguf", int(gb * GIB), kv_per_token, layers, ctx, gpu)


def test_offload_recommendation():
    """llama.cpp's fit rule against injected GPU memory figures: all on the GPU when it fits with 1 GiB kept free,
    else the draft first and the target's layers that fit beside it; each answer says why."""
    target, draft = _model(4.0), _model(0.5, layers=23)
    assert recommend_offload(target, draft, []) == (0, 0, "no GPU this llama.cpp build can use: every layer on the CPU")
    big = recommend_offload(target, draft, [Gpu("big", 24 * GIB, 24 * GIB)])
    assert big[:2] == (ALL, ALL) and big.why.startswith("all 32 target layers and the draft's fit") \
        and "24.0 GiB free on big, 1 GiB of it kept free" in big.why
    small = [Gpu("small", 4 * GIB, 6 * GIB)]
    ngl, ngld, why = recommend_offload(target, draft, small)
    assert ngld == ALL and 0 < ngl < 32 and why.startswith(f"{ngl} of 32 target layers fit beside the draft")
    # what is recommended must fit, and one more target layer would not leave the margin free
    assert estimate([_model(4.0, gpu=ngl), _model(0.5, layers=23, gpu=ngld)], small).ok
    on_gpu = _model(4.0, gpu=ngl + 1).gpu_bytes() + _model(0.5, layers=23, gpu=ALL).gpu_bytes()
    assert on_gpu + 2 * OVERHEAD + FIT_MARGIN > small[0].free
    # the draft kept on the CPU (-ngld 0) leaves its room to the target
    assert recommend_offload(target, draft, small, ngld=0).ngl > ngl
    # a projector goes with the target's first layer: it takes room from the target's layers
    assert recommend_offload(target, draft, small, extra_bytes=GIB // 2).ngl < ngl
    tiny = recommend_offload(target, draft, [Gpu("tiny", GIB, 2 * GIB)])
    assert tiny[:2] == (0, 0) and tiny.why.startswith("not one layer fits in 1.0 GiB free on tiny")
    # two GPUs: their free memory together, each keeping its margin
    assert recommend_offload(target, draft, [Gpu("a", 3 * GIB, 4 * GIB), Gpu("b", 3 * GIB, 4 * GIB)]).ngl == \
        recommend_offload(target, draft, [Gpu("ab", 5 * GIB, 8 * GIB)]).ngl


def test_the_fit_is_judged_from_the_files_headers(models, monkeypatch):
    """-ngl auto on real GGUF files, with the GPU's free memory injected: what a load and `specchat check` get."""
    from app.models import check

    t, d = models["target"], models["draft"]
    monkeypatch.setattr(check, "gpus", lambda: [Gpu("Injected 8 GiB", 8 * GIB, 8 * GIB)])
    fitted = fitted_offload(t, d)
    assert fitted[:2] == (ALL, ALL) and "8.0 GiB free on Injected 8 GiB" in fitted.why
    assert fitted_offload(t, d, ngl=0)[:2] == (0, ALL) and fitted_offload(t, d, ngl=0).why.startswith("-ngl 0 as asked")
    assert fitted_offload(t, d, ngl=3, ngld=0) == (3, 0, "as asked (-ngl 3 -ngld 0)")
    # a GPU with less free than the target's bytes beyond the margin: some of its layers only
    info = read_info(t)
    need = check._load(info, check.context_of(info, 0), 0, True).total_bytes  # weights and KV cache
    monkeypatch.setattr(check, "gpus", lambda: [Gpu("Injected", FIT_MARGIN + OVERHEAD + need // 2, 4 * GIB)])
    partial = fitted_offload(t, None)
    assert 0 < partial.ngl < info.n_layer + 1 and partial.ngld == 0, partial
    assert partial.why.startswith(f"{partial.ngl} of {info.n_layer + 1} target layers fit in"), partial
    r = check_files(t, d)
    assert r.recommended == fitted_offload(t, d) and r.fit.vram_free is not None
    line = next(x for x in describe(r) if x.startswith("recommended offload:"))
    assert line.startswith(f"recommended offload: -ngl {r.recommended.ngl} -ngld {r.recommended.ngld} (") \
        and "Injected" in line and "-ngl auto" in line
    monkeypatch.setattr(check, "gpus", lambda: [])  # a CPU build
    assert fitted_offload(t, d) == (0, 0, "no GPU this llama.cpp build can use: every layer on the CPU")


def test_check_says_what_plain_decoding_would_make_here(models, monkeypatch, tmp_path):
    """`specchat check` (and the Models view's check of your own files) says the speed the Models view says of the
    catalog's pairs: on the CPU the target's size over the memory bandwidth measured here; wholly on a GPU, what was
    measured there; nothing where layers are split, or for a mixture of experts (its header does not say what share
    of its weights a token reads)."""
    from support.tiny_recurrent import write_recurrent

    from app.models import check, gpu_speed
    from app.models.expected_speed import cpu_tps

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    t, d = models["target"], models["draft"]
    speed = lambda *a, **kw: [x for x in describe(check_files(*a, **kw)) if x.startswith("speed: ")]  # noqa: E731
    info = read_info(t)
    assert speed(t, d) == [f"speed: ≈{cpu_tps(info.size_bytes / 1e9, info.quantization):.0f} tok/s here before "
                           "speculation"]
    card = [Gpu("Injected 8 GiB", 8 * GIB, 8 * GIB)]
    monkeypatch.setattr(check, "gpus", lambda: card)
    monkeypatch.setattr(gpu_speed, "gpus", lambda: card)
    assert speed(t, d) == ["speed: on the GPU: faster than the CPU (measured here once a model answers on the GPU "
                           "with speculation off)"]
    gpu_speed.GpuSpeedLog(t).keep_plain(123.0)  # (as a plain answer wholly on that GPU keeps it)
    assert speed(t, d) == ["speed: ≈123 tok/s on this GPU before speculation (measured)"]
    assert speed(d, None) == [f"speed: at least 123 tok/s on this GPU before speculation (from {t.name}, measured "
                              "here)"]  # (as large as the target: as fast at least)
    assert speed(t, d, ngl=1) == []  # one layer on the GPU, the rest on the CPU
    assert speed(t, d, ngl=0, ngld=0) == [f"speed: ≈{cpu_tps(info.size_bytes / 1e9, info.quantization):.0f} tok/s "
                                          "here before speculation"]
    assert speed(write_recurrent(tmp_path / "moe.gguf", "jamba", n_expert=4), None) == []


def test_fit_problems_and_warnings():
    huge = estimate([_model(10_000.0)], [])
    assert not huge.ok and "of RAM" in huge.problems[0]
    no_gpu = estimate([_model(1.0, gpu=ALL)], [])
    assert no_gpu.ok and "cannot offload" in no_gpu.warnings[0]
    small_gpu = estimate([_model(8.0, gpu=ALL)], [Gpu("g", 2 * GIB, 4 * GIB)])
    assert not small_gpu.ok and "GPU memory is free" in small_gpu.problems[0]


def test_draft_suggestions(models, specchat_home):
    assert _family("Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf") == "qwen2.5-coder"
    assert _family("google_gemma-3-27b-it-Q4_K_M.gguf") == "google-gemma-3"
    suggestions = suggest_drafts(read_info(starter.target_path()))
    assert any(s.startswith("smollm2-135m-instruct-q4_1") and "compatible" in s for s in suggestions)
    assert suggest_drafts(read_info(models["target"])) == []
    qwen = write_model(models["target"].parent / "Qwen2.5-7B-Instruct-Q4_K_M.gguf", seed=1)
    named = suggest_drafts(read_info(qwen))
    assert any("qwen2.5-0.5b-instruct-q8_0.gguf" in s and "specchat pull" in s for s in named)


def test_a_target_without_a_draft_of_its_vocabulary_is_offered_the_drafts_on_disk_as_text(models, specchat_home,
                                                                                           tmp_path):
    """The starter's draft (SmolLM2, on disk as a builtin) for a target of another vocabulary: offered as text where
    its size suits (a target padded, sparsely, to 2 GB: 1:20), left out where it is over a third of the target."""
    big = write_model(tmp_path / "Lone-7B-Instruct-Q8_0.gguf", seed=1, permute_seed=3)
    with open(big, "r+b") as f:
        f.truncate(2_000_000_000)  # a hole: no disk used, but the size a real 7B file would have
    offered = suggest_drafts(read_info(big))
    assert len(offered) == 1 and offered[0].startswith("smollm2-135m-instruct-q4_1 (on disk; drafted as text, 1:")
    assert suggest_drafts(read_info(models["other_text"])) == []  # a tiny target: the starter's draft is too big
    out = "\n".join(check_files(big, None).suggestions)
    assert "drafted as text" in out


@pytest.fixture
def rankings_kept():
    """What --measure remembers here is put back afterwards: the session's other tests load the same tiny files
    and would draft with the method measured fastest here (test_cli's cross-vocabulary draft, run after this)."""
    path = data_dir() / method_ranking.FILE
    before = path.read_bytes() if path.exists() else None
    yield
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(before)


def test_check_report_and_cli(models, specchat_home, capsys, rankings_kept):
    r = check_files(models["target"], models["other_text"])
    assert not r.compatible and r.fit.ok and r.recommended[:2] == (0, 0)
    assert main(["check", "--target", str(models["target"]), "--draft", str(models["other_text"])]) == 0
    out = capsys.readouterr().out
    assert "different vocabularies: drafted as text (slower per token, usually lower acceptance): token 300 means" \
        in out and "--drafter ngram" in out
    assert main(["check", "--target", str(models["target"]), "--draft", str(models["other_text"]), "--measure", "24"]) == 0
    measured = capsys.readouterr().out.splitlines()  # every method the pair can draft with, timed against plain
    head = measured.index("measured, fastest first (drafted as text):")
    rows, last = measured[head + 1:-1], measured[-1]
    assert len(rows) == 3 and all(r.endswith("output identical with speculation off") for r in rows), rows
    assert {r.split()[0] for r in rows} == {"draft", "n-gram"}
    assert sum(" + n-gram lookup (ngram-longest) " in r for r in rows) == 1  # the draft model chained with lookup
    speedups = [float(re.search(r" x(\d+\.\d+) ", r).group(1)) for r in rows]
    assert speedups == sorted(speedups, reverse=True)  # fastest first
    # remembered for these files: loading them again drafts with the fastest, and says why
    ranking = recall(models["target"], models["other_text"])
    assert ranking and round(ranking.methods[0]["speedup"], 2) == speedups[0]
    assert last.startswith("Loading these files drafts")
    assert ranking.why() in last and f"specchat check --measure, {ranking.when}" in last
    assert main(["generate", "--target", str(models["target"]), "--draft", str(models["other_text"]), "-n", "4",
                 "--json", "-p", "hi"]) == 0
    out = capsys.readouterr()
    used = json.loads(out.out)["drafter"]  # (n-gram lookup reports its kind)
    methods = lambda name: {registry.method_of(p) for p in registry.parts(name)}  # noqa: E731 (a chain: its parts)
    assert methods(used) == methods(ranking.best) and f"drafting with {ranking.why()}" in out.err
    assert recall(models["target"], None) is None  # another pair (the target alone): nothing measured
    assert main(["check", "--pair", "starter"]) == 0
    out = capsys.readouterr().out
    assert "compatible: the draft shares the target's tokenizer" in out and "recommended offload: -ngl 0" in out
    assert main(["check", "--target", str(models["target"]), "--ctx", "-5"]) == 1
    assert "Invalid --ctx" in capsys.readouterr().err
