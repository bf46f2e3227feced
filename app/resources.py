"""Files shipped beside the package: models.toml and assets/ (in a source checkout, or installed by pip as data
files under <prefix>/share/specchat)."""
from __future__ import annotations

import sys
from pathlib import Path

from .engine import EngineError


def resource(name: str) -> Path:
    frozen = getattr(sys, "_MEIPASS", None)  # a PyInstaller bundle
    roots = ([Path(frozen)] if frozen else []) + [Path(__file__).resolve().parent.parent,
                                                  Path(sys.prefix) / "share" / "specchat"]
    for root in roots:
        if (root / name).exists():
            return root / name
    raise EngineError(f"{name} is missing from this installation; reinstall SpecChat.")
