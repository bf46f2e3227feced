"""The GPU's measured speed (app/models/gpu_speed.py): a plain answer made with the target wholly on a GPU keeps that
GPU's tokens/s, and the Models view says what it allows of the catalog's pairs that fit there. Here, on a CPU build,
the GPU is injected (its name and memory, and the build's say-so) while the engine and llama.cpp run for real;
tests/gpu_checks.py keeps a figure from a real device (lavapipe in every run)."""
import json
import shutil

import pytest

from app.engine import OFF, Done, GenerationParams, SamplingParams
from app.engine import engine as engine_module
from app.engine.fit import Gpu
from app.engine.gguf_file import read_info
from app.models import downloads, gpu_speed
from app.models.expected_speed import CRAWL_TPS, GOOD_TPS, expected
from app.models.gpu_speed import GpuSpeed, GpuSpeedLog, Measurement, recall
from app.models.loader import LoadSpec, load_engine

GIB = 1024**3
CARD = [Gpu("Injected GPU", 900 * GIB, 1000 * GIB)]  # (every catalog pair fits)
FITS = "fits in GPU memory (900 GiB free): every layer goes there by default"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def card(monkeypatch):
    """This CPU build answering as a GPU build does: offload supported, and one GPU (llama.cpp itself, built for the
    CPU, keeps the layers where it can, so only the facts the engine and the log read are injected)."""
    monkeypatch.setattr(engine_module, "supports_gpu_offload", lambda: True)
    monkeypatch.setattr(gpu_speed, "gpus", lambda: CARD)


def answer(engine, drafter=OFF, tokens=40, **kw) -> Done:
    params = GenerationParams(max_tokens=tokens, sampling=SamplingParams(temperature=0, ignore_eos=True), **kw)
    done = list(engine.generate([1, 300, 301, 302], params, drafter))[-1]
    assert isinstance(done, Done) and done.stats.n_tokens == tokens
    return done


def kept(home) -> dict:
    return json.loads((home / "data" / gpu_speed.FILE).read_text())


def test_a_plain_answer_with_the_target_on_the_gpu_keeps_its_speed_and_nothing_else_does(models, home, card):
    engine = load_engine(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ngl=-1, ngld=-1))
    try:
        answer(engine, "model")  # speculating: its rate is not plain decoding's
        answer(engine, tokens=8)  # too short to time
        answer(engine, grammar=None, logprobs=2)  # more than the tokens asked of it
        assert not (home / "data" / gpu_speed.FILE).exists()
        done = answer(engine)
    finally:
        engine.close()
    saved = kept(home)["Injected GPU"][models["target"].name]
    assert saved["tokens_per_second"] == pytest.approx(done.stats.tokens_per_second, abs=0.01)
    assert saved["read_bytes"] == read_info(models["target"]).size_bytes
    m = recall(CARD).measured[0]
    assert (m.model, m.read_bytes) == (models["target"].name, saved["read_bytes"])


def test_layers_left_on_the_cpu_keep_nothing(models, home, card):
    for ngl in (0, 2):  # none offloaded, or 2 of the tiny target's 3 (2 layers and the output layer)
        engine = load_engine(LoadSpec(target=str(models["target"]), ngl=ngl))
        try:
            answer(engine)
        finally:
            engine.close()
    assert not (home / "data" / gpu_speed.FILE).exists()


def test_a_cpu_build_keeps_nothing_even_asked_for_every_layer(models, home):
    engine = load_engine(LoadSpec(target=str(models["target"]), ngl=-1))
    try:
        answer(engine)
    finally:
        engine.close()
    assert not (home / "data" / gpu_speed.FILE).exists()


def test_each_gpu_keeps_its_latest_targets_and_a_mixture_of_experts_tells_nothing(models, home, card, monkeypatch,
                                                                                 tmp_path):
    from support.tiny_recurrent import write_recurrent

    GpuSpeedLog(models["target"]).keep_plain(100.0)
    GpuSpeedLog(models["target"]).keep_plain(120.0)  # the same file again: the latest counts
    GpuSpeedLog(models["draft"]).keep_plain(90.0)
    moe = write_recurrent(tmp_path / "jamba-moe.gguf", "jamba", n_expert=4)
    GpuSpeedLog(moe).keep_plain(500.0)
    monkeypatch.setattr(gpu_speed, "gpus", lambda: [Gpu("Another GPU", GIB, GIB)])
    GpuSpeedLog(models["target"]).keep_plain(40.0)
    saved = kept(home)
    assert {k: {m: v["tokens_per_second"] for m, v in e.items()} for k, e in saved.items()} == {
        "Injected GPU": {models["target"].name: 120.0, models["draft"].name: 90.0},
        "Another GPU": {models["target"].name: 40.0}}
    for i in range(gpu_speed.KEEP + 2):  # each GPU keeps the targets measured last
        copy = tmp_path / f"t{i}.gguf"
        shutil.copy(models["target"], copy)
        GpuSpeedLog(copy).keep_plain(50.0 + i)
    assert sorted(kept(home)["Another GPU"]) == sorted(f"t{i}.gguf" for i in range(2, gpu_speed.KEEP + 2))
    assert len(kept(home)["Injected GPU"]) == 2
    assert recall([Gpu("No such GPU", GIB, GIB)]) is None and recall([]) is None


