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
