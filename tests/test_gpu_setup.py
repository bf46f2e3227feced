"""A GPU this machine has and the llama.cpp build cannot use is named once, with the command that rebuilds for it
(keeping -DGGML_LLAMAFILE=OFF), in `check`, the app's and serve's start-up notes and the Hardware tab; a machine
without one hears nothing of it. These machines have no GPU: stand-in `nvidia-smi` and `vulkaninfo` scripts on PATH
print what the real ones print on a machine that has one."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from app.chat.runtime import Runtime
from app.engine import supports_gpu_offload
from app.models import hardware
from app.ui.render import hardware_panel

ROOT = Path(__file__).resolve().parent.parent
LAVAPIPE = """Devices:
========
GPU0:
\tapiVersion         = 1.3.255
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
\tdriverID           = DRIVER_ID_MESA_LLVMPIPE
"""
RADEON = LAVAPIPE.replace("GPU0", "GPU1").replace("TYPE_CPU", "TYPE_DISCRETE_GPU").replace(
    "llvmpipe (LLVM 15.0.6, 256 bits)", "AMD Radeon RX 7900 XTX (RADV NAVI31)").replace("MESA_LLVMPIPE", "MESA_RADV")


def fake_tools(tmp_path: Path, **outputs: str) -> Path:
    """A folder of stand-in tools, each printing its text (``nvidia_smi`` becomes ``nvidia-smi``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in outputs.items():
        tool = bin_dir / name.replace("_", "-")
        tool.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
        tool.chmod(0o755)
    return bin_dir


@pytest.fixture
def on_path(monkeypatch):
    """Put stand-ins first on PATH for this process (the GPUs are looked for again)."""
    def put(bin_dir: Path) -> None:
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        hardware.machine_gpus.cache_clear()
    yield put
    hardware.machine_gpus.cache_clear()


needs_cpu_build = pytest.mark.skipif(supports_gpu_offload(), reason="this llama.cpp build offloads: nothing to advise")
no_real_gpu = pytest.mark.skipif(os.path.exists("/proc/driver/nvidia") or bool(hardware.machine_gpus()),
                                 reason="this machine has a GPU of its own")


@needs_cpu_build
def test_check_with_an_nvidia_driver_names_the_gpu_and_the_cuda_rebuild_command(tmp_path):
    bin_dir = fake_tools(tmp_path, nvidia_smi="NVIDIA GeForce RTX 4090\n")
    run = subprocess.run([sys.executable, "-m", "app", "check", "--pair", "starter"], cwd=ROOT, timeout=300,
                         capture_output=True, text=True,
                         env=dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"))
    assert run.returncode == 0, run.stderr
    note = [line for line in run.stdout.splitlines() if line.startswith("note: this machine has a GPU")]
    assert len(note) == 1, run.stdout  # said once
    assert "(NVIDIA GeForce RTX 4090)" in note[0] and "runs on the CPU only" in note[0]
    assert note[0].endswith(f'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_LLAMAFILE=OFF" {sys.executable} -m pip install '
                            f"--no-cache-dir --force-reinstall --no-deps llama-cpp-python=={version('llama-cpp-python')}")


@needs_cpu_build
@no_real_gpu
def test_check_on_a_machine_without_a_gpu_says_nothing_of_rebuilding(specchat_home):
    run = subprocess.run([sys.executable, "-m", "app", "check", "--pair", "starter"], cwd=ROOT, timeout=300,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "recommended offload: -ngl 0 -ngld 0" in run.stdout  # the report itself is there
    assert "GGML_" not in run.stdout + run.stderr and "rebuild" not in run.stdout + run.stderr


@needs_cpu_build
def test_a_real_gpu_through_vulkan_counts_and_mesas_lavapipe_does_not(tmp_path, on_path):
    on_path(fake_tools(tmp_path, vulkaninfo=LAVAPIPE))
    assert not any("llvmpipe" in g.name for g in hardware.machine_gpus())
    on_path(fake_tools(tmp_path, vulkaninfo=LAVAPIPE + RADEON))
    gpus = [g for g in hardware.machine_gpus() if "Radeon" in g.name]
    assert gpus == [hardware.MachineGpu("AMD Radeon RX 7900 XTX (RADV NAVI31)", "Vulkan")]
    if hardware.machine_gpus()[0] == gpus[0]:  # (a machine with an NVIDIA driver advises CUDA first)
        assert '"-DGGML_VULKAN=on -DGGML_LLAMAFILE=OFF"' in hardware.unused_gpu_advice(False)
    assert hardware.unused_gpu_advice(True) == ""  # a build that offloads needs no advice


@needs_cpu_build
@no_real_gpu
def test_the_hardware_tab_names_the_rebuild_only_where_a_gpu_is(tmp_path, on_path, specchat_home):
    idle = hardware_panel(hardware.snapshot(), Runtime().info())
    assert "no GPU that llama.cpp could use" in idle and "GGML_" not in idle
    on_path(fake_tools(tmp_path, nvidia_smi="NVIDIA RTX A6000\n"))
    panel = hardware_panel(hardware.snapshot(), Runtime().info())
    assert "NVIDIA RTX A6000" in panel and "-DGGML_CUDA=on -DGGML_LLAMAFILE=OFF" in panel.replace("&quot;", '"')


# --- offload by default: -ngl auto ----------------------------------------------------------------------------
def test_gpu_layers_flags_take_llama_cpps_words():
    from app.cli.flags import gpu_layers

    assert [gpu_layers(v) for v in ("auto", "ALL", "-1", "0", "12")] == [None, -1, -1, 0, 12]
    for bad in ("-2", "some"):
        with pytest.raises(Exception, match="give a number of layers, all"):
            gpu_layers(bad)
    run = subprocess.run([sys.executable, "-m", "app", "generate", "-ngl", "many", "-p", "hi"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "give a number of layers" in run.stderr and "Traceback" not in run.stderr


def test_a_load_left_to_fit_puts_on_the_gpu_what_its_free_memory_holds(models, monkeypatch):
    """A load that names no -ngl gets the fit (here with the GPU's free memory injected: these machines have none)
    and says why beside the layers; one that names them keeps them; on this CPU build nothing is offloaded."""
    from app.engine.fit import Gpu
    from app.models import check
    from app.models.loader import LoadSpec, load_engine

    spec = LoadSpec(target=str(models["target"]), draft=str(models["draft"]))
    assert spec.ngl is None and spec.ngld is None and spec.may_offload and spec.offload_flags() == "-ngl auto"
    engine = load_engine(spec)
    try:
        offload = engine.offload()
        assert set(offload) == {"target", "draft"} and offload["target"]["n_layers"] > 1
        if not supports_gpu_offload():
            assert offload["target"] == {**offload["target"], "n_gpu_layers": 0,
                                         "why": "no GPU this llama.cpp build can use: every layer on the CPU"}
    finally:
        engine.close()
    monkeypatch.setattr(check, "gpus", lambda: [Gpu("Injected GPU", 12 * 1024**3, 16 * 1024**3)])
    engine = load_engine(spec)  # (a CPU build loads every layer on the CPU whatever it is told)
    try:
        offload = engine.offload()
        assert offload["target"]["n_gpu_layers"] == -1 and offload["draft"]["n_gpu_layers"] == -1
        assert "fit with their KV caches in 12.0 GiB free on Injected GPU" in offload["target"]["why"]
    finally:
        engine.close()
    asked = LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ngl=0, ngld=0)
    assert not asked.may_offload and asked.offload_flags() == "-ngl 0"
    engine = load_engine(asked)
    try:
        assert [m["n_gpu_layers"] for m in engine.offload().values()] == [0, 0]
        assert engine.offload()["target"]["why"] == "as asked (-ngl 0 -ngld 0)"
    finally:
        engine.close()


def test_the_hardware_tab_shows_the_layers_on_the_gpu_and_why():
    hw = {"cpu": "x", "cores_physical": 2, "cores_logical": 2, "cpu_percent": 5.0, "ram_total": 8 * 1024**3,
          "ram_available": 4 * 1024**3, "ram_used": 4 * 1024**3, "process_rss": 1024**3}
    why = "20 of 29 target layers fit beside the draft in 6.0 GiB free on RTX 4060, 1 GiB of it kept free"
    loaded = {"gpu_offload": True, "pair": "p", "target": "t.gguf", "draft": "d.gguf", "memory_bytes": 0,
              "n_ctx": 4096, "offload": {"target": {"n_gpu_layers": 20, "n_layers": 29, "why": why},
                                         "draft": {"n_gpu_layers": -1, "n_layers": 25, "why": why}}}
    html = hardware_panel(hw, loaded)
    assert f"<th>GPU layers</th><td>target 20 of 29; draft 25 of 25 — {why}</td>" in html
    assert "GPU layers" not in hardware_panel(hw, {**loaded, "gpu_offload": False})  # (the row above says why)
