"""One llama.cpp context (sequence 0) and the tokens its cache holds: prefix reuse, rollback of rejected tails on
every kind of memory (attention, sliding-window, recurrent), decoding in chunks, logits rows."""
from __future__ import annotations

import ctypes
import threading
from typing import Iterator

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from .backend import Cancelled, failure, log_tail, logits_row
from .model import Model
from .rollback import RecurrentRollback, StateCosts


class Context:
    """One llama.cpp context (sequence 0) plus the list of tokens its cache holds, position by position.

    ``truncate(n)`` keeps ``tokens[:n]`` on every model. An attention cache drops the tail. Recurrent state cannot
    (it is one summary of everything read): ``rollback`` (``rollback.RecurrentRollback``) finds the way back, a
    snapshot or a saved state, and the tokens between that state and ``n`` are replayed by the next ``decode``, in
    the same batch as its own tokens. ``checkpoint()`` saves one at a chat turn's boundary, and
    ``decode(n_speculative=k)`` one before a batch whose last k tokens a later truncate may drop.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512, n_outputs_max: int = 64,
                 n_rs_seq: int = 0, n_checkpoints: int = 8):
        self.model = model
        params = _params(model, n_ctx, n_threads, n_batch, n_outputs_max, n_rs_seq)
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
        self.recurrent = model.recurrent
        self.rollback = RecurrentRollback(ptr, self.mem, model.path.name, int(ll.llama_n_rs_seq(ptr)), n_checkpoints)
        self._n_mem = 0  # positions llama.cpp's memory really holds; tokens[_n_mem:] are replayed by the next decode
        self.captures: list = []  # what heads read, kept by position after each decode (heads.Capture)
        self.media = None  # a vision.Projector: evaluates the images whose placeholders (negative ids) a prompt holds
        self.positions = Positions()

    @property
    def n_rs_seq(self) -> int:
        """llama.cpp's per-token snapshots of the recurrent state (0: none, or not recurrent)."""
        return self.rollback.n_rs_seq

    @property
    def state_costs(self) -> StateCosts:
        return self.rollback.costs

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
        return self.rollback.describe(self.model.recurrent_bytes)

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
        self.rollback.spec_open = False
        n_keep = max(n_keep, 0)
        if n_keep >= len(self.tokens):
            return
        n_keep = _image_start(self.tokens, n_keep, self.media)  # an image is kept whole or not at all
        del self.tokens[n_keep:]
        self.positions.trim(n_keep)
        if not self.recurrent:
            self._drop_from(n_keep)
            return
        self._n_mem = self.rollback.back_to(n_keep, self._n_mem, self.position)

    def position(self, i: int) -> int:
        """The position of ``tokens[i]`` (its index, less what M-RoPE images before it saved)."""
        return self.positions.of(i)

    def _drop_from(self, n_keep: int) -> None:
        """Attention caches: remove positions >= n_keep (all of them when llama.cpp refuses a partial removal)."""
        if n_keep <= 0 or not ll.llama_memory_seq_rm(self.mem, 0, self.position(n_keep), -1):
            ll.llama_memory_clear(self.mem, True)
            n_keep = 0
        del self.tokens[n_keep:]
        self.positions.trim(n_keep)
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
        self.rollback.checkpoint(self._n_mem)

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
            self.rollback.prepare(len(batch), n_speculative, self._n_mem)
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
                    self.positions.note(start + j, behind)
                else:
                    self._decode_chunks(tokens[i:j], start + i, min(n_logits, j - i) if last else 0)
        except BaseException:
            self.positions.trim(len(self.tokens))
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
            self.rollback.snapshots = min(self.n_rs_seq, n - 1)
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
        self._n_mem = self.rollback.restore(start, self.position)  # back to a saved state; the rest replays later

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


class Positions:
    """Where each token of a cache sits. An M-RoPE model's image takes fewer positions than cache cells, so after it
    a token's position is less than its index: ``gaps`` holds where each such image ends in the tokens, and how far
    positions run behind indices from there."""

    def __init__(self):
        self.gaps: list[tuple[int, int]] = []

    def of(self, i: int) -> int:
        for end, behind in reversed(self.gaps):
            if end <= i:
                return i - behind
        return i

    def note(self, end: int, behind: int) -> None:
        if behind and (not self.gaps or self.gaps[-1][0] < end):  # (a replay notes it once)
            self.gaps.append((end, behind))

    def trim(self, n: int) -> None:
        """Forget the images past ``n`` tokens."""
        while self.gaps and self.gaps[-1][0] > n:
            self.gaps.pop()


def _image_start(tokens: list[int], n: int, media) -> int:
    """``n``, or where the image that position ``n`` falls inside starts (``media``: the projector, or None)."""
    key = tokens[n]
    if n == 0 or key >= 0 or tokens[n - 1] != key:
        return n
    start = n
    while start > 0 and tokens[start - 1] == key:
        start -= 1
    size = media.n_tokens(key) if media else n - start  # (the same image twice in a row: two runs)
    return start + (n - start) // size * size


def _params(model: Model, n_ctx: int, n_threads: int, n_batch: int, n_outputs_max: int, n_rs_seq: int):
    """llama.cpp's context parameters, as SpecChat needs them: one sequence, batch-invariant attention, the whole
    sliding window, and recurrent snapshots where they can be kept."""
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
    return params


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


