"""Which drafting method measured fastest for a pair on this machine (``specchat check --measure``), kept so that
loading the pair again drafts with it, and says why."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..engine import method_name
from ..paths import data_dir
from ..json_files import load_json, save_json

FILE = "measured_methods.json"


@dataclass(frozen=True)
class Ranking:
    """The methods a pair can draft with, fastest first, as measured against plain decoding in one run."""

    methods: list[dict]  # {"drafter", "speedup", "acceptance", "identical"}
    when: str  # the day it was measured
    at: float = 0.0  # ...and the moment (time.time())

    @property
    def best(self) -> str:
        return self.methods[0]["drafter"]

    def why(self) -> str:
        """In words, for the app and the command line."""
        figures = ", ".join(f"{method_name(m['drafter'])} {m['speedup']:.2f}x" for m in self.methods)
        lead = (f"{method_name(self.best)}: measured fastest on this machine" if self.methods[0]["speedup"] > 1.0 else
                f"{method_name(self.best)}: the least slow on this machine (none beat plain decoding)")
        return f"{lead} ({figures} over plain decoding; specchat check --measure, {self.when})"


def pair_key(target: Path, draft: Path | None) -> str:
    """A pair's files as they are now (another file under the same name is another pair)."""
    return "|".join(f"{p.resolve()}:{p.stat().st_size}" for p in (target, draft) if p is not None)


def remember(target: Path, draft: Path | None, reports: list[dict]) -> Ranking:
    """Keep what a measurement found (``bench`` reports, one per method) and return it ranked. Methods whose output
    differed from plain decoding are never ranked first."""
    methods = sorted(({"drafter": r["drafter"], "speedup": r["overall"]["speedup"],
                       "acceptance": r["overall"]["acceptance"], "identical": r["overall"]["all_identical"]}
                      for r in reports), key=lambda m: (not m["identical"], -m["speedup"]))
    ranking = Ranking(methods, time.strftime("%Y-%m-%d"), time.time())
    path = data_dir() / FILE
    saved, _ = load_json(path)
    saved = saved or {}
    saved[pair_key(target, draft)] = {"methods": methods, "when": ranking.when, "at": ranking.at}
    save_json(path, saved)
    return ranking


def recall(target: Path, draft: Path | None) -> Ranking | None:
    """What was measured for these files, if anything (a file changed since is another pair)."""
    try:
        key = pair_key(target, draft)
    except OSError:
        return None
    saved, _ = load_json(data_dir() / FILE)
    entry = (saved or {}).get(key)
    if not isinstance(entry, dict) or not entry.get("methods"):
        return None
    return Ranking(entry["methods"], str(entry.get("when", "")), float(entry.get("at", 0.0)))
