"""Will it fit? A check before llama.cpp allocates a context, so an oversized pair is refused in plain words
instead of the process being killed by the out-of-memory killer mid-answer."""
from __future__ import annotations

import psutil

from .errors import EngineError

GIB = 1024**3
OVERHEAD = 256 * 1024**2  # compute buffers, logits, runtime: a generous allowance per context


def check_fits(loads: list[tuple[object, int, bool]]) -> None:
    """``loads``: (model, n_ctx, weights_on_gpu) for each model. Weights are memory-mapped (the OS can page them
    back to their file), so they must fit in RAM to run at speed; KV caches and buffers are anonymous memory and
    must fit in what is free right now."""
    vm = psutil.virtual_memory()
    weights = sum(m.size_bytes for m, _, on_gpu in loads if not on_gpu)
    cache = sum(m.kv_bytes_per_token * n_ctx + OVERHEAD for m, n_ctx, _ in loads)
    names = " + ".join(m.path.name for m, _, _ in loads)
    if weights + cache > 0.9 * vm.total:
        raise EngineError(
            f"{names} need about {(weights + cache) / GIB:.1f} GiB but this machine has {vm.total / GIB:.1f} GiB "
            "of RAM. Choose a smaller quantization or model, a smaller context (--ctx), or offload layers to a GPU "
            "(-ngl / -ngld)."
        )
    if cache > vm.available:
        raise EngineError(
            f"The context needs about {cache / GIB:.1f} GiB but only {vm.available / GIB:.1f} GiB of memory is free. "
            "Use a smaller context (--ctx) or close other programs."
        )
