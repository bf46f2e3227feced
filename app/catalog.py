"""The pair catalog (``models.toml``): load, validate, and resolve a pair name to local GGUF paths."""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .engine import DraftParams, EngineError
from .resources import resource

_PAIR_KEYS = {"description", "use", "context", "license", "draft_max", "draft_min", "draft_p_min", "adaptive",
              "target", "draft"}
_SOURCE_KEYS = {"builtin", "repo", "file", "quantization", "size_gb"}
BUILTINS = ("smollm2-135m-instruct-f32", "smollm2-135m-instruct-q4_1")


@dataclass(frozen=True)
class Source:
    builtin: str | None = None
    repo: str | None = None
    file: str | None = None
    quantization: str = ""
    size_gb: float = 0.0

    def describe(self) -> str:
        return self.builtin or f"{self.repo}/{self.file}"


@dataclass(frozen=True)
class Pair:
    name: str
    target: Source
    draft: Source
    description: str = ""
    use: str = "chat"
    context: int = 0
    license: str = ""
    draft_params: DraftParams = field(default_factory=DraftParams)


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
            pairs[name] = Pair(
                name=name,
                target=_source(raw.get("target"), f"{where} target"),
                draft=_source(raw.get("draft"), f"{where} draft"),
                description=str(raw.get("description", "")),
                use=str(raw.get("use", "chat")),
                context=int(raw.get("context", 0)),
                license=str(raw.get("license", "")),
                draft_params=dp,
            )
        except (TypeError, ValueError) as exc:
            raise EngineError(f"{where}: {exc}") from exc
    return pairs


def _source(raw, where: str) -> Source:
    if not isinstance(raw, dict):
        raise EngineError(f"{where} is missing (give builtin = ... or repo = ... and file = ...)")
    unknown = set(raw) - _SOURCE_KEYS
    if unknown:
        raise EngineError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    src = Source(**raw)
    if src.builtin:
        if src.builtin not in BUILTINS:
            raise EngineError(f"{where}: unknown builtin {src.builtin!r} (known: {', '.join(BUILTINS)})")
    elif not (src.repo and src.file):
        raise EngineError(f"{where} needs either builtin = ... or both repo = ... and file = ...")
    return src


def get_pair(name: str) -> Pair:
    pairs = load_catalog()
    if name not in pairs:
        raise EngineError(f"Unknown pair {name!r}. Known pairs: {', '.join(pairs)}.")
    return pairs[name]


def local_path(src: Source) -> Path:
    """The GGUF file on this machine for a source; builtins are prepared on first use, Hub files must be cached."""
    if src.builtin:
        from . import starter

        return starter.target_path() if src.builtin.endswith("-f32") else starter.draft_path()
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(src.repo, src.file)
    if isinstance(cached, str) and Path(cached).is_file():
        return Path(cached)
    shards = re.sub(r"-\d{5}-of-\d{5}\.gguf$", "-*.gguf", src.file)
    what = f'--include "{shards}"' if shards != src.file else src.file  # split GGUF: every shard is needed
    raise EngineError(f"{src.file} is not downloaded yet. Download it with: hf download {src.repo} {what}")
