"""Pair-level model management shared by the CLI and the app: what is downloaded, pull, remove."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from . import hf_files, hub
from .catalog import Pair, Source, load_catalog, status
from .hf_files import GgufChoice


def hub_files(sources: list[Source]) -> list[tuple[str, str]]:
    """(repo, file or tag) of the Hub sources, each once (a draft shared by two pairs is one download); none for
    builtins."""
    return list(dict.fromkeys((s.repo, s.tag) for s in sources if s.repo))


def remote_choices(sources: list[Source], endpoint: str | None = None) -> list[GgufChoice]:
    """The files on the Hub that the Hub sources name today (one per Hub source, in order), each resolved against its
    repo's file list as llama.cpp's ``-hf repo:TAG`` does (any case, split files whole, side files in their folder):
    an upstream rename does not break a pull, a tag that fits nothing or several says what the repo has."""
    from .discover import list_gguf

    listed: dict[str, list[GgufChoice]] = {}  # one file list per repo (a Gemma 4 target and its assistant share one)
    found = []
    for s in sources:
        if s.repo:
            if s.repo not in listed:
                listed[s.repo] = list_gguf(s.repo, endpoint)
            found.append(hf_files.pick(listed[s.repo], s.repo, s.tag, s.side_file))
    return found


def pull(pair: Pair, on_progress: Callable[[hub.Progress], None] | None = None,
         cancel: threading.Event | None = None) -> list[Path]:
    """Download the pair's Hub files (target first, then draft); builtins need nothing."""
    files = list(dict.fromkeys((c.repo, c.file) for c in remote_choices(list(pair.sources))))
    return hub.pull_files(files, on_progress=on_progress, cancel=cancel)


def local_files(sources: list[Source]) -> list[tuple[str, str]]:
    """(repo, file) on this machine (downloaded or partly) for each Hub source, each once."""
    return list(dict.fromkeys((s.repo, files[0]) for s in sources if s.repo and (files := s.files())))


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
    mine = local_files(list(pair.sources))
    others = {f for p in load_catalog().values() if p.name != pair.name and is_downloaded(p)
              for f in local_files(list(p.sources))}
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
