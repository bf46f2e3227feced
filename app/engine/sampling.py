"""Token selection: greedy argmax, the sampling transform, and exact speculative acceptance.

The transform follows llama.cpp's default chain order — top-k, top-p, min-p on the raw logits, then temperature —
and is applied identically to target (p) and draft (q) logits, as exact speculative sampling requires.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    seed: int = -1  # -1: random

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise EngineError(f"Invalid temperature {self.temperature}: use 0 (greedy) or a positive number.")
        if self.top_k < 0:
            raise EngineError(f"Invalid top-k {self.top_k}: use 0 (off) or a positive number of tokens.")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"Invalid top-p {self.top_p}: it must be in (0, 1]; 1 turns it off.")
        if not 0.0 <= self.min_p < 1.0:
            raise EngineError(f"Invalid min-p {self.min_p}: it must be in [0, 1); 0 turns it off.")


def make_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(None if seed is None or seed < 0 else seed)


def greedy_token(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the argmax token (the draft's confidence, compared with --draft-p-min)."""
    m = logits.max()
    return float(1.0 / np.exp(logits - m).sum())


def distribution(logits: np.ndarray, sp: SamplingParams, n_vocab: int | None = None) -> np.ndarray:
    """Dense probabilities after top-k, top-p, min-p and temperature (zeros outside the kept set).

    Called once per verified position and per drafted token, so it avoids full-vocabulary sorts and float64
    copies: only the candidates that can survive (top-k, or the min-p set) are sorted.
    """
    x = np.asarray(logits)
    n = x.shape[0]
    out = np.zeros(n_vocab or n, dtype=np.float64)
    m = float(x.max())
    if sp.top_k == 0 or sp.top_k >= n:
        if sp.top_p >= 1.0 and sp.min_p <= 0.0:  # nothing to truncate: plain softmax with temperature
            w = np.exp((x.astype(np.float64) - m) / sp.temperature)
            out[:n] = w / w.sum()
            return out
        # top-p normalises over the whole vocabulary; min-p keeps p >= min_p * p_max, i.e. x >= m + log(min_p)
        z_vocab = float(np.exp(x - m, dtype=np.float64).sum()) if sp.top_p < 1.0 else None
        idx = np.flatnonzero(x >= m + np.log(sp.min_p)) if sp.min_p > 0.0 else np.arange(n)
    else:
        idx = np.argpartition(x, n - sp.top_k)[n - sp.top_k :]
        z_vocab = None  # after top-k, top-p normalises over the k candidates
    cand = x[idx].astype(np.float64)
    order = np.argsort(-cand, kind="stable")
    idx, cand = idx[order], cand[order]
    w = np.exp(cand - cand[0])
    keep = len(w)
    if sp.top_p < 1.0:
        z = w.sum() if z_vocab is None else z_vocab
        keep = min(keep, int(np.searchsorted(np.cumsum(w) / z, sp.top_p)) + 1)  # smallest prefix reaching top_p
    if sp.min_p > 0.0:
        keep = min(keep, max(1, int(np.count_nonzero(w >= sp.min_p))))  # w is p / p_max
    idx, cand = idx[:keep], cand[:keep]
    t = np.exp((cand - cand[0]) / sp.temperature)
    out[idx] = t / t.sum()
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token by inverse CDF (one uniform per draw keeps runs reproducible for a seed)."""
    c = np.cumsum(probs)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(probs) - 1))


def accept_or_resample(
    p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """Exact speculative sampling step (Leviathan et al. 2023, Chen et al. 2023).

    ``p``: target distribution at this position, ``q``: the distribution the draft sampled ``token`` from
    (None for a deterministic proposal such as n-gram lookup, i.e. q is one-hot on ``token``).
    Accept with probability min(1, p/q); otherwise return a token drawn from normalize(max(0, p - q)).
    """
    q_tok = 1.0 if q is None else (float(q[token]) if token < len(q) else 0.0)
    p_tok = float(p[token]) if token < len(p) else 0.0
    if q_tok > 0.0 and rng.random() * q_tok < p_tok:
        return True, token
    residual = p.copy()
    if q is None:
        if token < len(residual):
            residual[token] = 0.0
    else:
        m = min(len(residual), len(q))
        residual[:m] -= q[:m]
        np.maximum(residual, 0.0, out=residual)
    if residual.sum() <= 0.0:  # p == q up to rounding: rejection had probability ~0, fall back to p
        residual = p
    return False, sample(residual, rng)
