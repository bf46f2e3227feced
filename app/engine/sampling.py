"""Token selection: greedy argmax, the sampling transform, and exact speculative acceptance.

The transform follows llama.cpp's default chain order — top-k, top-p, min-p on the raw logits, then temperature —
and is applied identically to target (p) and draft (q) logits.

Sampling is a Gumbel-max draw whose randomness is keyed on the token's position in the sequence (``Noise``): the
token at position i is the one with the smallest E/p, where E = -log(u) and u is a uniform number made from (seed,
i, token id) alone. Plain decoding takes that token. A drafter draws its token for position i from its own q with
the same numbers, and the target accepts it exactly when it is the token the target draws there; otherwise the
target's token goes in its place. So every token committed is the target's own draw at its position, whatever was
drafted: sampled output has the target's exact distribution, and with a seed it is the same with speculation on
or off, and from one run to the next (llama-server's seeds repeat too). Drawing q and p from the same numbers
couples them: the draft's token is the target's with probability at least (1 - TV) / (1 + TV), TV the total
variation between p and q, near the best coupling's 1 - TV where they are close, as a draft model's are.
"""
from __future__ import annotations

import secrets
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
    # added to the target's logits before anything else, as llama.cpp's logit bias: ((token, bias), ...); a bias of
    # -inf bans the token. Speculation stays exact: drafts are verified against the biased distribution.
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False  # never end at an end-of-generation token (llama.cpp: a -inf bias on each)

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
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise EngineError(f"Invalid logit bias token {token!r}: use a token id (a whole number >= 0).")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or np.isnan(bias) or bias == np.inf:
                raise EngineError(f"Invalid logit bias {bias!r} for token {token}: use a finite number, or -inf to ban "
                                  "the token.")


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment


def _mix(z: int) -> int:
    """splitmix64's finaliser."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """The same on uint64 arrays (whose products wrap mod 2**64 as the masks above do)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Noise:
    """The sampler's randomness: one uniform number per (position, token id), made from the seed alone, so a
    token's draw does not depend on what was drafted, in what order, or how often (see the module's docstring).

    ``at``: the sequence position that offset 0 stands for, set by the loop before each round (the position of
    the next token), and moved by a drafter's caller where a draft continues after tokens of its own.
    """

    def __init__(self, seed: int = -1):
        # a random seed is 32 bits, as llama.cpp's: shown with a sampled answer, it can be typed back in to repeat it
        self.seed = int(seed) if seed is not None and seed >= 0 else secrets.randbits(32)
        self.at = 0

    def uniforms(self, position: int, ids: np.ndarray) -> np.ndarray:
        """u in (0, 1) for each token id at ``position``: the ids-th outputs of a splitmix64 stream whose state
        comes from (seed, position)."""
        state = _mix((self.seed * _GOLDEN + position + 1) & _MASK)
        with np.errstate(over="ignore"):
            z = _mix_array(np.uint64(state) + (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN))
        return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53

    def pick(self, dist: "Dist", offset: int = 0) -> int:
        """The Gumbel-max draw from ``dist`` at position ``at + offset``: argmin of E / p with E exponential."""
        e = -np.log(self.uniforms(self.at + offset, dist.idx)) / dist.p
        return int(dist.idx[int(np.argmin(e))])


