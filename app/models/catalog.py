"""The pair catalog (``models.toml``): load, validate, and resolve a pair name to local GGUF paths."""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..engine import DraftParams, EngineError
from ..engine.gguf_file import shard_names
from ..resources import resource
from . import hf_files

_PAIR_KEYS = {"description", "use", "released", "context", "license", "draft_max", "draft_min", "draft_p_min",
              "adaptive", "target", "draft"}
_SOURCE_KEYS = {"builtin", "repo", "file", "quantization", "side_file", "size_gb", "active_gb", "mmproj"}
USES = ("chat", "code", "reasoning")
_RELEASED = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
BUILTINS = ("smollm2-135m-instruct-f32", "smollm2-135m-instruct-q4_1")


@dataclass(frozen=True)
class Projector:
    """A target's vision projector on the Hub: one file of a repo, or (no file) the one llama.cpp's ``-hf`` takes
    from the target's repo beside the target's file (``hf_files.projector``), found again at each pull."""
    repo: str
    file: str = ""


@dataclass(frozen=True)
class Source:
    """Where a model comes from: a builtin, or a Hub repo and either a quantization tag (matched against the repo's
    file list as llama.cpp's ``-hf repo:TAG`` does, see ``hf_files``) or an explicit file name. ``side_file``: the
    model is a side file of that kind (an ``mtp-`` assistant, an ``eagle3-`` head, a ``dflash-`` / ``dspark-`` block
    draft), never the repo's main model."""
    builtin: str | None = None
    repo: str | None = None
    file: str | None = None
    quantization: str = ""
    size_gb: float = 0.0
    active_gb: float = 0.0  # a mixture of experts: the weights one token reads (0: all of them, size_gb)
    side_file: str = ""
    mmproj: Projector | None = None  # a target's vision projector, downloaded with it

    @property
    def tag(self) -> str:
        """What picks the file from the repo's list: the file name where one is given, else the quantization."""
        return self.file or self.quantization

    @property
    def read_per_token_gb(self) -> float:
        """The weights decoding one token reads: all of them, or a mixture of experts' active share."""
        return self.active_gb or self.size_gb

    def describe(self) -> str:
        if self.builtin:
            return self.builtin
        side = f" ({self.side_file} file)" if self.side_file else ""
        return f"{self.repo}/{self.file}" if self.file else f"{self.repo}:{self.quantization}{side}"

    def files(self) -> list[str]:
        """Every file this source needs on disk (all shards of a split GGUF): as found in the local Hub cache, else
        the given file's names ([] for a tag nothing was downloaded for yet)."""
        if self.builtin:
            return []
        found = local_choice(self)
        return shard_names(found.file) if found else shard_names(self.file) if self.file else []


@dataclass(frozen=True)
class Pair:
    name: str
    target: Source
    draft: Source | None  # None: the target drafts for itself with its own MTP layers
    description: str = ""
    use: str = "chat"
    released: str = ""  # "YYYY-MM": when the target's family came out (the Models view lists the newest first)
    context: int = 0
    license: str = ""
    draft_params: DraftParams = field(default_factory=DraftParams)

    @property
    def sources(self) -> tuple[Source, ...]:
        return (self.target,) + ((self.draft,) if self.draft else ())


def catalog_path() -> Path:
    """models.toml: $SPECCHAT_MODELS, else the one shipped with SpecChat."""
    env = os.environ.get("SPECCHAT_MODELS")
    return Path(env) if env else resource("models.toml")


def load_catalog(path: Path | None = None) -> dict[str, Pair]:
    path = path or catalog_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EngineError(f"Cannot read the model catalog {path}: {exc}") from exc
    pairs = {}
    for name, raw in (data.get("pairs") or {}).items():
        where = f"{path.name}: pair {name!r}"
        if not isinstance(raw, dict):
            raise EngineError(f"{where} must be a table")
        unknown = set(raw) - _PAIR_KEYS
        if unknown:
            raise EngineError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
        try:
            dp = DraftParams(
                draft_max=int(raw.get("draft_max", 8)),
                draft_min=int(raw.get("draft_min", 0)),
                draft_p_min=float(raw.get("draft_p_min", 0.5)),
                adaptive=bool(raw.get("adaptive", False)),
            )
            dp.validate()
            use, context = str(raw.get("use", "chat")), int(raw.get("context", 0))
            if use not in USES:
                raise ValueError(f"use must be one of {', '.join(USES)}, not {use!r}")
            if context < 0:
                raise ValueError("context must be a positive number of tokens")
            released = str(raw.get("released", ""))
            if released and not _RELEASED.match(released):
                raise ValueError(f"released must be a month as YYYY-MM, not {released!r}")
            pairs[name] = Pair(
                name=name,
                target=_source(raw.get("target"), f"{where} target"),
                draft=_draft(raw["draft"], f"{where} draft") if "draft" in raw else None,
                description=str(raw.get("description", "")),
                use=use,
                released=released,
                context=context,
                license=str(raw.get("license", "")),
                draft_params=dp,
            )
        except (TypeError, ValueError) as exc:
            raise EngineError(f"{where}: {exc}") from exc
    return pairs


