"""llama.cpp's ``ngram-map-k`` and ``ngram-map-k4v`` (common/ngram-map.cpp, ported as they are): a map from key
n-grams to where they occur, with statistics per key of the m-grams that followed it.

- ``ngram-map-k``: the key's latest occurrence found in the map proposes the m tokens after it, shortened to as many
  as the target accepted the last time that key drafted.
- ``ngram-map-k4v``: a key must have been seen ``min_hits`` times; up to four distinct m-grams that followed it are
  counted, and a draft is made only when the most frequent one is at least twice as frequent as the others together.

llama.cpp's map from an n-gram's hash to its index (2^18 slots, the first index stored wins) is kept with exact
keys: the same indices, without the rare collisions. The history only grows within a generation, so the clean-up that
``common_ngram_map_begin`` does after a shrunk history has nothing to do here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ngram import Lookup, NgramParams

MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT


@dataclass
class _Value:
    idx: int = 0  # where the m-gram starts in the history (0: an empty slot)
    num: int = 0  # times it followed the key
    n_accepted: int = 0  # tokens accepted the last time it drafted (the next draft from it is no longer)


@dataclass
class _Key:
    idx: int  # where the key n-gram occurs
    stat_idx: int = 0  # its values are counted up to here
    num: int = 0  # times it was looked up with a match
    values: list[_Value] = field(default_factory=list)


def last_match(tokens: np.ndarray, key: tuple[int, ...], lo: int, hi: int) -> int:
    """The largest j in [lo, hi] where ``key`` starts in ``tokens``; 0 if none (llama.cpp's "no match")."""
    n, lo = len(key), max(lo, 1)
    if hi < lo:
        return 0
    windows = np.lib.stride_tricks.sliding_window_view(tokens[lo : hi + n], n)
    hits = np.flatnonzero((windows == np.asarray(key, dtype=tokens.dtype)).all(axis=1))
    return lo + int(hits[-1]) if len(hits) else 0


class NgramMapK(Lookup):
    """``ngram-map-k``: see the module's docstring."""

    name = "ngram-map-k"
    KEY_ONLY = True

    def __init__(self, p: NgramParams):
        self.n, self.m, self.min_hits = p.map_k_size_n, p.map_k_size_m, p.map_k_min_hits
        self._setup()

    def _setup(self) -> None:
        self.length = self.m
        self.keys: list[_Key] = []
        self._key_of: dict[tuple[int, ...], int] = {}  # key n-gram -> its entry in self.keys
        self._first: dict[tuple[int, ...], int] = {}  # llama.cpp's key_map (hash -> index), with exact keys
        self._hashed = 0  # key_map_last_idx: starts up to here are in the map
        self._size_begin = 0
        self._last: tuple[int, int] | None = None  # (key entry, value slot) of the last draft

    def begin(self, prompt_ids: list[int]) -> None:
        self._size_begin = len(prompt_ids)

    def _hash(self, history: list[int], hi: int, lo: int) -> None:
        """Store the n-grams starting in hi..lo+1, descending; an entry already there stays (as llama.cpp's)."""
        n = self.n
        for j in range(hi, lo, -1):
            self._first.setdefault(tuple(history[j : j + n]), j)

    def _find(self, history: list[int], tokens: np.ndarray, key: tuple[int, ...], cur: int) -> int:
        n, m, begin = self.n, self.m, self._size_begin
        idx = self._first.get(key, 0)
        if idx and idx < cur - n - m - 1:
            return idx
        match = 0
        if begin > n + m + 1:  # the prompt's part not hashed yet, latest first
            match = last_match(tokens, key, self._hashed + 1, begin - n - m - 1)
        if not match:  # what came after the prompt and is not hashed yet
            match = last_match(tokens, key, max(begin, self._hashed) + 1, cur - n - m - 1)
        return match

    def lookup(self, history: list[int]) -> list[int]:
        self._last = None
        n, m, cur = self.n, self.m, len(history) - 1
        if cur < 2 * n + m:
            return []
        key = tuple(history[-n:])
        tokens = np.asarray(history[:cur], dtype=np.int64)
        match = self._find(history, tokens, key, cur)
        begin = self._size_begin
        if begin > n + m + 1:
            self._hash(history, begin - n - m - 1, self._hashed)
        self._hash(history, cur - n - m - 1, max(begin, self._hashed))
        self._hashed = max(cur - n - m - 1, self._hashed)
        if not match:
            return []
        k = self._key_of.get(key)
        if k is None:
            k = self._key_of[key] = len(self.keys)
            self.keys.append(_Key(idx=match, values=[_Value(n_accepted=m) for _ in range(MAX_VALUES)]))
        entry = self.keys[k]
        entry.num = min(entry.num + 1, MAX_COUNT)
        slot = 0 if self.KEY_ONLY else self._choose(entry, tokens, key, match)
        if slot is None:
            return []
        self._last = (k, slot)
        return history[match + n : match + n + min(m, entry.values[slot].n_accepted)]

    def _choose(self, entry: _Key, tokens: np.ndarray, key: tuple[int, ...], match: int) -> int | None:
        return 0

    def accept(self, n_accepted: int) -> None:
        if self._last is not None:
            k, slot = self._last
            self.keys[k].values[slot].n_accepted = n_accepted


class NgramMapK4v(NgramMapK):
    """``ngram-map-k4v``: see the module's docstring."""

    name = "ngram-map-k4v"
    KEY_ONLY = False

    def __init__(self, p: NgramParams):
        self.n, self.m, self.min_hits = p.map_k4v_size_n, p.map_k4v_size_m, p.map_k4v_min_hits
        self._setup()

    def _choose(self, entry: _Key, tokens: np.ndarray, key: tuple[int, ...], match: int) -> int | None:
        if entry.num < self.min_hits:
            return None
        n, m = self.n, self.m
        windows = np.lib.stride_tricks.sliding_window_view(tokens[entry.stat_idx : match + n], n)
        starts = entry.stat_idx + np.flatnonzero((windows == np.asarray(key, dtype=tokens.dtype)).all(axis=1))
        for i in starts.tolist():  # each occurrence of the key since the last count: which m-gram followed it
            begin = i + n
            for v in entry.values:
                if v.idx == 0:  # a new m-gram after the key
                    v.idx, v.num, v.n_accepted = begin, 0, m
                elif not np.array_equal(tokens[begin : begin + m], tokens[v.idx : v.idx + m]):
                    continue
                v.num = min(v.num + 1, MAX_COUNT)
                break
        entry.stat_idx = match
        nums = [v.num for v in entry.values]
        best = max(range(MAX_VALUES), key=lambda s: (nums[s], -s))
        others = sum(nums) - nums[best]
        if others > 0 and nums[best] < 2 * others:
            return None  # the most frequent m-gram is not clearly the one that follows
        return best