def greedy_token(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


class _Blocks:
    """A vocabulary's logits laid out as 32 rows, with each column's maximum (one vectorised pass), so that the
    few logits above a high floor are found by looking only at the columns whose maximum reaches it: selecting
    from a 262k vocabulary then costs about one reduction instead of a compare and an index scan over all of it
    (and a row-wise reduction over small blocks would be slow in numpy). The last n % 32 logits are kept apart."""

    ROWS = 32

    def __init__(self, x: np.ndarray):
        self.x = x
        self.width = len(x) // self.ROWS
        self.n_full = self.width * self.ROWS
        self.grid = x[: self.n_full].reshape(self.ROWS, self.width)
        self.col_max = self.grid.max(axis=0)
        self.tail = x[self.n_full :]

    def max(self) -> float:
        return float(max(self.col_max.max(initial=-np.inf), self.tail.max(initial=-np.inf)))

    def at_least(self, floor: float) -> np.ndarray:
        """Indices (ascending) of the logits >= floor."""
        hit = np.flatnonzero(self.col_max >= floor)
        row, col = np.nonzero(self.grid[:, hit] >= floor)
        idx = row * self.width + hit[col]  # row-major order: ascending
        if len(self.tail):
            idx = np.concatenate([idx, np.flatnonzero(self.tail >= floor) + self.n_full])
        return idx

    def top_two(self) -> tuple[int, float]:
        """np.argmax's index (the first of tied maxima) and the largest logit at any other index, from the column
        maxima: one pass over the vocabulary where an argmax and a second max would be two (on a CPU that has just
        run a decode, each pass over a 262k row costs 100-200 µs)."""
        col_max = self.col_max
        if len(self.tail) or self.width < 2:
            return self._top_two_by_masking()
        j = int(col_max.argmax())
        m = col_max[j]
        col_max[j] = -np.inf
        other_cols = col_max.max()
        col_max[j] = m
        if other_cols == m:  # tied maxima in two columns: which comes first needs the rows (rare)
            return self._top_two_by_masking()
        col = self.grid[:, j].copy()
        r = int(col.argmax())
        col[r] = -np.inf
        return r * self.width + j, float(max(other_cols, col.max()))

    def _top_two_by_masking(self) -> tuple[int, float]:
        x = self.x
        top = int(np.argmax(x))
        if len(x) == 1:
            return top, -np.inf
        m = x[top]
        x[top] = -np.inf  # a view of llama.cpp's buffer: mask the argmax for a moment instead of copying
        second = x.max()
        x[top] = m
        return top, float(second)

    def top_k(self, k: int) -> np.ndarray:
        """Indices of the k largest logits. The k-th largest of the column maxima (and tail values) is a lower
        bound of the k-th largest logit, since each of those k columns holds a logit at least that high."""
        x = self.x
        n = len(x)
        summary = np.concatenate([self.col_max, self.tail]) if len(self.tail) else self.col_max
        if len(summary) <= 4 * k:
            return np.argpartition(x, n - k)[n - k :]
        floor = np.partition(summary, len(summary) - k)[len(summary) - k]
        cand = self.at_least(floor)
        return cand[np.argpartition(x[cand], len(cand) - k)[len(cand) - k :]]


DRAFT_TOP_K = 10  # llama.cpp's draft sampler keeps the 10 most likely tokens (common/speculative.cpp)


def draft_pick(logits: np.ndarray, p_min: float) -> tuple[int, bool, float]:
    """A greedy drafter's step, judged as llama.cpp's draft sampler judges it (top-k 10, then softmax): the argmax
    token; whether its probability among the 10 most likely reaches ``p_min``; the top-1 minus top-2 logit gap
    (the adaptive controller's signal).

    p_top >= p_min <=> the 9 others' sum of exp(l - l_top) <= budget = 1/p_min - 1, and each of them is at most
    exp(-gap): the gap alone decides unless budget/9 < exp(-gap) <= budget; only then are the top 10 found.
    """
    blocks = _Blocks(logits)
    top, second = blocks.top_two()
    m = logits[top]
    gap = float(m) - second
    if p_min <= 0.0:
        return top, True, gap
    budget = 1.0 / p_min - 1.0
    worst = np.exp(-gap)
    if worst > budget or (DRAFT_TOP_K - 1) * worst <= budget:
        return top, worst <= budget, gap
    vals = logits[blocks.top_k(min(DRAFT_TOP_K, len(logits)))].astype(np.float64)
    return top, float(np.exp(vals - float(m)).sum()) - 1.0 <= budget, gap


@dataclass(frozen=True)
class Dist:
    """A probability distribution over the few tokens the sampling transform keeps (top-k / top-p / min-p cut a
    150k-262k vocabulary to a few dozen), in token-id order so that an inverse-CDF draw picks exactly the token a
    dense vocabulary-sized array would have given for the same uniform number."""

    idx: np.ndarray  # token ids, ascending
    p: np.ndarray  # their probabilities (float64), summing to 1

    @classmethod
    def from_dense(cls, probs) -> Dist:
        probs = np.asarray(probs, dtype=np.float64)
        idx = np.flatnonzero(probs)
        return cls(idx, probs[idx])

    def dense(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float64)
        out[self.idx] = self.p
        return out

    def prob(self, token: int) -> float:
        i = int(np.searchsorted(self.idx, token))
        return float(self.p[i]) if i < len(self.idx) and self.idx[i] == token else 0.0

    def max(self) -> float:
        return float(self.p.max())


def distribution(logits: np.ndarray, sp: SamplingParams) -> Dist:
    """The probabilities after top-k, top-p, min-p and temperature, over the tokens they keep.

    Called once per verified position and per drafted token: no vocabulary-sized float64 array is made, and only
    the candidates that can survive (top-k, or the min-p set) are sorted.
    """
    x = np.asarray(logits)
    n = x.shape[0]
    blocks = _Blocks(x)
    if sp.top_k == 0 or sp.top_k >= n:
        m = blocks.max()
        if sp.top_p >= 1.0 and sp.min_p <= 0.0:  # nothing to truncate: plain softmax with temperature
            w = np.exp((x.astype(np.float64) - m) / sp.temperature)
            return Dist(np.arange(n), w / w.sum())
        # top-p normalises over the whole vocabulary; min-p keeps p >= min_p * p_max, i.e. x >= m + log(min_p)
        z_vocab = float(np.exp(x - m, dtype=np.float64).sum()) if sp.top_p < 1.0 else None
        idx = blocks.at_least(m + np.log(sp.min_p)) if sp.min_p > 0.0 else np.arange(n)
    else:
        idx = blocks.top_k(sp.top_k)
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
    p = t / t.sum()
    by_id = np.argsort(idx)
    return Dist(idx[by_id], p[by_id])


def sample(dist: Dist, rng: Noise, offset: int = 0) -> int:
    """Draw the token at position ``rng.at + offset`` from ``dist``."""
    return rng.pick(dist, offset)
