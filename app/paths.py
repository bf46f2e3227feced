"""Where SpecChat keeps its files (platformdirs' per-user data dir; ``SPECCHAT_HOME`` overrides, e.g. in tests)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    root = os.environ.get("SPECCHAT_HOME")
    path = Path(root) / "data" if root else Path(platformdirs.user_data_dir("specchat", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path
