"""How a context on recurrent memory (Mamba, RWKV, a hybrid's recurrent layers) gets back to an earlier position.

Recurrent state cannot drop a tail: it is one summary of everything read. So a rejected draft's tail is rolled back
through llama.cpp's per-token snapshots (``n_rs_seq``, where the architecture keeps them) when it lies within the
last decode; otherwise the nearest saved state at or before the position is restored, and the tokens between that
state and the position wait for the next decode (which replays them in the same batch as its own). States are saved
at chat-turn boundaries (``checkpoint``, kept up to ``n_checkpoints``) and before a batch whose last tokens a later
rollback may drop (``prepare``), unless snapshots cover it. The context that decodes (``context.Context``) keeps
the tokens; this keeps the states and what keeping them cost.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Callable

import llama_cpp.llama_cpp as ll

from ..errors import EngineError

_PARTIAL = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # a hybrid's recurrent part only; all of a pure recurrent state


@dataclass
class Saved:
    """A saved recurrent state: what the memory held after ``tokens[:n]`` (the recurrent part only, for a hybrid:
    its attention cache keeps every position and simply drops the tail)."""

    n: int
    data: ctypes.Array


@dataclass
class StateCosts:
    """What keeping recurrent state exact cost so far (measured): the price of speculation on such a model."""

    rollbacks: int = 0  # tails dropped through llama.cpp's snapshots (n_rs_seq), for free
    saves: int = 0  # states copied out (checkpoints)
    restores: int = 0  # states copied back in
    replayed: int = 0  # committed tokens evaluated again after a restore
    seconds: float = 0.0  # spent copying states out and in
    bytes: int = 0  # size of one saved state


class RecurrentRollback:
    """The ways back of one context's recurrent memory (``ptr``, ``mem``: its llama.cpp context and memory)."""

    def __init__(self, ptr, mem, name: str, n_rs_seq: int, n_checkpoints: int):
        self.ptr, self.mem, self.name = ptr, mem, name
        self.n_rs_seq, self.n_checkpoints = n_rs_seq, n_checkpoints
        self.costs = StateCosts()
        self.snapshots = 0  # trailing positions llama_memory_seq_rm can drop now (the last decode's snapshots)
        self.turns: list[Saved] = []  # checkpoint()s, by position
        self.round: Saved | None = None  # saved before the latest speculative batch
        self.spec_open = False  # the last decode was speculative and nothing was rolled back since

    def held(self) -> list[Saved]:
        return [s for s in self.turns + [self.round] if s]

    def describe(self, state_bytes: int) -> dict:
        """What recurrent memory holds beside the KV cache (``state_bytes``: one state): the state with its
        snapshots, and the saved states."""
        saved = self.held()
        saved_bytes = sum(len(s.data) for s in saved)
        return {"snapshots": self.n_rs_seq, "saved": len(saved), "bytes": state_bytes * (1 + self.n_rs_seq)
                + saved_bytes, "saved_bytes": saved_bytes}

    def back_to(self, n_keep: int, n_mem: int, position: Callable[[int], int]) -> int:
        """Bring memory holding ``n_mem`` positions back to ``n_keep`` of them (fewer: see ``restore``); returns
        how many it holds now."""
        self.turns = [s for s in self.turns if s.n <= n_keep]  # the others saved tokens that are gone
        if self.round and self.round.n > n_keep:
            self.round = None
        if n_keep >= n_mem:  # only tokens awaiting replay were dropped
            return n_mem
        if n_mem - n_keep <= self.snapshots and ll.llama_memory_seq_rm(self.mem, 0, position(n_keep), -1):
            self.costs.rollbacks += 1
            self.snapshots = 0  # a snapshot serves once
            return n_keep
        return self.restore(n_keep, position)

    def restore(self, n_keep: int, position: Callable[[int], int]) -> int:
        """Bring the memory back to the nearest saved state at or before ``n_keep`` (or empty it); returns the
        positions it holds now (the tokens after them wait for the next decode)."""
        t0 = time.perf_counter()
        saved = max((s for s in self.held() if s.n <= n_keep), key=lambda s: s.n, default=None)
        self.snapshots = 0
        ok = saved is not None and (
            ll.llama_state_seq_set_data_ext(self.ptr, saved.data, len(saved.data), 0, _PARTIAL) == len(saved.data)
            # the attention part of a hybrid still holds the later positions
            and ll.llama_memory_seq_rm(self.mem, 0, position(saved.n), -1))
        if ok:
            self.costs.restores += 1
        else:
            ll.llama_memory_clear(self.mem, True)
        self.costs.seconds += time.perf_counter() - t0
        return saved.n if ok and saved is not None else 0

    def checkpoint(self, n_mem: int) -> None:
        """Save the state after ``n_mem`` positions, where a later turn may restart (Regenerate, an edited message),
        so it replays from here instead of re-reading the conversation."""
        if any(s.n == n_mem for s in self.turns):
            return
        if len(self.turns) >= self.n_checkpoints > 0:
            # Forget the state closest after another: the one whose loss costs the shortest replay.
            gaps = [self.turns[i].n - (self.turns[i - 1].n if i else 0) for i in range(len(self.turns))]
            del self.turns[gaps.index(min(gaps))]
        if self.n_checkpoints > 0:
            self.turns.append(self._save(n_mem))
            self.turns.sort(key=lambda s: s.n)

    def prepare(self, n_batch: int, n_speculative: int, n_mem: int) -> None:
        """Before a decode of ``n_batch`` positions whose last ``n_speculative`` a later rollback may drop: make
        sure there is a way back."""
        if n_speculative <= 0:
            self.spec_open = False
            return
        if self.spec_open:
            return  # the way back saved for the speculative decode before this one covers these tokens too
        self.spec_open = True
        if n_speculative <= min(self.n_rs_seq, n_batch - 1):
            return  # llama.cpp's snapshots of this batch's last positions will do
        self.round = self._save(n_mem, reuse=self.round)

    def _save(self, n_mem: int, reuse: Saved | None = None) -> Saved:
        t0 = time.perf_counter()
        size = ll.llama_state_seq_get_size_ext(self.ptr, 0, _PARTIAL)
        buf = reuse.data if reuse is not None and len(reuse.data) == size else (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data_ext(self.ptr, buf, size, 0, _PARTIAL) != size:
            raise EngineError(f"llama.cpp could not save the recurrent state of {self.name}.")
        costs = self.costs
        costs.saves, costs.bytes = costs.saves + 1, size
        costs.seconds += time.perf_counter() - t0
        return Saved(n_mem, buf)
