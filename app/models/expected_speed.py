"""How fast a catalog pair would decode on this machine, before speculation, and which pair suits it best.

Plain decoding reads every weight the target uses once per token, so on a CPU the target's size over the memory
bandwidth bounds its tokens/s. The bandwidth is measured here, once per process: the best of a few copies of a
buffer larger than any cache. EFFICIENCY is the share of that bound llama.cpp's CPU decoding reaches, measured with
``bench/expected_speed.py`` (the starter's measured tokens/s beside this estimate, in one run): an unquantized
model is bound by memory, and reached 1.09x and 1.20x the copy figure in two runs (two threads read faster than one
copies); a quantized one spends its time unpacking weights on a small CPU, and reached 0.37x in both (the starter's
Q4_1 draft, 2 cores).
A pair that fits in GPU memory runs there: what is said of its speed comes from targets measured on that GPU
(``gpu_speed``), and nothing is guessed before one was.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .gpu_speed import GpuSpeed

# measured tokens/s x bytes per token / copy bandwidth: bench/expected_speed.py, 2 cores, 2026-12-04 (medians of 3)
EFFICIENCY = {"float": 1.1, "quantized": 0.4}
FLOATS = ("F32", "F16", "BF16")
CRAWL_TPS = 5.0  # below this a pair that fits would crawl: slower than people read
GOOD_TPS = 10.0  # from this a pair runs well here (the recommendation's bar)
_BUFFER = 256 * 2**20  # bytes: well past the last-level cache of desktop CPUs


@functools.cache
def ram_bandwidth() -> float:
    """Bytes per second a copy moves here (read and write counted), the best of three."""
    a = np.ones(_BUFFER // 8)
    b = np.zeros_like(a)  # (touched: the first copy would otherwise time page faults)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best


def cpu_tps(active_gb: float, quantization: str = "Q4_K_M") -> float:
    """Plain decoding's expected tokens/s on the CPU for a target that reads ``active_gb`` GB of weights a token."""
    share = EFFICIENCY["float" if quantization.upper() in FLOATS else "quantized"]
    return share * ram_bandwidth() / (active_gb * 1e9) if active_gb > 0 else 0.0


@dataclass(frozen=True)
class Expected:
    tps: float | None  # None: not estimated (it runs on the GPU, or does not fit)
    note: str  # in words, for the Models view and `specchat list`
    runs_well: bool  # fits, and fast enough to chat with


def expected(active_gb: float, quantization: str, fit: str, gpu: GpuSpeed | None = None,
             files: Sequence[str] = ()) -> Expected:
    """The speed ``fit`` (check.fit_note's verdict) allows a target of ``quantization`` reading ``active_gb`` GB of
    weights per token; for a pair that fits in GPU memory, what plain decoding measured on that GPU (``gpu``) says
    of it, exactly where one of the target's ``files`` was measured, else as a floor."""
    if fit.startswith("fits in GPU"):
        if gpu is None:
            return Expected(None, "on the GPU: faster than the CPU (measured here once a model answers on the GPU "
                                  "with speculation off)", True)
        tps, m = gpu.floor(active_gb * 1e9, files)
        floor = m.model not in files  # (else the target's own figure)
        if floor and tps < CRAWL_TPS:  # (a floor that low says nothing)
            return Expected(None, "on the GPU: faster than the CPU (the models measured on this GPU are too small "
                                  "to tell how much)", True)
        if floor:  # (it may run far faster, so it is not judged by it)
            return Expected(tps, f"at least {tps:.0f} tok/s on this GPU before speculation (from {m.model}, "
                                 "measured here)", True)
        where, basis = "on this GPU", " (measured)"
    elif fit.startswith("too large"):
        return Expected(None, "", False)
    else:
        tps, where, basis = cpu_tps(active_gb, quantization), "here", ""
    if tps < CRAWL_TPS:
        return Expected(tps, f"≈{tps:.1f} tok/s {where} before speculation: it fits, but would crawl", False)
    return Expected(tps, f"≈{tps:.0f} tok/s {where} before speculation{basis}", tps >= GOOD_TPS)


def recommend(rows: list[dict]) -> str | None:
    """The pair to suggest for this machine: of those that run well here, the largest target (the most capable),
    the newest family among equals. ``rows``: downloads.rows()."""
    good = [r for r in rows if r["runs_well"]]
    best = max(good, key=lambda r: (r["target_gb"], r["released"]), default=None)
    return best["pair"] if best else None