def _source(raw, where: str) -> Source:
    if not isinstance(raw, dict):
        raise EngineError(f"{where} {'is missing' if raw is None else 'must be a table'} (give builtin = ... or "
                          "repo = ... and file = ...)")
    unknown = set(raw) - _SOURCE_KEYS
    if unknown:
        raise EngineError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    src = Source(**{k: v for k, v in raw.items() if k != "mmproj"})
    if "mmproj" in raw:
        src = replace(src, mmproj=_projector(raw["mmproj"], src, where))
    if not isinstance(src.size_gb, (int, float)) or src.size_gb < 0 or not isinstance(src.quantization, str):
        raise EngineError(f"{where}: size_gb must be a number of GB and quantization a name like Q4_K_M")
    if not isinstance(src.active_gb, (int, float)) or not 0 <= src.active_gb <= max(src.size_gb, 0):
        raise EngineError(f"{where}: active_gb must be the GB one token reads, at most size_gb")
    if src.builtin:
        if src.builtin not in BUILTINS:
            raise EngineError(f"{where}: unknown builtin {src.builtin!r} (known: {', '.join(BUILTINS)})")
    elif not (src.repo and (src.file or src.quantization)):
        raise EngineError(f"{where} needs either builtin = ..., or repo = ... and file = ... or a quantization tag "
                          "(quantization = \"Q4_K_M\")")
    elif not _REPO_ID.match(str(src.repo)) or (src.file and not str(src.file).endswith(".gguf")):
        raise EngineError(f"{where}: repo must look like owner/name and file must be a .gguf file name")
    elif src.side_file not in ("", *hf_files.SIDE_KINDS):
        raise EngineError(f"{where}: side_file must be one of {', '.join(hf_files.SIDE_KINDS)}, not {src.side_file!r}")
    return src


def _draft(raw, where: str) -> Source:
    src = _source(raw, where)
    if src.mmproj:
        raise EngineError(f"{where}: only the target carries a vision projector (mmproj): the draft reads no images")
    return src


def _projector(raw, src: Source, where: str) -> Projector | None:
    """``mmproj = true`` (the target repo's projector, by llama.cpp's rule) or ``{ repo = ..., file = ... }`` (repo
    defaults to the target's)."""
    if raw is False:
        return None
    if not src.repo:
        raise EngineError(f"{where}: only a Hub target has a vision projector (mmproj)")
    if raw is True:
        return Projector(src.repo)
    if isinstance(raw, dict) and set(raw) <= {"repo", "file"} and str(raw.get("file", "")).endswith(".gguf") \
            and _REPO_ID.match(str(raw.get("repo", src.repo))):
        return Projector(str(raw.get("repo", src.repo)), str(raw["file"]))
    raise EngineError(f"{where}: mmproj must be true (the target repo's own projector, picked as llama.cpp's -hf "
                      "does) or { repo = \"owner/name\", file = \"mmproj-F16.gguf\" } (repo defaults to the "
                      "target's)")


def get_pair(name: str) -> Pair:
    pairs = load_catalog()
    if name not in pairs:
        raise EngineError(f"Unknown pair {name!r}. Known pairs: {', '.join(pairs)}.")
    return pairs[name]


def local_path(src: Source, pair: str | None = None) -> Path:
    """The GGUF file on this machine for a source (a split GGUF: its first shard, with every shard present);
    builtins are prepared on first use, Hub files must have been pulled."""
    if src.builtin:
        from . import starter

        return starter.target_path() if src.builtin.endswith("-f32") else starter.draft_path()
    from .hub import cached_path

    paths = [cached_path(src.repo, f) for f in src.files()]
    if paths and all(paths):
        return paths[0]
    how = (f"specchat pull {pair}" if pair else f"specchat pull --repo {src.repo} --file {src.file}" if src.file
           else f"specchat pull -hf {src.repo}:{src.quantization}")
    raise EngineError(f"{src.file or src.describe()} is not downloaded yet. Download it with: {how} (or in the app's "
                      "Models tab)")


def local_choice(src: Source) -> hf_files.GgufChoice | None:
    """The file of the local Hub cache (downloaded or partly downloaded) that a Hub source names, if any: the tag is
    matched against what is on disk exactly as against the repo's list at pull time."""
    from .hub import local_names

    entries = [(name, 0) for name in local_names(src.repo)]
    try:
        return hf_files.pick(hf_files.group(src.repo, entries, whole_only=False), src.repo, src.tag, src.side_file)
    except EngineError:
        return None


def local_projector(src: Source, partly: bool = False) -> hf_files.GgufChoice | None:
    """A Hub target's vision projector downloaded to this machine (None: it has none, or it is not downloaded; with
    ``partly``, a partial download counts): the named file, or the one llama.cpp's rule picks beside the target's
    file among the projectors on disk."""
    from .hub import cached_path, local_names

    target = local_choice(src) if src.mmproj else None
    if target is None:
        return None
    repo = src.mmproj.repo
    here = [c for c in hf_files.group(repo, [(name, 0) for name in local_names(repo)])
            if partly or cached_path(repo, c.file)]
    if src.mmproj.file:
        return next((c for c in here if hf_files.matches(c.file, src.mmproj.file)), None)
    return hf_files.projector(here, target.file)


@dataclass(frozen=True)
class Status:
    """How much of a source is on this machine."""

    state: str  # "builtin", "downloaded", "partial" or "missing"
    have_bytes: int = 0
    total_bytes: int = 0

    def describe(self) -> str:
        if self.state == "partial" and self.total_bytes:
            return f"partly downloaded ({self.have_bytes / self.total_bytes:.0%})"
        return {"missing": "not downloaded"}.get(self.state, self.state)


def status(src: Source) -> Status:
    if src.builtin:
        return Status("builtin")
    from .hub import cached_path, partial_bytes

    total = int(src.size_gb * 1e9)
    have = 0
    files = src.files()
    complete = bool(files)  # nothing of a tag on disk yet: missing
    for f in files:
        path = cached_path(src.repo, f)
        if path:
            have += path.stat().st_size
        else:
            complete = False
            have += partial_bytes(src.repo, f)
    if complete:
        return Status("downloaded", have, have)
    return Status("partial" if have else "missing", have, max(total, have))
