"""Will it fit? Estimates from a model's size and shape (read from the GGUF header or the loaded model), checked
before llama.cpp allocates anything, so an oversized pair is refused in plain words instead of the process being
killed by the out-of-memory killer mid-answer; plus the -ngl / -ngld that make the best use of a GPU."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import psutil

from .errors import EngineError

GIB = 1024**3
OVERHEAD = 256 * 1024**2  # compute buffers, logits, runtime: a generous allowance per context
ALL = -1  # n_gpu_layers meaning "every layer"
FIT_MARGIN = 1024**3  # left free on each GPU by an automatic offload: llama.cpp's --fit-target default (1024 MiB)


@dataclass(frozen=True)
class Load:
    """One model as it would be loaded: its size and shape, the context it gets, the layers put on a GPU."""

    name: str
    size_bytes: int
    kv_bytes_per_token: int
    n_layer: int
    n_ctx: int
    gpu_layers: int = 0  # -1: all
    # Recurrent/hybrid models: the state and its n_rs_seq snapshots live beside the KV cache; saved states
    # (checkpoints: one per speculative round, and those kept between chat turns) in RAM.
    recurrent_bytes: int = 0
    n_rs_seq: int = 0
    n_checkpoints: int = 0

    def gpu_fraction(self) -> float:
        n = self.n_layer + 1  # the output layer is offloaded last, like llama.cpp's -ngl counts it
        return 1.0 if self.gpu_layers < 0 else min(self.gpu_layers, n) / n

    @property
    def kv_bytes(self) -> int:
        """The context's cache: K and V for every position, plus the recurrent state with its snapshots."""
        return self.kv_bytes_per_token * self.n_ctx + self.recurrent_bytes * (1 + self.n_rs_seq)

    @property
    def checkpoint_bytes(self) -> int:
        return self.recurrent_bytes * (self.n_checkpoints + 1) if self.recurrent_bytes else 0

    @property
    def total_bytes(self) -> int:
        """Weights plus KV cache: what the model takes with every layer on one device."""
        return self.size_bytes + self.kv_bytes

    def gpu_bytes(self) -> int:
        return int(self.total_bytes * self.gpu_fraction())


@dataclass(frozen=True)
class Gpu:
    name: str
    free: int
    total: int


@dataclass
class Fit:
    ram_need: int  # weights kept in RAM + KV caches + buffers
    cache_need: int  # the part that must be free right now (KV caches and buffers are not file-backed)
    vram_need: int
    ram_total: int
    ram_available: int
    vram_free: int | None  # None: no GPU this build can use
    problems: list[str] = field(default_factory=list)  # it will not load
    warnings: list[str] = field(default_factory=list)  # it loads, but slowly or barely

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        parts = [f"needs about {self.ram_need / GIB:.1f} GiB of RAM ({self.ram_available / GIB:.1f} GiB free of "
                 f"{self.ram_total / GIB:.1f})"]
        if self.vram_need:
            parts.append(f"{self.vram_need / GIB:.1f} GiB of GPU memory"
                         + (f" ({self.vram_free / GIB:.1f} GiB free)" if self.vram_free is not None else ""))
        return " and ".join(parts)


