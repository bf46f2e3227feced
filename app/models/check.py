"""Judge a pair before loading it: both files' GGUF metadata, llama.cpp's compatibility rule, memory fit with
recommended -ngl / -ngld, and catalog drafts that suit a target. Nothing here loads weights."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..engine import EngineError
from ..engine.compat import AS_TEXT, compatibility_problems
from ..engine.drafters import METHODS
from ..engine.drafters.registry import head_of
from ..engine.fit import GIB, OVERHEAD, Fit, Load, Offload, estimate, recommend_offload
from ..engine.gguf_file import GgufInfo, metadata, not_a_model, read_info
from ..engine.llama import ModelSettings, gpus
from ..engine.pair import DEFAULT_CTX
from . import size_ratio
from .catalog import load_catalog, local_path, status
from .expected_speed import expected
from .gpu_speed import recall
from .hardware import unused_gpu_advice

SPEC_TYPE_OF = {m.name: m.spec_types[0] for m in METHODS}  # llama.cpp's name for each method
NOT_A_MODEL = ("not usable as the target: this file is {}, not a model; give it as the draft (-md) of the model it "
               "was made for")


@dataclass
class PairReport:
    target: GgufInfo
    draft: GgufInfo | None
    problems: list[str]  # why the draft cannot share the target's token ids (empty: compatible; else it drafts as text)
    n_ctx: int
    fit: Fit  # at the chosen -ngl / -ngld
    recommended: Offload  # (-ngl, -ngld) for this machine, and why
    suggestions: list[str] = field(default_factory=list)
    projector: str = ""  # the target's vision projector, judged from its header ("": none given or found)
    gpu_advice: str = ""  # a GPU this machine has and the build cannot use, with the command that rebuilds for it
    speed: str = ""  # plain decoding's speed here at the chosen offload, in words ("": not said)

    @property
    def compatible(self) -> bool:
        return not self.problems


def check_files(target: str | Path, draft: str | Path | None, n_ctx: int = 0, ngl: int | None = None,
                ngld: int | None = None, mmproj: str | Path | None = None) -> PairReport:
    t = read_info(Path(target).expanduser())
    d = read_info(Path(draft).expanduser()) if draft else None
    problems = compatibility_problems(t, d) if d else []
    ctx = context_of(t, n_ctx)
    devices = gpus()
    mm = Path(mmproj).expanduser() if mmproj else None
    projector = mm.stat().st_size if mm and mm.is_file() else 0
    rec = _offload(t, d, ctx, devices, None, None, projector)
    chosen = _offload(t, d, ctx, devices, ngl, ngld, projector) if (ngl, ngld) != (None, None) else rec
    extra = [Load(mm.name, projector, 0, 0, ctx, -1 if chosen.ngl else 0)] if projector and mm else []
    fit = estimate([_load(t, ctx, chosen.ngl, True)] + ([_load(d, ctx, chosen.ngld, False)] if d else []) + extra,
                   devices)
    return PairReport(t, d, problems, ctx, fit, rec, suggest_drafts(t) if (d is None or problems) else [],
                      projector_note(t, mm) if mm else "", unused_gpu_advice(), speed_here(t, chosen.ngl, fit, devices))


def speed_here(t: GgufInfo, ngl: int, fit: Fit, devices: list) -> str:
    """What plain decoding of ``t`` would make here with ``ngl`` layers offloaded, as the Models view says it of the
    catalog's pairs (expected_speed): '' for a mixture of experts (the share of its weights a token reads is not in
    its header), for layers split between a GPU and the CPU, and for a file that is no model."""
    if t.n_expert or head_of(t) or not_a_model(t.path):
        return ""
    on_gpu = bool(devices) and (ngl < 0 or ngl >= t.n_layer + 1)
    if ngl and devices and not on_gpu:
        return ""
    verdict = "fits in GPU" if on_gpu else "fits" if fit.ok else "too large"
    return expected(t.size_bytes / 1e9, t.quantization, verdict, recall(devices), [t.path.name]).note


def fitted_offload(target: Path, draft: Path | None, n_ctx: int = 0, ngl: int | None = None,
                   ngld: int | None = None, mmproj: Path | None = None) -> Offload:
    """The -ngl / -ngld a load gets: those asked for, the others (None) fitted to the GPUs' free memory as llama.cpp's
    ``-ngl auto`` does, judged from the files' headers before anything is loaded."""
    t = read_info(target)
    d = read_info(draft) if draft else None
    projector = mmproj.stat().st_size if mmproj and mmproj.is_file() else 0
    return _offload(t, d, context_of(t, n_ctx), gpus(), ngl, ngld, projector)


