"""The small contexts heads draft in (MTP layers, EAGLE-3, Gemma 4's assistant), and what they read of the target
(block drafts read the same layer inputs; their context is ``block``).

A head drafts from the target's own state: the target keeps, by position, what the head reads of each token it
evaluates (a ``Capture``: the hidden state MTP layers read, or an EAGLE-3 head's layer inputs), and the head's
``HeadContext`` decodes rows that carry a token and a state, in a context that shares the target's model or cache.
"""
from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from .backend import FloatRow, ext, failure, in_sequence, logits_row
from .context import Context
from .model import Model

LAYER_INPUT_FUNCTIONS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp")


def nextn_call(name: str):
    """One of llama-cpp-python's bindings of the MTP staging calls (C++ names, found when first imported)."""
    from llama_cpp import llama_cpp_ext

    return getattr(llama_cpp_ext, name)


class Capture:
    """Rows the target keeps by position after each decode, for a head to read (and prune) every round. Without a
    head drafting (speculation off, another drafter) the oldest go, and a later catch-up leaves those out."""

    MAX_BYTES = 64 << 20  # kept at most

    def __init__(self, target: Context):
        self.target = target
        self.rows: dict[int, np.ndarray] = {}
        target.captures.append(self)

    def keep(self, start: int, n: int) -> None:
        rows = self.read(n)
        for j in range(n):
            self.rows.pop(start + j, None)  # (a position decoded again goes to the end of the order)
            self.rows[start + j] = rows[j]
        cap = max(self.MAX_BYTES // (4 * rows.shape[1]), self.target.n_batch)
        while len(self.rows) > cap:
            del self.rows[next(iter(self.rows))]

    def skip(self, start: int, n: int) -> None:
        """Positions ``start``... were decoded with no rows left to read (an image's first batches, which libmtmd
        decodes on its own): a head drafts without them."""

    def read(self, n: int) -> np.ndarray:
        """The last decode's rows, copied out of llama.cpp's buffer."""
        raise NotImplementedError


class HiddenStates(Capture):
    """The hidden state every decoded token leaves for a model's MTP layers (Gemma 4's assistant reads it too).
    Qwen3.5's graph computes the same logits either way (tested); llama.cpp's GLM-4.5 and DeepSeek graphs change
    their last layer with it (not yet checked)."""

    def __init__(self, target: Context):
        super().__init__(target)
        nextn_call("llama_set_embeddings_nextn")(target.ptr, True, False)

    def read(self, n: int) -> np.ndarray:
        addr = ctypes.cast(nextn_call("llama_get_embeddings_nextn")(self.target.ptr), ctypes.c_void_p).value
        if not addr:
            raise EngineError("llama.cpp kept no hidden states for the MTP layers after a decode.")
        d = self.target.model.n_embd
        return np.asarray(FloatRow(addr, n * d)).reshape(n, d).copy()


class LayerInputs(Capture):
    """The inputs of some layers side by side (an EAGLE-3 head's or a block draft's features). The graph only marks
    tensors it computes anyway as outputs: the logits are the same (tested). Only some architectures' graphs expose
    layer inputs; llama.cpp aborts the process on the next decode of any other, so the caller checks the architecture
    first."""

    def __init__(self, target: Context, layers: tuple[int, ...]):
        super().__init__(target)
        self.layers = tuple(layers)
        for lid in self.layers:
            ext("llama_set_embeddings_layer_inp")(target.ptr, lid, True)

    def read(self, n: int) -> np.ndarray:
        get = ext("llama_get_embeddings_layer_inp")
        d = self.target.model.n_embd
        rows = np.empty((n, d * len(self.layers)), dtype=np.float32)
        for k, lid in enumerate(self.layers):
            addr = ctypes.cast(get(self.target.ptr, lid), ctypes.c_void_p).value
            if not addr:
                raise EngineError(f"llama.cpp kept no inputs of layer {lid} after a decode.")
            rows[:, k * d : (k + 1) * d] = np.asarray(FloatRow(addr, n * d)).reshape(n, d)
        return rows


def captured(target: Context, kind: type[Capture], *args) -> Capture:
    """The target's capture of this kind, made the first time a head asks (one serves every head that reads it)."""
    for c in target.captures:
        if type(c) is kind:
            return c
    return kind(target, *args)


class OwnCache:
    """A drafting context's own cache, one sequence (``ptr``: the context, ``mem``: its memory)."""

    ptr: object
    mem: object

    def _open(self, target: Context, model: Model, n_batch: int, n_outputs: int, label: str,
              ctx_type: int = ll.LLAMA_CONTEXT_TYPE_DEFAULT) -> None:
        """Create the context on the target's (``ctx_other``), holding its conversation position by position, with
        its threads and attention kernel (a shared cache's layout), one sequence and ``n_outputs`` output rows."""
        params = ll.llama_context_default_params()
        params.ctx_type = ctx_type
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_outputs_max = n_outputs
        params.n_threads = params.n_threads_batch = target.n_threads
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # (as the target's: a shared cache's layout)
        params.no_perf = True
        params.ctx_other = target.ptr
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise failure(f"llama.cpp could not create a {label} context for {model.path.name}",
                          "Try a smaller context (--ctx).")
        self.ptr = ptr
        self.mem = ll.llama_get_memory(ptr)

    def set_threads(self, n: int) -> None:
        ll.llama_set_n_threads(self.ptr, n, n)

    def drop_from(self, pos: int) -> None:
        """Forget the positions from ``pos`` on."""
        ll.llama_memory_seq_rm(self.mem, 0, max(pos, 0), -1)

    def clear(self) -> None:
        ll.llama_memory_clear(self.mem, True)

    def next_pos(self) -> int:
        """The position after the last the cache holds."""
        return int(ll.llama_memory_seq_pos_max(self.mem, 0)) + 1


class HeadContext(OwnCache):
    """A head's context on the target's (``ctx_other``): rows that carry a token and an ``n_embd``-wide state, one
    output row per step (its logits, over the target's vocabulary, and the head's own hidden state)."""

    def __init__(self, target: Context, model: Model, n_embd: int, n_batch: int, mtp_type: bool, label: str):
        self.target, self.model, self.n_embd, self.n_batch, self.label = target, model, n_embd, n_batch, label
        self._open(target, model, n_batch, 1, label,  # one draft row per step
                   ll.LLAMA_CONTEXT_TYPE_MTP if mtp_type else ll.LLAMA_CONTEXT_TYPE_DEFAULT)
        nextn_call("llama_set_embeddings_nextn")(self.ptr, True, True)  # the head's own hidden state, for the next step
        self._batch = ll.llama_batch_init(n_batch, n_embd, 1)  # rows carry a hidden state...
        self._tokens = (ll.llama_token * n_batch)()  # ...and a token (llama.cpp reads both)
        self._batch.token = ctypes.cast(self._tokens, ctypes.POINTER(ll.llama_token))
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(n_batch * n_embd,)).reshape(-1, n_embd)
        self._enc = None  # an encoder's feature batch (EAGLE-3), made on first use
        self._last = 0

    def decode(self, rows: list[tuple[int, int, np.ndarray]], output_last: bool) -> None:
        """Decode rows (position, token, state); with ``output_last`` the last row's outputs can be read."""
        b = self._batch
        for j, (pos, tok, h) in enumerate(rows):
            self._tokens[j] = tok
            self._embd[j] = h
            b.pos[j] = pos
            in_sequence(b, j, logits=output_last and j == len(rows) - 1)
        b.n_tokens = len(rows)
        rc = ll.llama_decode(self.ptr, b)
        if rc != 0:
            raise failure(f"llama_decode failed in the {self.label} drafter's context (code {rc})",
                          "The context may be full.")
        ll.llama_synchronize(self.ptr)
        self._last = len(rows) - 1

    def logits(self) -> np.ndarray:
        return logits_row(self.ptr, self._last, self.model.n_vocab)

    def own_hidden(self) -> np.ndarray:
        addr = ctypes.cast(nextn_call("llama_get_embeddings_nextn_ith")(self.ptr, self._last), ctypes.c_void_p).value
        return np.asarray(FloatRow(addr, self.n_embd)).copy()

    def encode(self, features: list[np.ndarray], n_feat: int) -> list[np.ndarray]:
        """The head's encoder over ``features`` (``n_feat`` wide), a batch at a time: one state per row. The encoder
        writes no cache, but llama.cpp checks its positions as for a decode: they follow the head's cache."""
        if self._enc is None:
            self._enc = ll.llama_batch_init(self.n_batch, n_feat, 1)  # feature rows, no tokens
            self._feat = np.ctypeslib.as_array(self._enc.embd, shape=(self.n_batch * n_feat,)).reshape(-1, n_feat)
        out, b = [], self._enc
        pos0 = self.next_pos()
        for i in range(0, len(features), self.n_batch):
            chunk = features[i : i + self.n_batch]
            for j, x in enumerate(chunk):
                self._feat[j] = x
                b.pos[j] = pos0 + j
                in_sequence(b, j, logits=True)
            b.n_tokens = len(chunk)
            rc = ll.llama_encode(self.ptr, b)
            if rc != 0:
                raise failure(f"llama_encode failed in the {self.label} head (code {rc})", "Check the head's file.")
            addr = ctypes.cast(nextn_call("llama_get_embeddings_nextn")(self.ptr), ctypes.c_void_p).value
            out += list(np.array(FloatRow(addr, len(chunk) * self.n_embd)).reshape(len(chunk), self.n_embd))
        return out

    def close(self) -> None:
        if self.ptr:
            if self._enc is not None:
                ll.llama_batch_free(self._enc)
            self._batch.token = ctypes.POINTER(ll.llama_token)()  # ours, not llama_batch_init's
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ptr)
            self.ptr = None
