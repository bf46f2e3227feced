"""llama.cpp's ``ngram-cache`` (common/ngram-cache.cpp, ported as it is): counts of the tokens that followed every
1- to 4-gram of the history, drafting token by token the clear favourite after the longest n-gram that has one.

Three caches, tried in this order: the context's (the history of this generation, lax thresholds), a dynamic one
(``-lcd``, strict thresholds) and a static one (``-lcs``), which also weighs the others' candidates; the two files
are llama.cpp's own format (``llama-lookup-create`` writes them) and are only read here. As in llama.cpp, each
round adds the n-grams that lie wholly within the tokens new since the last round (a round that added one token adds
none), and a draft is at most 8 tokens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EngineError
from .ngram import Lookup, NgramParams

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2  # LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, LLAMA_NGRAM_STATIC
NULL = -1  # LLAMA_TOKEN_NULL: the padding of an n-gram shorter than 4
N_DRAFT = 8  # llama.cpp's create_state_ngram_cache
# per n-gram size 1..4: the fewest observations and the least share of the favourite, in percent
LAX = ((2, 2, 1, 1), (66, 50, 50, 50))
STRICT = ((4, 3, 2, 2), (75, 66, 66, 66))

Cache = dict[tuple[int, ...], dict[int, int]]  # n-gram (padded to 4) -> token -> times it followed


def ngram(tokens: list[int]) -> tuple[int, ...]:
    return tuple(tokens) + (NULL,) * (NGRAM_MAX - len(tokens))


def update(cache: Cache, tokens: list[int]) -> None:
    """common_ngram_cache_update over ``tokens`` (all of them new)."""
    for size in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(size, len(tokens)):
            part = cache.setdefault(ngram(tokens[i - size : i]), {})
            part[tokens[i]] = part.get(tokens[i], 0) + 1


def load(path: str, flag: str) -> Cache:
    """A cache file as llama.cpp saves it: per n-gram, 4 int32 tokens, an int32 count of entries, then (token,
    count) int32 pairs."""
    try:
        data = np.fromfile(Path(path), dtype="<i4")
    except (OSError, ValueError) as exc:
        raise EngineError(f"Cannot read the {flag} file {path}: {exc}") from None
    cache: Cache = {}
    i, words = 0, data.tolist()
    while i < len(words):
        if i + 5 > len(words) or words[i + 4] <= 0 or i + 5 + 2 * words[i + 4] > len(words):
            raise EngineError(f"{path} is not an n-gram cache file of llama.cpp's ({flag}): it ends mid-entry.")
        n = words[i + 4]
        pairs = words[i + 5 : i + 5 + 2 * n]
        cache[tuple(words[i : i + 4])] = dict(zip(pairs[::2], pairs[1::2]))
        i += 5 + 2 * n
    return cache


def _favourite(part: dict[int, int], static: dict[int, int]) -> tuple[int, int, int]:
    """(token, its count, all counts): the token whose count times its static weight is largest (first wins)."""
    best, best_count, best_weight, total = NULL, 0, 0, 0
    for tok, count in part.items():
        weight = 100 * static[tok] if tok in static else 1
        if count * weight > best_count * best_weight:
            best, best_count, best_weight = tok, count, weight
        total += count
    return best, best_count, total


def _try(primary: Cache, grams: list[tuple[int, ...]], static: dict[int, int], limits) -> int:
    sizes, percents = limits
    for i in range(len(grams) - 1, -1, -1):  # the longest n-gram first
        part = primary.get(grams[i])
        if part is None:
            continue
        tok, count, total = _favourite(part, static)
        if total < sizes[i] or 100 * count < percents[i] * total:
            continue
        return tok
    return NULL


def _try_static(static: Cache, gram: tuple[int, ...]) -> int:
    part = static.get(gram)
    if part is None:
        return NULL
    tok, count, total = _favourite(part, {})
    if total < LAX[0][NGRAM_STATIC - 1] or 100 * count < LAX[1][NGRAM_STATIC - 1] * total:
        return NULL
    return tok


class NgramCache(Lookup):
    """``ngram-cache``: see the module's docstring."""

    name = "ngram-cache"
    length = N_DRAFT

    def __init__(self, p: NgramParams):
        self.context: Cache = {}
        self.dynamic = load(p.lookup_cache_dynamic, "--lookup-cache-dynamic") if p.lookup_cache_dynamic else {}
        self.static = load(p.lookup_cache_static, "--lookup-cache-static") if p.lookup_cache_static else {}
        self._size = 0  # history tokens counted in the context's cache

    def lookup(self, history: list[int]) -> list[int]:
        if self._size < len(history):
            update(self.context, history[self._size :])
            self._size = len(history)
        if len(history) < NGRAM_STATIC:
            return []
        seq, out = list(history[-NGRAM_MAX:]), list[int]()
        while len(out) < N_DRAFT:
            part_static = self.static.get(ngram(seq[-NGRAM_STATIC:]), {})
            grams = [ngram(seq[-size:]) for size in range(NGRAM_MIN, NGRAM_MAX + 1)]
            tok = _try(self.context, grams, part_static, LAX)
            if tok == NULL:
                tok = _try(self.dynamic, grams, part_static, STRICT)
            if tok == NULL:
                tok = _try_static(self.static, ngram(seq[-NGRAM_STATIC:]))
            if tok == NULL:
                break
            out.append(tok)
            seq.append(tok)
        return out
