"""What this machine has: CPU, RAM (psutil); the GPUs it holds, whatever the llama.cpp build can use (whether
the build can offload is the engine's to say), and the command that rebuilds llama.cpp for a GPU it cannot use."""
from __future__ import annotations

import functools
import glob
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import psutil

from ..engine import supports_gpu_offload


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def snapshot() -> dict:
    from ..engine.llama import gpus
    from .gpu_speed import recall

    vm = psutil.virtual_memory()
    devices = gpus()  # (those this llama.cpp build can use: none on a CPU build)
    measured = recall(devices)
    return {
        "gpus": [{"name": g.name, "free": g.free, "total": g.total} for g in devices],
        # plain decoding measured on them (gpu_speed), the latest first
        "gpu_measured": sorted(({"model": m.model, "tokens_per_second": m.tokens_per_second, "at": m.at}
                                for m in measured.measured), key=lambda m: -m["at"]) if measured else [],
        "cpu": _cpu_name(),
        "cores_physical": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "cores_logical": psutil.cpu_count() or 1,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "ram_total": vm.total,
        "ram_available": vm.available,
        "ram_used": vm.total - vm.available,
        "process_rss": psutil.Process().memory_info().rss,
    }


@dataclass(frozen=True)
class MachineGpu:
    """A GPU this machine has, and the llama.cpp backend that would run on it."""

    name: str
    backend: str  # "CUDA", "Metal" or "Vulkan": the GGML_<backend> CMake switch that builds for it


CMAKE_SWITCH = {"CUDA": "-DGGML_CUDA=on", "Metal": "-DGGML_METAL=on", "Vulkan": "-DGGML_VULKAN=on"}
BUILD_NEEDS = {"CUDA": " (it needs NVIDIA's CUDA toolkit, nvcc)", "Metal": "",
               "Vulkan": " (it needs glslc and Vulkan headers 1.3.275 or newer: Debian 12's libvulkan-dev is older)"}


def _run(cmd: list[str]) -> str:
    if not shutil.which(cmd[0]):
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _nvidia() -> list[MachineGpu]:
    """An NVIDIA driver's GPUs: nvidia-smi's names, else the driver's own /proc files."""
    names = [n.strip() for n in _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()]
    if not any(names):
        names = []
        for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
            with open(info, encoding="utf-8", errors="replace") as f:
                names += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model:")]
    return [MachineGpu(n, "CUDA") for n in names if n]


def _vulkan() -> list[MachineGpu]:
    """Vulkan devices that are GPUs (vulkaninfo's discrete, integrated or virtual ones): Mesa's lavapipe, a
    Vulkan device that runs on the CPU, is left out."""
    out = _run(["vulkaninfo", "--summary"])
    kinds = re.findall(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(\w+)", out)
    names = re.findall(r"deviceName\s*=\s*(.+)", out)
    return [MachineGpu(n.strip(), "Vulkan") for kind, n in zip(kinds, names)
            if kind in ("DISCRETE_GPU", "INTEGRATED_GPU", "VIRTUAL_GPU")]


@functools.cache
def machine_gpus() -> tuple[MachineGpu, ...]:
    """The GPUs of this machine, found without llama.cpp (looked for once a process: they do not come and go):
    Apple silicon, an NVIDIA driver, or a real GPU seen through Vulkan (AMD, Intel; NVIDIA's already counted)."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return (MachineGpu(_cpu_name(), "Metal"),)
    nvidia = _nvidia()
    return tuple(nvidia + [g for g in _vulkan() if not nvidia or "nvidia" not in g.name.lower()])


def rebuild_command(backend: str) -> str:
    """The command that rebuilds this environment's llama-cpp-python for ``backend``, keeping the exactness flag."""
    flags = f'CMAKE_ARGS="{CMAKE_SWITCH[backend]} -DGGML_LLAMAFILE=OFF"'
    if getattr(sys, "frozen", False):  # the desktop bundle carries its llama.cpp: the bundle is built again
        return f"{flags} packaging/build.sh (in a SpecChat checkout; packaging/README.md)"
    try:
        pinned = f"llama-cpp-python=={version('llama-cpp-python')}"
    except PackageNotFoundError:
        pinned = "llama-cpp-python"
    return f"{flags} {shlex.quote(sys.executable)} -m pip install --no-cache-dir --force-reinstall --no-deps {pinned}"


def unused_gpu_advice(build_can_offload: bool | None = None) -> str:
    """One line for a machine with a GPU this llama.cpp build cannot use: which GPU, and the command that rebuilds
    for it. Empty where the build offloads (``None``: as the engine says), or where there is no GPU to use."""
    if build_can_offload is None:
        build_can_offload = supports_gpu_offload()
    gpus = machine_gpus()
    if build_can_offload or not gpus:
        return ""
    first = gpus[0]
    names = ", ".join(dict.fromkeys(g.name for g in gpus))
    return (f"this machine has a GPU ({names}) but this llama.cpp build runs on the CPU only, so every layer stays "
            f"on the CPU. To offload to it, rebuild llama.cpp for {first.backend}{BUILD_NEEDS[first.backend]}, then "
            f"start SpecChat again: {rebuild_command(first.backend)}")
