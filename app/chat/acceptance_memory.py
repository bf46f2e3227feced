"""How each drafter's tokens fared on a pair (``measured.Measured.profile``), kept across launches: the first
answer after loading the pair again starts from what earlier launches learned, not from the drafter's priors. On
the starter pair at two threads, learning from priors alone, the first answer of a launch stayed near plain decoding
(0.96x in replays) where the next ones made 1.2-1.3x. Costs are not kept: they are the host's, and move with it;
but for what a long verification batch's positions weigh against a plain step (``Measured.long_batch``), the
target's kernels' more than the host's speed."""
from __future__ import annotations

import time
from pathlib import Path

from ..paths import data_dir
from ..json_files import load_json, save_json
from .method_ranking import pair_key

FILE = "acceptance.json"


class AcceptanceMemory:
    """One pair's entry in FILE: per drafter, its profile and when it was kept."""

    def __init__(self, target: Path, draft: Path | None):
        self._key = pair_key(target, draft)

    def recall(self, drafter: str) -> dict | None:
        try:
            entry = self._entry(load_json(data_dir() / FILE)[0] or {}).get(drafter)
        except OSError:
            return None
        return entry.get("profile") if isinstance(entry, dict) else None

    def keep(self, drafter: str, profile: dict) -> None:
        try:
            path = data_dir() / FILE
            saved = load_json(path)[0] or {}
            saved[self._key] = {**self._entry(saved), drafter: {"profile": profile, "at": time.time()}}
            save_json(path, saved)
        except OSError:
            pass  # (a full disk, a folder gone: the next launch learns again; the answer is not disturbed)

    def _entry(self, saved: dict) -> dict:
        entry = saved.get(self._key)
        return entry if isinstance(entry, dict) else {}


def memory_for(target: Path, draft: Path | None) -> AcceptanceMemory | None:
    """The memory for these files as they are now (None where they cannot be read: the load will say why)."""
    try:
        return AcceptanceMemory(target, draft)
    except OSError:
        return None
