"""What this machine has: CPU, RAM (psutil); GPU offload is reported by the engine."""
from __future__ import annotations

import os
import platform

import psutil


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
    vm = psutil.virtual_memory()
    return {
        "cpu": _cpu_name(),
        "cores_physical": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "cores_logical": psutil.cpu_count() or 1,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "ram_total": vm.total,
        "ram_available": vm.available,
        "ram_used": vm.total - vm.available,
        "process_rss": psutil.Process().memory_info().rss,
    }
