"""The pinned llama-cpp-python source distribution, which vendors llama.cpp: its copies of real models' chat
templates (``models/templates/``) and, for the remote-server tests, llama-server's sources.

The README's test command fetches it into ``tests/.cache/`` (``pip download --no-binary :all:``) before pytest runs,
so no test touches the network; ``SPECCHAT_LLAMA_SDIST`` may point at another copy of the same version.
"""
from __future__ import annotations

import os
import tarfile
from functools import cache
from importlib.metadata import version
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parent.parent / ".cache"  # tests/.cache


@cache
def path() -> Path:
    ver = version("llama-cpp-python")
    found = Path(os.environ.get("SPECCHAT_LLAMA_SDIST") or CACHE / f"llama_cpp_python-{ver}.tar.gz")
    if not found.is_file():
        pytest.fail(f"{found} is missing. The README's test command fetches it; or run: pip download --no-deps "
                    f"--no-binary :all: -d {CACHE} llama-cpp-python=={ver}", pytrace=False)
    return found


@cache
def templates() -> dict[str, str]:
    """llama.cpp's copies of real chat templates by file stem, e.g. ``Qwen-Qwen3-0.6B``; read in one pass."""
    found = {}
    with tarfile.open(path()) as tar:
        for member in tar:
            parent, _, name = member.name.rpartition("/")
            if parent.endswith("/vendor/llama.cpp/models/templates") and name.endswith(".jinja"):
                found[name.removesuffix(".jinja")] = tar.extractfile(member).read().decode("utf-8")
    return found
