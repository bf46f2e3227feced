"""One llama.cpp context (sequence 0) and the tokens its cache holds: prefix reuse, rollback of rejected tails on
every kind of memory (attention, sliding-window, recurrent), decoding in chunks, logits rows."""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from .backend import Cancelled, failure, log_tail, logits_row
from .model import Model


@dataclass
class _Saved:
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


_PARTIAL = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # a hybrid's recurrent part only; all of a pure recurrent state


class Context:
    """One llama.cpp context (sequence 0) plus the list of tokens its cache holds, position by position.

    ``truncate(n)`` keeps ``tokens[:n]`` on every model. An attention cache drops the tail. Recurrent state cannot
    (it is one summary of everything read), so for those models the context rolls back through llama.cpp's
    per-token snapshots (``n_rs_seq``, where the architecture keeps them) when the dropped tail lies within the
    last decode, and otherwise restores the nearest saved state at or before ``n``; the tokens between that state
    and ``n`` are replayed by the next ``decode``, in the same batch as its own tokens. Saved states come from
    ``checkpoint()`` (chat-turn boundaries, kept up to ``n_checkpoints``) and from ``decode(n_speculative=k)``,
    which saves the state before a batch whose last k tokens a later truncate may drop, unless snapshots cover it.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512, n_outputs_max: int = 64,
                 n_rs_seq: int = 0, n_checkpoints: int = 8):
        self.model = model
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(n_batch, n_ctx)
        params.n_ubatch = min(n_batch, n_ctx)
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.n_outputs_max = n_outputs_max
        # llama.cpp clamps n_rs_seq to 0 where the architecture keeps no snapshots, and aborts the process unless a
        # micro-batch can hold the n_rs_seq + 1 positions they are taken from plus one more.
        params.n_rs_seq = max(0, min(n_rs_seq, params.n_ubatch - 2)) if model.recurrent else 0
        params.no_perf = True
        # Sliding-window layers (Gemma 3) keep the whole context, not just the window plus a batch: a smaller SWA
        # cache is a ring whose order our rollbacks and edited turns scramble, so llama-server's test (the oldest
        # position held reaches back a window) can pass while a position the next token attends to is gone, and
        # greedy output drift after an edited turn (seen with the tiny Gemma 3 pair of tests/test_sliding_window.py:
        # with the smaller cache the edited turn's answer changed at its sixth token although that test passed).
        params.swa_full = True
        # Flash attention's CPU kernel splits the KV range differently for 1 and for n queries, so batched
        # verification would round differently from one-token decoding; plain attention is batch-invariant.
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        log_tail.clear()
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise failure(
                f"llama.cpp could not create a {n_ctx}-token context for {model.path.name}",
                "Try a smaller context (--ctx) or fewer GPU layers.",
            )
        self.ptr = ptr
        self.n_ctx = int(ll.llama_n_ctx(ptr))
        self.n_batch = int(params.n_batch)
        self.n_outputs_max = n_outputs_max
        self.mem = ll.llama_get_memory(ptr)
        self.tokens: list[int] = []  # the cached sequence, position by position (the tail may await replay)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._n_vocab = model.n_vocab
        self._cancel: threading.Event | None = None
        self._abort_cb = ll.ggml_abort_callback(self._should_abort)
        # Recurrent memory only:
        self.recurrent = model.recurrent
        self.n_rs_seq = int(ll.llama_n_rs_seq(ptr))
        self.n_checkpoints = n_checkpoints
        self.state_costs = StateCosts()
        self._n_mem = 0  # positions llama.cpp's memory really holds; tokens[_n_mem:] are replayed by the next decode
        self._rollback = 0  # trailing positions llama_memory_seq_rm can drop now (the last decode's snapshots)
        self._turns: list[_Saved] = []  # checkpoint()s, by position
        self._round: _Saved | None = None  # saved before the latest speculative batch
        self._spec_open = False  # the last decode was speculative and nothing was truncated since
        self.captures: list = []  # what heads read, kept by position after each decode (heads.Capture)
        self.media = None  # a vision.Projector: evaluates the images whose placeholders (negative ids) a prompt holds
        # (where an image ends in ``tokens``, how far positions run behind indices from there): an M-RoPE model's
        # image takes fewer positions than cache cells, so after it a token's position is less than its index
        self._gaps: list[tuple[int, int]] = []

    @property
    def n_held(self) -> int:
        """Positions llama.cpp's memory holds now; ``tokens`` beyond them are evaluated by the next decode."""
        return self._n_mem

    @property
    def n_pending(self) -> int:
        """Tokens awaiting replay after a restore (recurrent memory)."""
        return len(self.tokens) - self._n_mem

    def cache_bytes(self) -> int:
        """KV cache, recurrent state and its snapshots (as allocated), and the saved states held now."""
        return self.model.kv_bytes_per_token * self.n_ctx + self.recurrent_state()["bytes"]

    def recurrent_state(self) -> dict:
        """What recurrent memory holds beside the KV cache: the state with its snapshots, and saved states."""
        saved = [s for s in self._turns + [self._round] if s]
        live = self.model.recurrent_bytes * (1 + self.n_rs_seq)
        saved_bytes = sum(len(s.data) for s in saved)
        return {"snapshots": self.n_rs_seq, "saved": len(saved), "bytes": live + saved_bytes,
                "saved_bytes": saved_bytes}

    def memory_pos_max(self) -> int:
        """Highest position llama.cpp's memory holds for sequence 0 (-1 when empty); position(n_held) - 1 where
        no M-RoPE image took fewer positions than cells."""
        return int(ll.llama_memory_seq_pos_max(self.mem, 0))

    @property
    def n_threads(self) -> int:
        return int(ll.llama_n_threads(self.ptr))

    def set_threads(self, n: int) -> None:
        """CPU threads for the next decodes (one-token and batched alike)."""
        if n != self.n_threads:
            ll.llama_set_n_threads(self.ptr, n, n)

    def _should_abort(self, _data) -> bool:
        return bool(self._cancel is not None and self._cancel.is_set())

    def set_cancel(self, event: threading.Event | None) -> None:
        """Let a cancel event interrupt a long ``llama_decode`` (prompt processing) between micro-batches."""
        self._cancel = event

    # --- cache bookkeeping ----------------------------------------------------------------------------------
    def truncate(self, n_keep: int) -> None:
        """Keep ``tokens[:n_keep]``: drop rejected draft tokens, an edited chat turn."""
        self._spec_open = False
        n_keep = max(n_keep, 0)
        if n_keep >= len(self.tokens):
            return
        n_keep = self._image_start(n_keep)  # an image is kept whole or not at all
        del self.tokens[n_keep:]
        self._trim_gaps(n_keep)
        if not self.recurrent:
            self._drop_from(n_keep)
            return
        self._turns = [s for s in self._turns if s.n <= n_keep]  # the others saved tokens that are gone
        if self._round and self._round.n > n_keep:
            self._round = None
        if n_keep >= self._n_mem:  # only tokens awaiting replay were dropped
            return
        if self._n_mem - n_keep <= self._rollback and ll.llama_memory_seq_rm(self.mem, 0, self.position(n_keep), -1):
            self.state_costs.rollbacks += 1
            self._n_mem, self._rollback = n_keep, 0  # a snapshot serves once
            return
        self._restore(n_keep)

    def position(self, i: int) -> int:
        """The position of ``tokens[i]`` (its index, less what M-RoPE images before it saved)."""
        for end, behind in reversed(self._gaps):
            if end <= i:
                return i - behind
        return i

    def _trim_gaps(self, n: int) -> None:
        while self._gaps and self._gaps[-1][0] > n:
            self._gaps.pop()

    def _image_start(self, n: int) -> int:
        """``n``, or where the image that position ``n`` falls inside starts."""
        key = self.tokens[n]
        if n == 0 or key >= 0 or self.tokens[n - 1] != key:
            return n
        start = n
        while start > 0 and self.tokens[start - 1] == key:
            start -= 1
        size = self.media.n_tokens(key) if self.media else n - start  # (the same image twice in a row: two runs)
        return start + (n - start) // size * size

    def _drop_from(self, n_keep: int) -> None:
        """Attention caches: remove positions >= n_keep (all of them when llama.cpp refuses a partial removal)."""
        if n_keep <= 0 or not ll.llama_memory_seq_rm(self.mem, 0, self.position(n_keep), -1):
            ll.llama_memory_clear(self.mem, True)
            n_keep = 0
        del self.tokens[n_keep:]
        self._trim_gaps(n_keep)
        self._n_mem = n_keep

    def reuse_prefix(self, history: list[int]) -> int:
        """Keep the longest cached prefix of ``history`` and return its length (the next position to fill)."""
        self.truncate(common_prefix(self.tokens, history))
        return len(self.tokens)

    def checkpoint(self) -> None:
        """Recurrent memory: save the state here, where a later turn may restart (Regenerate, an edited message),
        so it replays from here instead of re-reading the conversation. Nothing to do for attention caches."""
        if not self.recurrent or self._n_mem != len(self.tokens) or self._n_mem == 0:
            return
        if any(s.n == self._n_mem for s in self._turns):
            return
        if len(self._turns) >= self.n_checkpoints > 0:
            # Forget the state closest after another: the one whose loss costs the shortest replay.
            gaps = [self._turns[i].n - (self._turns[i - 1].n if i else 0) for i in range(len(self._turns))]
            del self._turns[gaps.index(min(gaps))]
        if self.n_checkpoints > 0:
            self._turns.append(self._save())
            self._turns.sort(key=lambda s: s.n)

    def _save(self, reuse: _Saved | None = None) -> _Saved:
        t0 = time.perf_counter()
        size = ll.llama_state_seq_get_size_ext(self.ptr, 0, _PARTIAL)
        buf = reuse.data if reuse is not None and len(reuse.data) == size else (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data_ext(self.ptr, buf, size, 0, _PARTIAL) != size:
            raise EngineError(f"llama.cpp could not save the recurrent state of {self.model.path.name}.")
        costs = self.state_costs
        costs.saves, costs.bytes = costs.saves + 1, size
        costs.seconds += time.perf_counter() - t0
        return _Saved(self._n_mem, buf)

    def _restore(self, n_keep: int) -> None:
        """Bring the memory back to the nearest saved state at or before ``n_keep`` (or empty it); the tokens after
        it wait for the next decode."""
        t0 = time.perf_counter()
        saved = max((s for s in self._turns + [self._round] if s and s.n <= n_keep), key=lambda s: s.n,
                    default=None)
        self._rollback = 0
        ok = saved is not None and (
            ll.llama_state_seq_set_data_ext(self.ptr, saved.data, len(saved.data), 0, _PARTIAL) == len(saved.data)
            # the attention part of a hybrid still holds the later positions
            and ll.llama_memory_seq_rm(self.mem, 0, self.position(saved.n), -1))
        if ok:
            self._n_mem = saved.n
            self.state_costs.restores += 1
        else:
            ll.llama_memory_clear(self.mem, True)
            self._n_mem = 0
        self.state_costs.seconds += time.perf_counter() - t0

    # --- evaluation -----------------------------------------------------------------------------------------
    def decode(self, tokens: list[int], n_logits: int = 1, n_speculative: int = 0) -> None:
        """Append ``tokens`` to the cache; keep logits for the last ``n_logits`` of them (read with ``logits``).

        ``n_speculative``: how many of the last tokens a later ``truncate`` may drop (draft tokens on trial), with
        those of decodes right before this one that were speculative too; recurrent memory prepares for it.
        Tokens awaiting replay after a restore go first, in the same batch. Long inputs are split into n_batch
        chunks. On failure or cancellation the cache keeps what it held before, so the token bookkeeping never
        disagrees with llama.cpp's memory.
        """
        if not tokens:
            return
        start = len(self.tokens)
        if start + len(tokens) > self.n_ctx:
            raise EngineError(
                f"Context full: {start + len(tokens)} tokens needed but the context holds {self.n_ctx}. "
                "Use a larger context (--ctx) or a shorter prompt/conversation."
            )
        batch = self.tokens[self._n_mem :] + tokens
        if self.recurrent:
            self._prepare(len(batch), n_speculative)
        # ggml polls the abort callback at every graph node: a Python call each time, too slow for per-token
        # decodes, so only long (prompt) decodes are made interruptible.
        abortable = self._cancel is not None and len(batch) > 64
        if abortable:
            ll.llama_set_abort_callback(self.ptr, self._abort_cb, ctypes.c_void_p(0))
        try:
            self._evaluate(batch, self._n_mem, n_logits)
        finally:
            if abortable:
                ll.llama_set_abort_callback(self.ptr, ll.ggml_abort_callback(), ctypes.c_void_p(0))
        self.state_costs.replayed += len(batch) - len(tokens)
        self.tokens.extend(tokens)
        self._n_mem = len(self.tokens)

    def prefill(self, tokens: list[int]) -> None:
        """Evaluate a prompt's uncached tokens, logits for the last. Recurrent memory keeps a checkpoint before that
        last token: where Regenerate restarts, and the nearest way back when the next turn changes the answer."""
        for _ in self.prefill_steps(tokens):
            pass

    def prefill_steps(self, tokens: list[int]) -> Iterator[int]:
        """``prefill``, yielding how many of ``tokens`` are evaluated after each batch: the batches one decode of
        them makes (each text run split from its end in n_batch pieces, each image whole), so the cache holds the
        same values either way."""
        last = tokens[-1:] if self.recurrent and len(tokens) > 1 and tokens[-1] >= 0 else []
        body = tokens[: len(tokens) - len(last)]
        n_pending = len(self.tokens) - self._n_mem  # (replayed in front of the first batch)
        done = 0
        for end in self._batch_ends(self.tokens[self._n_mem:] + body):
            if end > n_pending:
                piece = body[done : end - n_pending]
                self.decode(piece, n_logits=0 if last or end - n_pending < len(body) else 1)
                done += len(piece)
                yield done
        if last:
            self.checkpoint()
            self.decode(last, n_logits=1)
            yield len(tokens)

    def _batch_ends(self, tokens: list[int]) -> list[int]:
        """Where a decode of ``tokens`` ends its batches (see ``_evaluate``)."""
        runs = _runs(tokens, self.media.n_tokens) if self.media and min(tokens, default=0) < 0 else \
            [(0, len(tokens), False)]
        ends = []
        for i, j, image in runs:
            ends += [j] if image else list(range(i + self._remainder(j - i), j + 1, self.n_batch))
        return ends

    def _remainder(self, n: int) -> int:
        """The odd-sized batch of ``n`` positions split into n_batch ones (n_batch when they divide evenly)."""
        return (n - 1) % self.n_batch + 1

    def _prepare(self, n_batch: int, n_speculative: int) -> None:
        """Before a recurrent decode: make sure a later truncate into its speculative tokens has a way back."""
        if n_speculative <= 0:
            self._spec_open = False
            return
        if self._spec_open:
            return  # the way back saved for the speculative decode before this one covers these tokens too
        self._spec_open = True
        if n_speculative <= min(self.n_rs_seq, n_batch - 1):
            return  # llama.cpp's snapshots of this batch's last positions will do
        self._round = self._save(reuse=self._round)

    def _evaluate(self, tokens: list[int], start: int, n_logits: int) -> None:
        """Decode ``tokens`` at ``start``: text in batches, each image's positions through the projector."""
        if min(tokens) >= 0:
            return self._decode_chunks(tokens, start, n_logits)
        if self.media is None:
            raise EngineError(f"The prompt holds an image but no projector (--mmproj) is loaded for "
                              f"{self.model.path.name}.")
        try:
            for i, j, image in _runs(tokens, self.media.n_tokens):
                last = j == len(tokens)
                if image:
                    pos = self.position(start + i)
                    self.media.evaluate(self.ptr, tokens[i], pos, self.n_batch, last and n_logits > 0)
                    self._n_out, self._last_chunk = 1, 0  # (logits(-1): the last output, row -1)
                    # libmtmd decoded the image n_batch positions at a time: only the last batch's rows can be read
                    n_last = self._remainder(j - i)
                    for capture in self.captures:
                        capture.skip(start + i, j - i - n_last)
                        capture.keep(start + j - n_last, n_last)
                    behind = start + j - (pos + self.media.n_pos(tokens[i]))
                    if behind and (not self._gaps or self._gaps[-1][0] < start + j):  # (a replay notes it once)
                        self._gaps.append((start + j, behind))
                else:
                    self._decode_chunks(tokens[i:j], start + i, min(n_logits, j - i) if last else 0)
        except BaseException:
            self._trim_gaps(len(self.tokens))
            self._undo_failed(start)
            raise

    def _decode_chunks(self, tokens: list[int], start: int, n_logits: int) -> None:
        batch = self._batch
        log_tail.clear()  # so a failure quotes this decode's error, not an old one
        # The first chunk takes the remainder, so the last is full: it holds every output asked for (and, for
        # recurrent memory, every position its snapshots can roll back).
        assert n_logits <= min(self.n_outputs_max, len(tokens), self.n_batch)
        first_logit = len(tokens) - n_logits
        pos0 = self.position(start)  # (the index, but after an M-RoPE image)
        done = 0
        while done < len(tokens):
            size = self._remainder(len(tokens)) if done == 0 else self.n_batch
            chunk = tokens[done : done + size]
            n = len(chunk)
            tok, pos, nseq, seq, lg = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
            for j, t in enumerate(chunk):
                i = done + j
                tok[j] = t
                pos[j] = pos0 + i
                nseq[j] = 1
                seq[j][0] = 0
                lg[j] = 1 if i >= first_logit else 0
            batch.n_tokens = n
            rc = ll.llama_decode(self.ptr, batch)
            if rc != 0:
                self._undo_failed(start)
                if rc == 2:
                    raise Cancelled()
                raise failure(f"llama_decode failed (code {rc})", "The context may be full or memory short.")
            for capture in self.captures:
                capture.keep(start + done, n)
            done += n
            self._rollback = min(self.n_rs_seq, n - 1)
        # llama_decode may return before the backend is done (a GPU's queue, the outputs' copy to the host); the
        # first read of an output would then wait. Waiting here keeps a decode's whole cost inside this call, where
        # the draft-length controller's timers (and the loop-cost benchmark) put it.
        ll.llama_synchronize(self.ptr)
        self._n_out = min(n_logits, n)
        self._last_chunk = n

    def _undo_failed(self, start: int) -> None:
        """Processed micro-batches stay in memory: forget them so cache and bookkeeping agree."""
        if not self.recurrent:
            self._drop_from(start)
            return
        self._restore(start)  # the state moved on: back to a saved one, the rest replays later

    def logits(self, i: int) -> np.ndarray:
        """Logits (a view, valid until the next decode) of the i-th requested output of the last decode.

        ``i`` counts from the first token that asked for logits in the final chunk; -1 is the last token.
        """
        idx = self._last_chunk + i if i < 0 else self._last_chunk - self._n_out + i
        return logits_row(self.ptr, idx, self._n_vocab)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


def _runs(tokens: list[int], image_size) -> list[tuple[int, int, bool]]:
    """(start, end, is an image) of each text run and each image's positions in ``tokens``."""
    runs, i = [], 0
    while i < len(tokens):
        if tokens[i] >= 0:
            j = i
            while j < len(tokens) and tokens[j] >= 0:
                j += 1
            runs.append((i, j, False))
        else:
            j = i + image_size(tokens[i])
            if tokens[i:j] != [tokens[i]] * (j - i) or j > len(tokens):
                raise EngineError("An image's positions were cut apart in the prompt.")
            runs.append((i, j, True))
        i = j
    return runs


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix. Called every round with the whole conversation, so the lists are
    compared in C (list slices) rather than token by token in Python: the usual answer is all of the shorter one."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