def test_what_a_measurement_says_of_other_targets_is_a_floor():
    small = Measurement("small.gguf", 1_000_000_000, 200.0, 0.0)  # 200 GB/s of weights
    large = Measurement("large.gguf", 4_000_000_000, 80.0, 0.0)  # 320 GB/s
    gpu = GpuSpeed((small, large))
    assert gpu.floor(8e9) == (40.0, large)  # priced by the larger one's bytes per second: 320 / 8
    assert gpu.floor(2e9) == (100.0, small)  # 200 / 2 beats "as fast as large.gguf" (80)
    assert gpu.floor(0.5e9) == (200.0, small)  # smaller than both: at least as fast as the faster
    assert gpu.floor(8e9, ["small.gguf"]) == (200.0, small)  # a target measured itself: its own figure

    own = expected(1.0, "Q4_K_M", FITS, gpu, ["small.gguf"])
    assert (own.tps, own.runs_well) == (200.0, True) and own.note == "≈200 tok/s on this GPU before speculation " \
                                                                     "(measured)"
    other = expected(8.0, "Q4_K_M", FITS, gpu, ["big-Q4_K_M.gguf"])
    assert other.tps == 40.0 and other.note == ("at least 40 tok/s on this GPU before speculation (from large.gguf, "
                                                "measured here)")
    low_floor = expected(40.0, "Q4_K_M", FITS, gpu)  # a floor under the bar judges nothing
    assert low_floor.tps == 8.0 and low_floor.tps < GOOD_TPS and low_floor.runs_well
    no_floor = expected(800.0, "Q4_K_M", FITS, gpu)  # 0.4 tok/s "at least" says nothing: not said
    assert no_floor.tps is None and no_floor.runs_well and "too small to tell" in no_floor.note
    slow = GpuSpeed((Measurement("x.gguf", 4_000_000_000, 3.0, 0.0),))
    measured_slow = expected(4.0, "Q4_K_M", FITS, slow, ["x.gguf"])
    assert not measured_slow.runs_well and "would crawl" in measured_slow.note and 3.0 < GOOD_TPS
    unmeasured = expected(1.0, "Q4_K_M", FITS)
    assert unmeasured.tps is None and "once a model answers on the GPU with speculation off" in unmeasured.note


def test_the_models_view_prices_the_pairs_that_fit_by_what_this_gpu_measured(models, home, monkeypatch):
    import app.engine.llama as llama

    monkeypatch.setattr(llama, "gpus", lambda: CARD)
    before = downloads.rows()
    assert all(r["fit"].startswith("fits in GPU") and r["expected_tps"] is None for r in before)
    assert all("once a model answers on the GPU with speculation off" in r["expected"] for r in before)

    size = read_info(models["target"]).size_bytes  # (a tiny model, said to read 30 GB/s: the floors of 0.5-20 GB
    monkeypatch.setattr(gpu_speed, "gpus", lambda: CARD)  # targets fall on both sides of CRAWL_TPS)
    GpuSpeedLog(models["target"]).keep_plain(30e9 / size)
    tps = recall(CARD).measured[0].tokens_per_second
    after = {r["pair"]: r for r in downloads.rows()}
    for name, pair in downloads.load_catalog().items():
        r = after[name]
        floor = tps * size / (pair.target.read_per_token_gb * 1e9)
        if floor >= CRAWL_TPS:
            assert r["expected_tps"] == round(floor, 1), name
            assert r["expected"] == (f"at least {floor:.0f} tok/s on this GPU before speculation (from "
                                     f"{models['target'].name}, measured here)"), r["expected"]
        else:
            assert r["expected_tps"] is None and "too small to tell" in r["expected"], r
    assert {r["expected_tps"] is None for r in after.values()} == {True, False}  # (both kinds of rows seen)
    assert sum(r["recommended"] for r in after.values()) == 1


def test_the_hardware_tab_names_each_gpu_its_free_memory_and_what_was_measured_on_it(models, home, monkeypatch):
    import app.engine.llama as llama
    from app.models import hardware
    from app.ui.render import hardware_panel

    loaded = {"gpu_offload": True, "pair": None, "target": None}
    assert "<th>GPU</th>" not in hardware_panel(hardware.snapshot(), loaded)  # (this CPU build: no GPU)
    monkeypatch.setattr(llama, "gpus", lambda: CARD)
    monkeypatch.setattr(gpu_speed, "gpus", lambda: CARD)
    row = "<th>GPU</th><td>Injected GPU — 900.0 GiB free of 1000.0 GiB — "
    assert row + "no speed measured here yet (an answer with speculation off measures it)</td>" in \
        hardware_panel(hardware.snapshot(), loaded)
    GpuSpeedLog(models["draft"]).keep_plain(80.0)
    GpuSpeedLog(models["target"]).keep_plain(95.4)
    snap = hardware.snapshot()
    assert [m["model"] for m in snap["gpu_measured"]] == [models["target"].name, models["draft"].name]  # latest first
    assert row + (f"measured here before speculation: {models['target'].name} 95 tok/s, {models['draft'].name} 80 "
                  "tok/s</td>") in hardware_panel(snap, loaded)
