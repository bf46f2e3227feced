"""Where SpecChat keeps its files: platformdirs' per-user data and config dirs (``SPECCHAT_HOME`` overrides both,
e.g. in tests)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def _dir(kind: str) -> Path:
    root = os.environ.get("SPECCHAT_HOME")
    if root:
        path = Path(root) / kind
    elif kind == "data":
        path = Path(platformdirs.user_data_dir("specchat", appauthor=False))
    else:
        path = Path(platformdirs.user_config_dir("specchat", appauthor=False))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:  # conversations, settings and keys: nobody else's business
        path.chmod(0o700)
    return path


def data_dir() -> Path:
    """Models made locally (the starter target) and chat history."""
    return _dir("data")


def config_dir() -> Path:
    """Settings."""
    return _dir("config")