def context_of(target: GgufInfo, n_ctx: int) -> int:
    """The context a load gets: as asked, else the engine's default (0: min(training context, 4096))."""
    return n_ctx or min(target.context_length or DEFAULT_CTX, DEFAULT_CTX)


def _offload(t: GgufInfo, d: GgufInfo | None, ctx: int, devices: list, ngl: int | None, ngld: int | None,
             projector: int) -> Offload:
    if ngl is not None and ngld is not None or ngl is not None and d is None:
        return Offload(ngl, ngld or 0, "as asked (-ngl" + (f" {ngl} -ngld {ngld})" if d else f" {ngl})"))
    fitted = recommend_offload(_load(t, ctx, 0, True), _load(d, ctx, 0, False) if d else None, devices, ngld,
                               projector)
    if ngl is None:
        return fitted
    return Offload(ngl, fitted.ngld, f"-ngl {ngl} as asked; the draft fitted: {fitted.why}")


def projector_note(target: GgufInfo, path: Path) -> str:
    """A vision projector against its target, from both headers: a projector's ``projection_dim`` is the width
    of the text model it was converted for (llama.cpp's converter writes it so), which must be the target's."""
    try:
        kv = metadata(path)
    except EngineError as exc:
        return f"projector: {exc}"
    if kv.get("general.architecture") != "clip":
        return f"projector: {path.name} is not a vision projector (a {kv.get('general.architecture')} model)"
    kind = kv.get("clip.projector_type") or kv.get("clip.vision.projector_type") or "?"
    width, wanted = kv.get("clip.vision.projection_dim"), metadata(target.path).get(
        f"{target.architecture}.embedding_length")
    line = f"projector: {path.name} [{kind}, {path.stat().st_size / GIB:.2f} GiB]"
    if width and wanted and width != wanted:
        return f"{line}: made for a model {width} wide, not this target ({wanted}): it will be refused"
    return f"{line}: takes images" + (f" into this target's {wanted}-wide embeddings" if width == wanted else "")


def _load(info: GgufInfo, n_ctx: int, gpu_layers: int, target: bool) -> Load:
    """As the engine loads it: recurrent-state snapshots for the target only (an upper bound: llama.cpp keeps them
    only for the architectures that support it), saved states for both."""
    return Load(info.path.name, info.size_bytes, info.kv_bytes_per_token, info.n_layer, n_ctx, gpu_layers,
                info.recurrent_bytes, ModelSettings.n_rs_seq if target else 0, ModelSettings.n_checkpoints)


def suggest_drafts(target: GgufInfo) -> list[str]:
    """Catalog drafts for this target: those on disk are checked with the rule; the others are named when the
    catalog pairs them with this very file or when their name is of the target's model family. Where no draft on
    disk shares the target's tokens, those of other vocabularies follow, drafted as text, ranked by size ratio."""
    out, seen, as_text = [], set(), []
    shares_tokens = False  # a draft on disk passed the rule: no need to offer others as text
    family = _family(target.name) or _family(target.path.name)
    for pair in load_catalog().values():
        src = pair.draft
        if src is None:  # (a pair whose target drafts for itself)
            continue
        key = src.describe()
        if key in seen:
            continue
        on_disk = status(src).state in ("builtin", "downloaded")
        name = src.file or (src.repo or "").rsplit("/", 1)[-1]  # a tag source: its repo says the family
        named = target.path.name in pair.target.files() or (family and _family(name) == family)
        if not (on_disk or named):
            continue
        seen.add(key)
        if not on_disk:
            out.append(f"{key} (from pair {pair.name}; `specchat pull {pair.name}`, checked after download)")
            continue
        try:
            info = read_info(local_path(src, pair.name))
        except EngineError:
            continue
        if info.path == target.path:
            continue
        if compatibility_problems(target, info):
            as_text.append((key, info))
        else:
            shares_tokens = True
            out.append(f"{key} (on disk; tokenizer checked: compatible)")
    if not shares_tokens:
        out += [f"{key} (on disk; drafted as text, {size_ratio.describe(info.size_bytes, target.size_bytes)})"
                for key, info in size_ratio.rank(as_text, target.size_bytes, lambda x: x[1].size_bytes)]
    return out


def _family(name: str) -> str:
    """'Qwen2.5-Coder-7B-Instruct-Q4_K_M' -> 'qwen2.5-coder': the name before its parameter count."""
    m = re.match(r"^(.*?)[-_ ]\d+(\.\d+)?[bBmM]\b", name.replace(" ", "-"))
    return m.group(1).lower().replace("_", "-") if m else ""


