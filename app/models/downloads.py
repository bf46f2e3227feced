"""Pair-level model management shared by the CLI and the app: what is downloaded, pull, remove."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from ..engine.errors import EngineError
from . import hf_files, hub
from .catalog import Pair, Projector, Source, load_catalog, local_projector, status
from .expected_speed import expected, recommend
from .hf_files import GgufChoice


def hub_files(sources: list[Source]) -> list[tuple[str, str]]:
    """(repo, file or tag) of the Hub sources, each once (a draft shared by two pairs is one download); none for
    builtins."""
    return list(dict.fromkeys((s.repo, s.tag) for s in sources if s.repo))


def pull_plan(pair: Pair, mmproj: bool = True, endpoint: str | None = None) -> list[tuple[str, GgufChoice]]:
    """What pulling the pair downloads: (role, file on the Hub today) for the target, its vision projector (none with
    ``mmproj`` False, llama.cpp's --no-mmproj) and the draft; nothing for builtins. Each tag is resolved against its
    repo's file list as llama.cpp's ``-hf repo:TAG`` does (any case, split files whole, side files in their folder):
    an upstream rename does not break a pull, a tag that fits nothing or several says what the repo has."""
    from .discover import list_all_gguf

    listed: dict[str, list[GgufChoice]] = {}  # one file list per repo (a Gemma 4 target and its assistant share one)

    def files_of(repo: str) -> list[GgufChoice]:
        if repo not in listed:
            listed[repo] = list_all_gguf(repo, endpoint)
        return listed[repo]

    plan = []
    for role, s in (("target", pair.target), ("draft", pair.draft)):
        if s is None or not s.repo:
            continue
        model = hf_files.pick(hf_files.models(files_of(s.repo)), s.repo, s.tag, s.side_file)
        plan.append((role, model))
        if mmproj and s.mmproj and (found := remote_projector(s.mmproj, model, files_of(s.mmproj.repo))):
            plan.append(("projector", found))
    return plan


def remote_projector(proj: Projector, model: GgufChoice, files: list[GgufChoice]) -> GgufChoice | None:
    """The projector file on the Hub today: the named one (an error listing the repo's projectors when it is gone),
    or the one llama.cpp's -hf takes beside ``model`` (None when the repo has none: the pair then reads text only)."""
    if not proj.file:
        return hf_files.projector(files, model.file)
    found = [c for c in files if hf_files.matches(c.file, proj.file)]
    if not found:
        have = ", ".join(c.file for c in files if hf_files.is_projector(c.file)) or "none"
        raise EngineError(f"{proj.repo} has no projector {proj.file}; its projectors: {have}. The catalog entry may be "
                          f"out of date: check {proj.repo}'s file list on the Hub.")
    return found[0]


def hf_projector(repo: str, model: str, endpoint: str | None = None) -> GgufChoice | None:
    """The vision projector llama.cpp's ``-hf owner/name[:QUANT]`` downloads with the repo's ``model`` file (None:
    the repo has none)."""
    from .discover import list_all_gguf

    return hf_files.projector(list_all_gguf(repo, endpoint), model)


def pull(pair: Pair, on_progress: Callable[[hub.Progress], None] | None = None,
         cancel: threading.Event | None = None, mmproj: bool = True) -> list[Path]:
    """Download the pair's Hub files (target, its projector, then draft); builtins need nothing."""
    files = list(dict.fromkeys((c.repo, c.file) for _, c in pull_plan(pair, mmproj)))
    return hub.pull_files(files, on_progress=on_progress, cancel=cancel)


def local_files(sources: list[Source]) -> list[tuple[str, str]]:
    """(repo, file) on this machine (downloaded or partly) for each Hub source and its downloaded projector, each
    once."""
    found = []
    for s in sources:
        if s.repo and (files := s.files()):
            found.append((s.repo, files[0]))
        if s.repo and (proj := local_projector(s, partly=True)):
            found.append((proj.repo, proj.file))
    return list(dict.fromkeys(found))


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


def images_note(target: Source) -> str:
    """Whether the pair reads images: '' where its catalog entry names no projector."""
    if not target.mmproj:
        return ""
    found = local_projector(target)
    return f"reads images ({found.file})" if found else "reads images with its projector, not downloaded"


def rows() -> list[dict]:
    """One row per catalog pair for `specchat list` and the Models view, the newest families first, each with its
    expected speed here (expected_speed) and the one pair recommended for this machine marked."""
    from ..engine.llama import gpus
    from .check import fit_note
    from .gpu_speed import recall

    devices = gpus()  # once for the whole table
    measured = recall(devices)  # plain decoding's speed on them, if measured yet
    out = []
    for p in sorted(load_catalog().values(), key=lambda p: p.released, reverse=True):  # (stable: catalog order)
        t = status(p.target)
        d = status(p.draft) if p.draft else None  # (none: the target drafts with its own MTP layers)
        fit = fit_note(p.target.size_gb, p.draft.size_gb if d else 0.0, devices)
        speed = expected(p.target.read_per_token_gb, p.target.quantization, fit, measured,
                         p.target.files() if measured else [])
        out.append({
            "pair": p.name, "use": p.use, "context": p.context, "license": p.license,
            "description": p.description,
            "target": p.target.describe(), "target_quant": p.target.quantization, "target_gb": p.target.size_gb,
            "draft": p.draft.describe() if d else OWN_MTP, "draft_quant": p.draft.quantization if d else "",
            "draft_gb": p.draft.size_gb if d else 0.0,
            "target_status": t.describe(), "draft_status": d.describe() if d else "in the target's file",
            "ready": t.state in READY and (d is None or d.state in READY),
            "fit": fit, "images": images_note(p.target), "vision": p.target.mmproj is not None,
            "released": p.released, "expected_tps": None if speed.tps is None else round(speed.tps, 1),
            "expected": speed.note, "runs_well": speed.runs_well,
        })
    best = recommend(out)
    for r in out:
        r["recommended"] = r["pair"] == best
    return out
