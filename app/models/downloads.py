"""Pair-level model management shared by the CLI and the app: what is downloaded, pull, remove."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from . import hub
from .catalog import Pair, Source, load_catalog, status


def hub_files(sources: list[Source]) -> list[tuple[str, str]]:
    """(repo, file) of the Hub sources, each once (a draft shared by two pairs is one download)."""
    return list(dict.fromkeys((s.repo, s.file) for s in sources if s.repo))


def pull(pair: Pair, on_progress: Callable[[hub.Progress], None] | None = None,
         cancel: threading.Event | None = None) -> list[Path]:
    """Download the pair's Hub files (target first, then draft); builtins need nothing."""
    return hub.pull_files(hub_files(pair.sources), on_progress=on_progress, cancel=cancel)


READY = ("builtin", "downloaded")
OWN_MTP = "its own MTP layers (no draft download)"


def is_downloaded(pair: Pair) -> bool:
    return all(status(s).state in READY for s in pair.sources)


def downloaded_pairs() -> list[str]:
    """Names of the catalog pairs whose files are all here."""
    return [p.name for p in load_catalog().values() if is_downloaded(p)]


def remove(pair: Pair) -> tuple[int, list[str], list[str]]:
    """Delete the pair's downloaded files, except those another downloaded pair still uses.
    Returns (bytes freed, files removed, files kept for other pairs)."""
    mine = hub_files(pair.sources)
    others = {f for p in load_catalog().values() if p.name != pair.name and is_downloaded(p)
              for f in hub_files(p.sources)}
    freed, removed = hub.remove_files(mine, keep=others)
    kept = [name for repo, name in mine if (repo, name) in others]
    return freed, removed, kept


def rows() -> list[dict]:
    """One row per catalog pair for `specchat list` and the Models view."""
    from ..engine.llama import gpus
    from .check import fit_note

    devices = gpus()  # once for the whole table
    out = []
    for p in load_catalog().values():
        t = status(p.target)
        d = status(p.draft) if p.draft else None  # (none: the target drafts with its own MTP layers)
        out.append({
            "pair": p.name, "use": p.use, "context": p.context, "license": p.license,
            "description": p.description,
            "target": p.target.describe(), "target_quant": p.target.quantization, "target_gb": p.target.size_gb,
            "draft": p.draft.describe() if d else OWN_MTP, "draft_quant": p.draft.quantization if d else "",
            "draft_gb": p.draft.size_gb if d else 0.0,
            "target_status": t.describe(), "draft_status": d.describe() if d else "in the target's file",
            "ready": t.state in READY and (d is None or d.state in READY),
            "fit": fit_note(p.target.size_gb, p.draft.size_gb if d else 0.0, devices),
        })
    return out
