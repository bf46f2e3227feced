"""Which models to load: a catalog pair, two files, or a server that runs them, with their load settings; shared by
the CLI and the app."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine import DraftParams, Engine, EngineError, ModelSettings
from ..engine.measured import AcceptanceMemory
from .check import fitted_offload
from .gpu_speed import GpuSpeedLog

MIN_BATCH = 8  # a round verifies its draft in one batch: smaller ones leave little to draft


@dataclass(frozen=True)
class LoadSpec:
    pair: str | None = None  # a models.toml pair, or None for the files below
    target: str | None = None
    draft: str | None = None
    ctx: int = 0  # 0: min(training context, 4096)
    threads: int = 0  # 0: physical cores
    threads_draft: int = 0  # 0: same as threads
    ngl: int | None = None  # target layers on the GPU (-1: all; None: what fits, llama.cpp's -ngl auto)
    ngld: int | None = None  # draft layers on the GPU (the same)
    ctx_checkpoints: int = 8  # recurrent/hybrid models: saved states kept between chat turns
    batch: int = 0  # tokens a prompt is evaluated in at a time (llama.cpp's -b; 0: 512)
    mmproj: str | None = None  # the target's vision projector (None: the one found beside the target, if any)
    no_mmproj: bool = False  # load no projector at all
    # Or an OpenAI-compatible server that speculates itself (its API key lives in app/chat/server_keys.py, not here).
    server: str | None = None  # base URL
    model: str | None = None  # the server's model id (None: the first it lists)
    server_off: str | None = None  # the same model served without speculation, for Compare's "off" side
    method: str | None = None  # the person's label for how the server speculates

    def describe(self) -> str:
        if self.server:
            return f"{self.model or 'server'} @ {self.server}"
        if self.pair:
            return self.pair
        return Path(self.target).name + (f" + {Path(self.draft).name}" if self.draft else "") if self.target else "?"

    @property
    def may_offload(self) -> bool:
        """Whether layers may go to a GPU: asked for, or left to fit (where the build cannot offload, none do)."""
        return self.ngl != 0 or self.ngld != 0

    def offload_flags(self) -> str:
        """The GPU layers asked for, as llama.cpp's flags say them ("auto": what fits)."""
        auto = lambda n: "auto" if n is None else str(n)  # noqa: E731
        return f"-ngl {auto(self.ngl)}" + (f" -ngld {auto(self.ngld)}" if self.ngld != self.ngl else "")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LoadSpec":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True)
class Resolved:
    target: Path
    draft: Path | None
    draft_params: DraftParams  # the pair's recommended settings (defaults for files)
    mmproj: Path | None = None  # the target's vision projector
    mmproj_found: bool = False  # found beside the target, not asked for


def resolve(spec: LoadSpec) -> Resolved:
    r = _resolve_models(spec)
    if spec.no_mmproj:
        return Resolved(r.target, r.draft, r.draft_params)
    if spec.mmproj:
        return Resolved(r.target, r.draft, r.draft_params, Path(spec.mmproj).expanduser())
    return Resolved(r.target, r.draft, r.draft_params, r.mmproj or find_projector(r.target), mmproj_found=True)


def find_projector(target: Path) -> Path | None:
    """The vision projector beside a target file, as llama-server -hf finds a repo's: the one ``mmproj*.gguf`` in its
    folder (none, or several, is no projector: which one is meant would be a guess)."""
    found = [p for p in target.parent.glob("*.gguf") if p.name.lower().startswith("mmproj") and p != target]
    return found[0] if len(found) == 1 else None


def _resolve_models(spec: LoadSpec) -> Resolved:
    if spec.server:
        raise EngineError(f"{spec.describe()} is a server: it runs its own models.")
    if spec.pair:
        if spec.target or spec.draft:
            raise EngineError("Give either a pair or target/draft files, not both.")
        from .catalog import get_pair, local_path, local_projector
        from .hub import cached_path

        pair = get_pair(spec.pair)
        proj = local_projector(pair.target)  # the catalog's projector, wherever in the repo it was downloaded
        return Resolved(local_path(pair.target, pair.name), local_path(pair.draft, pair.name) if pair.draft else None,
                        pair.draft_params, cached_path(proj.repo, proj.file) if proj else None)
    if not spec.target:
        raise EngineError("Choose models: a pair (e.g. starter) or a target GGUF file with an optional draft.")
    target = Path(spec.target).expanduser()
    return Resolved(target, Path(spec.draft).expanduser() if spec.draft else find_head(target), DraftParams())


def find_head(target: Path) -> Path | None:
    """The head that drafts for a target given alone, where it was downloaded: beside the target or in its MTP/
    folder (as unsloth's repos ship them). Gemma 4's assistant made for the target's hidden size, or the target's
    MTP layers in a file of their own (a model converted without them). Judged from the headers."""
    from ..engine.drafters.gemma4_assistant import AssistantDrafter
    from ..engine.drafters.mtp import MtpFileDrafter
    from ..engine.gguf_file import metadata, read_info

    try:
        kv = metadata(target)
        gemma4 = not AssistantDrafter.target_problem(kv.get("general.architecture"))
        if not gemma4 and read_info(target).nextn_layers:  # (it drafts with its own)
            return None
        for path in sorted([*target.parent.glob("*.gguf"), *target.parent.glob("MTP/*.gguf")]):
            if (AssistantDrafter.made_for(kv, metadata(path)) if gemma4 else
                    path != target and MtpFileDrafter.made_for(target, path)):
                return path
    except (OSError, ValueError, EngineError):
        return None  # (an unreadable file is not an assistant; the target's own problems surface when it loads)
    return None


def load_engine(spec: LoadSpec, resolved: Resolved | None = None, with_draft: bool = True,
                memory: AcceptanceMemory | None = None) -> Engine:
    """``memory``: where how the drafters' tokens fare on this pair is kept across launches (the app's and the
    command line's: ``acceptance_memory.memory_for``). A plain answer with the target wholly on a GPU keeps that
    GPU's speed (``gpu_speed``)."""
    if spec.batch and not MIN_BATCH <= spec.batch:
        raise EngineError(f"Invalid --batch-size {spec.batch}: use {MIN_BATCH} or more (0: {ModelSettings.n_batch}).")
    r = resolved or resolve(spec)
    n_batch = spec.batch or ModelSettings.n_batch
    # Recurrent-state snapshots for the pair's longest draft (at least llama-server's default of 16).
    n_rs_seq = max(ModelSettings.n_rs_seq, r.draft_params.draft_max)
    with_draft = bool(r.draft and with_draft)
    offload = fitted_offload(r.target, r.draft if with_draft else None, spec.ctx, spec.ngl, spec.ngld, r.mmproj)
    return Engine(
        ModelSettings(r.target, n_ctx=spec.ctx, n_threads=spec.threads, n_gpu_layers=offload.ngl, n_rs_seq=n_rs_seq,
                      n_checkpoints=spec.ctx_checkpoints, n_batch=n_batch, offload_why=offload.why),
        ModelSettings(r.draft, n_ctx=spec.ctx, n_threads=spec.threads_draft or spec.threads,
                      n_gpu_layers=offload.ngld, n_checkpoints=spec.ctx_checkpoints, n_batch=n_batch,
                      offload_why=offload.why)
        if r.draft and with_draft else None,
        r.mmproj, r.mmproj_found, memory, GpuSpeedLog(r.target),
    )
