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
    """Dense probabilities after top-k, top-p, min-p and temperature (zeros outside the kept set)."""
    logits = np.asarray(logits, dtype=np.float64)
    n = logits.shape[0]
    if 0 < sp.top_k < n:
        idx = np.argpartition(-logits, sp.top_k - 1)[: sp.top_k]
    else:
        idx = np.arange(n)
    cand = logits[idx]
    order = np.argsort(-cand, kind="stable")
    idx, cand = idx[order], cand[order]
    if sp.top_p < 1.0 or sp.min_p > 0.0:
        p = np.exp(cand - cand[0])
        p /= p.sum()
        keep = len(p)
        if sp.top_p < 1.0:
            # smallest prefix whose mass reaches top_p (at least one token)
            keep = min(keep, int(np.searchsorted(np.cumsum(p), sp.top_p)) + 1)
        if sp.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(p >= sp.min_p * p[0]))))
        idx, cand = idx[:keep], cand[:keep]
    w = np.exp((cand - cand[0]) / sp.temperature)
    out = np.zeros(n_vocab or n, dtype=np.float64)
    out[idx] = w / w.sum()
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