def own_drafting(info: GgufInfo) -> str:
    """What a model drafts with by itself, from its header: its MTP (next-token-prediction) heads ('' if none, or
    if the file is a side file that holds only those)."""
    n = info.nextn_layers * (not info.only_mtp)
    return (f"this model can draft for itself: MTP, {n} head{'s' * (n > 1)} (--drafter mtp, its default without a "
            "draft model)") if n else ""


def head_verdict(head, target: GgufInfo, draft: GgufInfo, problems: list[str] = ()) -> tuple[bool, str]:
    """Can the head ``draft`` (of class ``head``: Gemma 4's assistant, EAGLE-3, a block draft, a side file) draft for
    ``target``? A head drafts from the target's own state, so it suits only some targets: judged from the two headers
    (on disk, or fetched from the Hub) as the engine judges it before loading, with the line that says so."""
    if problem := head.target_problem(target.architecture):
        return False, f"not usable: the draft is {head.DESCRIBED}, {problem}"
    if problems := list(problems) or head.pair_problems(target, draft):
        return False, f"not usable: the draft is {head.DESCRIBED}, but " + "; ".join(problems)
    needs = f"; it needs {needs}" if (needs := head.needs(draft)) else ""
    return True, (f"compatible: the draft is {head.DESCRIBED}, drafting from {head.READS} (llama.cpp: --spec-type "
                  f"{SPEC_TYPE_OF[head.METHOD]} -md FILE){needs}")


def describe(r: PairReport) -> list[str]:
    """The report as lines for a terminal (the app renders the same report as HTML)."""
    lines = []
    for role, info in (("target", r.target), ("draft", r.draft)):
        if info:
            lines.append(f"{role}: {info.path.name}  {info.name}  [{info.architecture}, {info.quantization}, "
                         f"{info.size_bytes / GIB:.2f} GiB{f', {info.n_shards} shards' if info.n_shards > 1 else ''}, "
                         f"vocab {info.n_vocab:,}, trained context {info.context_length:,}]")
    if target_head := head_of(r.target):
        lines.append(NOT_A_MODEL.format(target_head.DESCRIBED))
    lines += [f"not usable as the {role}: {info.path.name} is {what}" for role, info in (("target", r.target),
              ("draft", r.draft)) if info and (what := not_a_model(info.path))]
    if own := own_drafting(r.target):
        lines.append(own)
    if r.draft and (head := head_of(r.draft)):
        lines.append(head_verdict(head, r.target, r.draft, r.problems)[1])
    elif r.draft:
        lines.append("compatible: the draft shares the target's tokenizer" if r.compatible else
                     f"{AS_TEXT}: " + "; ".join(r.problems))
    if r.projector:
        lines.append(r.projector)
    lines.append(f"memory at {r.n_ctx:,} tokens of context: {r.fit.describe()}")
    lines += [f"will not fit: {p}" for p in r.fit.problems] + [f"warning: {w}" for w in r.fit.warnings]
    if r.speed:
        lines.append(f"speed: {r.speed}")
    ngl, ngld, why = r.recommended
    lines.append(f"recommended offload: -ngl {ngl} -ngld {ngld} ({why}; the default, -ngl auto, loads so)")
    if r.gpu_advice:
        lines.append(f"note: {r.gpu_advice}")
    if r.suggestions:
        lines.append("drafts that suit this target:")
        lines += [f"  {s}" for s in r.suggestions]
    elif (r.draft is None or not r.compatible) and not r.target.nextn_layers:
        lines.append("no catalog draft is known to suit this target; --drafter ngram speculates without one")
    return lines


def fit_note(target_gb: float, draft_gb: float, devices: list) -> str:
    """A catalog pair against this machine (``devices``: its GPUs), from its published sizes (the KV cache comes
    on top)."""
    weights = int((target_gb + draft_gb) * 1e9)
    vram = sum(g.free for g in devices)
    if devices and weights + 2 * OVERHEAD <= 0.9 * vram:
        return f"fits in GPU memory ({vram / GIB:.0f} GiB free): every layer goes there by default"
    fit = estimate([Load("pair", weights, 0, 1, 0, 0)], devices)
    if not fit.ok:
        return (f"too large: {weights / GIB:.1f} GiB of weights, {fit.ram_total / GIB:.0f} GiB of RAM"
                + ("; offload part to the GPU" if devices else ""))
    if fit.warnings:
        return f"tight: {weights / GIB:.1f} GiB of weights, {fit.ram_available / GIB:.1f} GiB free"
    return f"fits in RAM ({weights / GIB:.1f} GiB of weights)"