def estimate(loads: list[Load], gpus: list[Gpu] | None = None) -> Fit:
    """Weights are memory-mapped (the OS can page them back to their file), so they must fit in RAM to run at
    speed; KV caches and buffers are anonymous memory and must fit in what is free right now."""
    vm = psutil.virtual_memory()
    gpus = gpus or []
    vram_need = sum(m.gpu_bytes() for m in loads)
    cache = sum(int(m.kv_bytes * (1 - m.gpu_fraction())) + m.checkpoint_bytes + OVERHEAD for m in loads)
    weights = sum(int(m.size_bytes * (1 - m.gpu_fraction())) for m in loads)
    vram_free = sum(g.free for g in gpus) if gpus else None
    fit = Fit(weights + cache, cache, vram_need, vm.total, vm.available, vram_free)
    names = " + ".join(m.name for m in loads)
    if weights + cache > 0.9 * vm.total:
        fit.problems.append(
            f"{names} need about {(weights + cache) / GIB:.1f} GiB but this machine has {vm.total / GIB:.1f} GiB "
            "of RAM. Choose a smaller quantization or model, a smaller context (--ctx), or offload layers to a GPU "
            "(-ngl / -ngld)."
        )
    elif cache > vm.available:
        fit.problems.append(
            f"The context needs about {cache / GIB:.1f} GiB but only {vm.available / GIB:.1f} GiB of memory is "
            "free. Use a smaller context (--ctx) or close other programs."
        )
    elif weights + cache > vm.available:
        fit.warnings.append(
            f"{names} need about {(weights + cache) / GIB:.1f} GiB and {vm.available / GIB:.1f} GiB is free: "
            "it loads, but the system will page weights from disk until other programs free memory."
        )
    if vram_need:
        if vram_free is None:
            fit.warnings.append("GPU layers were asked for (-ngl / -ngld) but this llama.cpp build cannot offload: "
                                "everything runs on the CPU. Install a CUDA or Metal build to use the GPU.")
        elif vram_need + OVERHEAD > vram_free:
            fit.problems.append(
                f"The layers put on the GPU need about {(vram_need + OVERHEAD) / GIB:.1f} GiB but "
                f"{vram_free / GIB:.1f} GiB of GPU memory is free. Put fewer layers on the GPU (-ngl / -ngld)."
            )
    return fit


def check_fits(loads: list[Load], gpus: list[Gpu] | None = None) -> None:
    fit = estimate(loads, gpus)
    if fit.problems:
        raise EngineError(fit.problems[0])


class Offload(NamedTuple):
    """The layers put on a GPU (-ngl for the target, -ngld for the draft; -1: all), and why, in words."""

    ngl: int
    ngld: int
    why: str = ""


def recommend_offload(target: Load, draft: Load | None, gpus: list[Gpu], ngld: int | None = None,
                      extra_bytes: int = 0) -> Offload:
    """(-ngl, -ngld) for this machine, by llama.cpp's fit rule (``--fit on``: offload what fits in each device's free
    memory, leaving ``--fit-target`` 1 GiB of it free): everything on the GPU when it fits; else the draft first (it
    runs many small sequential steps, where a CPU is slowest), then as many target layers as fit beside it, each
    layer with its share of the KV cache; nothing without a GPU. ``ngld``: the draft's layers as asked (None: fit
    them too); ``extra_bytes``: what goes on the GPU with the target's first layer (a vision projector)."""
    if not gpus:
        return Offload(0, 0, "no GPU this llama.cpp build can use: every layer on the CPU")
    free = sum(g.free for g in gpus)
    where = f"{free / GIB:.1f} GiB free on {', '.join(dict.fromkeys(g.name for g in gpus))}, 1 GiB of it kept free"
    budget = free - FIT_MARGIN * len(gpus) - OVERHEAD
    if draft is None:
        ngld = 0
    elif ngld is None:
        ngld = ALL if draft.total_bytes + OVERHEAD <= budget else 0
    if draft is not None and ngld:
        budget -= replace(draft, gpu_layers=ngld).gpu_bytes() + OVERHEAD
    budget -= extra_bytes
    n = target.n_layer + 1
    if target.total_bytes <= budget:
        return Offload(ALL, ngld, f"all {n} target layers" + (" and the draft's" if ngld == ALL else "")
                       + f" fit with their KV caches in {where}")
    ngl = max(int(budget // (target.total_bytes / n)), 0)
    draft_part = "beside the draft " if ngld else "with the draft on the CPU " if draft is not None else ""
    if not ngl and not ngld:
        return Offload(0, 0, f"not one layer fits in {where}: every layer on the CPU")
    return Offload(ngl, ngld, f"{ngl} of {n} target layers fit {draft_part}in {where}; the rest run on the CPU")
