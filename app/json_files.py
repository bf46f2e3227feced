"""Small JSON files that must survive a crash: written atomically, read forgivingly."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


def save_json(path: Path, data, mode: int = 0o600) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over the old file: a crash at any
    moment leaves either the old or the new content, never half of one. ``mode``: the file's permissions from its
    first byte (owner-only: settings name your files, keys are secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # (threads save side by side)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)  # a leftover temporary file may have had wider rights
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_json(path: Path, expect: type = dict):
    """Returns (data, warning). A missing file gives (None, None). A corrupt one is renamed aside (kept for the
    user, never deleted) and gives (None, a warning saying where it went)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, expect):
            raise ValueError(f"expected a JSON {expect.__name__}")
        return data, None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        return None, f"{path.name} could not be read ({exc}); it was set aside as {aside.name} and a fresh one started."
