"""Thin, typed wrappers over llama-cpp-python's low-level ctypes API.

This is the only module that imports ``llama_cpp``. It exposes a loaded ``Model`` (weights + vocabulary) and a
``Context`` (one KV cache, sequence 0) that remembers which tokens its cache holds, so callers can reuse the
longest common prefix and drop rejected tails without ever asking llama.cpp for an ``n_ctx x n_vocab`` buffer.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import llama_cpp.llama_cpp as ll

from .errors import EngineError
from .gguf_file import check_gguf_file, read_info
from .memory import Gpu

_init_lock = threading.Lock()
_initialised = False
_log_tail: deque[str] = deque(maxlen=40)  # recent llama.cpp warnings/errors, quoted in our error messages


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data) -> None:
    # GGML_LOG_LEVEL_WARN = 3, ERROR = 4. Everything else is noise for a chat app.
    if level in (3, 4) and text:
        line = text.decode("utf-8", "replace").strip()
        if line:
            _log_tail.append(line)


# ggml's CPU backend serves K-quant and IQ matmuls (Q4_K_M files and the like) of 8+ tokens with tiled kernels that
# round differently from the one-token dot products, so a verification batch could flip a near-tie that plain
# decoding resolves the other way. ggml reads this once, at the first matmul; a user who sets it keeps the choice
# (and ``batch_invariant`` says so).
TILED_MM = "GGML_CPU_TILED_MM"
os.environ.setdefault(TILED_MM, "0")


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging into ``_log_tail`` (quiet by default)."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        if not os.environ.get("SPECCHAT_LLAMA_LOG"):
            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _initialised = True


def last_llama_error() -> str:
    """The first llama.cpp error line since the log was last cleared: the root cause, in its own words."""
    for line in _log_tail:
        if "error" in line.lower():
            return line
    return _log_tail[-1] if _log_tail else ""


def _failure(what: str, hint: str) -> EngineError:
    """An error quoting llama.cpp's own explanation (logged since the last ``_log_tail.clear()``)."""
    detail = last_llama_error()
    return EngineError(what + (f": {detail}" if detail else "") + ". " + hint)


def supports_gpu_offload() -> bool:
    init_backend()
    return bool(ll.llama_supports_gpu_offload())


def gpus() -> list[Gpu]:
    """The GPUs this llama.cpp build can offload to, with their free and total memory (empty on a CPU build)."""
    if not supports_gpu_offload():
        return []
    return [Gpu(name, free, total) for name, kind, free, total in devices() if kind in (_DEV_GPU, _DEV_IGPU)]


_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type


def devices() -> list[tuple[str, int, int, int]]:
    """(description, type, free bytes, total bytes) of every ggml backend device, the CPU among them."""
    init_backend()
    g = _ggml()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        desc = g.ggml_backend_dev_description(dev) or g.ggml_backend_dev_name(dev) or b"?"
        out.append((desc.decode("utf-8", "replace"), int(g.ggml_backend_dev_type(dev)), free.value, total.value))
    return out


@functools.cache
def _ggml() -> ctypes.CDLL:
    """ggml's device registry, which llama-cpp-python does not bind: the library sits beside libllama."""
    from llama_cpp._ctypes_extensions import load_shared_library

    lib = load_shared_library("ggml", Path(getattr(ll, "_base_path", Path(ll.__file__).parent / "lib")))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes, lib.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    for name, res in (("ggml_backend_dev_description", ctypes.c_char_p), ("ggml_backend_dev_name", ctypes.c_char_p),
                      ("ggml_backend_dev_type", ctypes.c_int), ("ggml_backend_dev_memory", None)):
        fn = getattr(lib, name)
        fn.restype = res
    lib.ggml_backend_dev_description.argtypes = lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    return lib


@functools.cache
def system_info() -> str:
    """llama.cpp's build features (fixed for the process, so read once)."""
    init_backend()
    return ll.llama_print_system_info().decode("utf-8", "replace")


def batch_invariant() -> bool:
    """Whether a token's logits come out bit-identical whether it is decoded alone or in a verification batch (on
    the CPU; GPU backends pick kernels by batch size too, which this cannot see).

    Three CPU paths serve a batch with kernels that round differently from the one-token dot products, so a
    near-tie can flip greedy output: llamafile's tinyBLAS (SpecChat's install builds llama.cpp with
    GGML_LLAMAFILE=OFF), weights repacked for batched kernels (``Model`` loads with ``use_extra_bufts`` off) and
    ggml's tiled K-quant matmul (``TILED_MM``, off unless the user turned it on)."""
    return "LLAMAFILE = 1" not in system_info() and os.environ.get(TILED_MM, "0").strip() in ("0", "")


def default_threads() -> int:
    """Physical cores: llama.cpp decoding is memory-bound and hyper-threads only add contention."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil may not know on exotic platforms
        n = None
    return max(1, n or os.cpu_count() or 1)


@dataclass(frozen=True)
class ModelSettings:
    """How to load one GGUF model and size its context (llama.cpp's -c, -t, -ngl)."""

    path: Path
    n_ctx: int = 0  # 0: min(training context, 4096)
    n_threads: int = 0  # 0: physical cores
    n_gpu_layers: int = 0  # -1: all layers
    n_batch: int = 512
    # Recurrent/hybrid models only. n_rs_seq: llama.cpp's per-token snapshots of the recurrent state, the deepest
    # draft rejection rolled back for free (deeper ones restore a saved state); costs n_rs_seq copies of the state.
    # n_checkpoints: saved states kept between chat turns (llama-server's --ctx-checkpoints).
    n_rs_seq: int = 16
    n_checkpoints: int = 8


class Model:
    """A loaded GGUF model: weights plus vocabulary."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, vocab_only: bool = False):
        init_backend()
        self.path = Path(path)
        check_gguf_file(self.path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers) if n_gpu_layers >= 0 else 1_000_000
        params.vocab_only = bool(vocab_only)
        params.use_extra_bufts = False  # repacked weights: one token and a batch take kernels that round apart
        params.load_mtp = True  # a model's own next-token-prediction layers, where it has them (--drafter mtp)
        _log_tail.clear()
        ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            raise _failure(
                f"llama.cpp could not load {self.path.name}",
                "The file may be corrupt, or use an architecture this llama.cpp build does not support.",
            )
        self.ptr = ptr
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(ll.llama_model_n_ctx_train(ptr))
        self.bos = int(ll.llama_vocab_bos(self.vocab))
        self.eos = int(ll.llama_vocab_eos(self.vocab))
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.add_eos = bool(ll.llama_vocab_get_add_eos(self.vocab))
        self.vocab_type = int(ll.llama_vocab_type(self.vocab))
        # Recurrent state (Mamba, RWKV; the linear layers of Qwen3.5, LFM2, Nemotron-H, Granite 4 hybrids) cannot
        # simply drop a tail of positions: Context rolls it back through snapshots or saved states instead.
        self.recurrent = bool(ll.llama_model_is_recurrent(ptr) or ll.llama_model_is_hybrid(ptr))
        self.size_bytes = int(ll.llama_model_size(ptr))
        self.n_layer = 0 if vocab_only else int(ll.llama_model_n_layer(ptr))
        self.n_nextn = 0 if vocab_only else int(ll.llama_model_n_layer_nextn(ptr))  # MTP layers
        self.n_embd = 0 if vocab_only else int(ll.llama_model_n_embd(ptr))
        info = read_info(self.path)  # its header was read (and is cached) by the check above
        self.arch = info.architecture
        self.kv_bytes_per_token = info.kv_bytes_per_token  # F16 K and V of the attention layers
        self.recurrent_bytes = info.recurrent_bytes  # one copy of the recurrent state (a snapshot, a checkpoint)
        self._piece_cache: dict[int, bytes] = {}
        self._text_cache: dict[int, bytes] = {}

    # --- metadata -------------------------------------------------------------------------------------------
    def chat_template(self) -> str | None:
        raw = ll.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry's raw text (as llama.cpp's compatibility check compares it)."""
        return ll.llama_vocab_get_text(self.vocab, token) or b""

    # --- tokens ---------------------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token contributes to the output (special tokens rendered as empty)."""
        cached = self._piece_cache.get(token)
        if cached is None:
            cached = self._piece_cache[token] = self._to_piece(token, special=False)
        return cached

    def piece_text(self, token: int) -> bytes:
        """The bytes a token stands for in text, special tokens written out (``<|im_start|>``): what another
        tokenizer must see to read the same conversation."""
        cached = self._text_cache.get(token)
        if cached is None:
            cached = self._text_cache[token] = self._to_piece(token, special=True)
        return cached

    def piece_special(self, token: int) -> str:
        """A special token's text, e.g. ``<|im_end|>`` (for chat templates)."""
        return self._to_piece(token, special=True).decode("utf-8", "replace")

    def _to_piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def special_token(self, text: str) -> int | None:
        """The id of the one token ``text`` is, where it is a special token (a control token, or a user-defined one
        written like ``<tool_call>``: what llguidance reads as a token, not as text); else None."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        if len(ids) != 1:
            return None
        attr = int(ll.llama_vocab_get_attr(self.vocab, ids[0]))
        user = attr & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and text.startswith("<") and text.endswith(">")
        return ids[0] if attr & ll.LLAMA_TOKEN_ATTR_CONTROL or user else None

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (end of text, end of turn...)."""
        return tuple(t for t in range(self.n_vocab) if self.is_eog(t)) or (self.eos,)

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            ll.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


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


class _FloatRow:
    """A float32 row at a C address, for numpy to view (np.ctypeslib.as_array costs ~30 µs a call; this ~2)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, addr: int, n: int):
        self.__array_interface__ = {"data": (addr, False), "shape": (n,), "typestr": "<f4", "version": 3}


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
        _log_tail.clear()
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise _failure(
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
        self.hidden: dict[int, np.ndarray] | None = None  # position -> the hidden state MTP layers read (keep_hidden)
        self.layer_inputs: dict[int, np.ndarray] | None = None  # position -> an EAGLE-3 head's features
        self._layers: tuple[int, ...] = ()

    HIDDEN_BYTES = 64 << 20  # hidden states kept for an MTP drafter, at most

    def keep_hidden(self) -> None:
        """From now on keep, by position, the hidden state every decoded token leaves for a model's MTP layers
        (an MTP drafter reads and prunes them). Qwen3.5's graph computes the same logits either way (tested);
        llama.cpp's GLM-4.5 and DeepSeek graphs change their last layer with it (not yet checked)."""
        if self.hidden is None:
            from llama_cpp.llama_cpp_ext import llama_set_embeddings_nextn  # (C++ names, found on import)

            llama_set_embeddings_nextn(self.ptr, True, False)
            self.hidden = {}

    def keep_layer_inputs(self, layers: tuple[int, ...]) -> None:
        """From now on keep, by position, the inputs of ``layers`` side by side (an EAGLE-3 head's features; its
        drafter reads and prunes them). The graph only marks tensors it computes anyway as outputs: the logits are
        the same (tested). Only some architectures' graphs expose layer inputs; llama.cpp aborts the process on the
        next decode of any other, so the caller checks the architecture first."""
        if self.layer_inputs is None:
            for lid in layers:
                _ext("llama_set_embeddings_layer_inp")(self.ptr, lid, True)
            self._layers = tuple(layers)
            self.layer_inputs = {}

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
        """Highest position llama.cpp's memory holds for sequence 0 (-1 when empty); equals n_held - 1."""
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
        del self.tokens[n_keep:]
        if not self.recurrent:
            self._drop_from(n_keep)
            return
        self._turns = [s for s in self._turns if s.n <= n_keep]  # the others saved tokens that are gone
        if self._round and self._round.n > n_keep:
            self._round = None
        if n_keep >= self._n_mem:  # only tokens awaiting replay were dropped
            return
        if self._n_mem - n_keep <= self._rollback and ll.llama_memory_seq_rm(self.mem, 0, n_keep, -1):
            self.state_costs.rollbacks += 1
            self._n_mem, self._rollback = n_keep, 0  # a snapshot serves once
            return
        self._restore(n_keep)

    def _drop_from(self, n_keep: int) -> None:
        """Attention caches: remove positions >= n_keep (all of them when llama.cpp refuses a partial removal)."""
        if n_keep <= 0 or not ll.llama_memory_seq_rm(self.mem, 0, n_keep, -1):
            ll.llama_memory_clear(self.mem, True)
            n_keep = 0
        del self.tokens[n_keep:]
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
            and ll.llama_memory_seq_rm(self.mem, 0, saved.n, -1))
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
            self._decode_chunks(batch, self._n_mem, n_logits)
        finally:
            if abortable:
                ll.llama_set_abort_callback(self.ptr, ll.ggml_abort_callback(), ctypes.c_void_p(0))
        self.state_costs.replayed += len(batch) - len(tokens)
        self.tokens.extend(tokens)
        self._n_mem = len(self.tokens)

    def prefill(self, tokens: list[int]) -> None:
        """Evaluate a prompt's uncached tokens, logits for the last. Recurrent memory keeps a checkpoint before that
        last token: where Regenerate restarts, and the nearest way back when the next turn changes the answer."""
        if self.recurrent and len(tokens) > 1:
            self.decode(tokens[:-1], n_logits=0)
            self.checkpoint()
            tokens = tokens[-1:]
        self.decode(tokens, n_logits=1)

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

    def _decode_chunks(self, tokens: list[int], start: int, n_logits: int) -> None:
        batch = self._batch
        _log_tail.clear()  # so a failure quotes this decode's error, not an old one
        # The first chunk takes the remainder, so the last is full: it holds every output asked for (and, for
        # recurrent memory, every position its snapshots can roll back).
        assert n_logits <= min(self.n_outputs_max, len(tokens), self.n_batch)
        first_logit = len(tokens) - n_logits
        done = 0
        while done < len(tokens):
            size = (len(tokens) - 1) % self.n_batch + 1 if done == 0 else self.n_batch
            chunk = tokens[done : done + size]
            n = len(chunk)
            tok, pos, nseq, seq, lg = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
            for j, t in enumerate(chunk):
                i = done + j
                tok[j] = t
                pos[j] = start + i
                nseq[j] = 1
                seq[j][0] = 0
                lg[j] = 1 if i >= first_logit else 0
            batch.n_tokens = n
            rc = ll.llama_decode(self.ptr, batch)
            if rc != 0:
                self._undo_failed(start)
                if rc == 2:
                    raise Cancelled()
                raise _failure(f"llama_decode failed (code {rc})", "The context may be full or memory short.")
            if self.hidden is not None:
                self._keep_hidden_rows(start + done, n)
            if self.layer_inputs is not None:
                self._keep_layer_rows(start + done, n)
            done += n
            self._rollback = min(self.n_rs_seq, n - 1)
        # llama_decode may return before the backend is done (a GPU's queue, the outputs' copy to the host); the
        # first read of an output would then wait. Waiting here keeps a decode's whole cost inside this call, where
        # the draft-length controller's timers (and the loop-cost benchmark) put it.
        ll.llama_synchronize(self.ptr)
        self._n_out = min(n_logits, n)
        self._last_chunk = n

    def _keep_hidden_rows(self, start: int, n: int) -> None:
        from llama_cpp.llama_cpp_ext import llama_get_embeddings_nextn

        addr = ctypes.cast(llama_get_embeddings_nextn(self.ptr), ctypes.c_void_p).value
        if not addr:
            raise EngineError("llama.cpp kept no hidden states for the MTP layers after a decode.")
        rows = np.asarray(_FloatRow(addr, n * self.model.n_embd)).reshape(n, self.model.n_embd).copy()
        self._keep(self.hidden, start, rows)

    def _keep_layer_rows(self, start: int, n: int) -> None:
        get = _ext("llama_get_embeddings_layer_inp")
        d = self.model.n_embd
        rows = np.empty((n, d * len(self._layers)), dtype=np.float32)
        for k, lid in enumerate(self._layers):
            addr = ctypes.cast(get(self.ptr, lid), ctypes.c_void_p).value
            if not addr:
                raise EngineError(f"llama.cpp kept no inputs of layer {lid} after a decode.")
            rows[:, k * d : (k + 1) * d] = np.asarray(_FloatRow(addr, n * d)).reshape(n, d)
        self._keep(self.layer_inputs, start, rows)

    def _keep(self, store: dict[int, np.ndarray], start: int, rows: np.ndarray) -> None:
        """Keep ``rows`` by position from ``start``. A drafter consumes them every round; without one drafting
        (speculation off, another drafter) the oldest go, and a later catch-up leaves those positions out."""
        for j in range(len(rows)):
            store.pop(start + j, None)  # (a position decoded again goes to the end of the order)
            store[start + j] = rows[j]
        cap = max(self.HIDDEN_BYTES // (4 * rows.shape[1]), self.n_batch)
        while len(store) > cap:
            del store[next(iter(store))]

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


# llama.cpp's staging API (``llama-ext.h``) has C++ names, and llama-cpp-python binds only part of it: these by their
# mangled names (GCC/Clang, MSVC), with their argument and result types.
_EXT = {
    "llama_set_embeddings_layer_inp": ("P13llama_contextjb", "YAXPEAUllama_context@@I_N@Z",
                                       [ll.llama_context_p_ctypes, ctypes.c_uint32, ctypes.c_bool], None),
    "llama_get_embeddings_layer_inp": ("P13llama_contextj", "YAPEAMPEAUllama_context@@I@Z",
                                       [ll.llama_context_p_ctypes, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)),
}


def missing_ext(*names: str) -> list[str]:
    """Which of these staging-API functions this llama.cpp build does not export."""
    missing = []
    for name in names:
        try:
            _ext(name)
        except AttributeError:
            missing.append(name)
    return missing


@functools.cache
def _ext(name: str):
    from llama_cpp.llama_cpp_ext import _ctypes_function_from_names

    gnu, msvc, argtypes, restype = _EXT[name]
    names = (name, f"_Z{len(name)}{name}{gnu}", f"?{name}@@{msvc}")
    return _ctypes_function_from_names(names, argtypes, restype)(lambda *a: None)


class Cancelled(Exception):
    """A decode was interrupted by the cancel event; the cache was rolled back."""


def logits_row(ctx_ptr, idx: int, n_vocab: int) -> np.ndarray:
    """A context's logits for batch row ``idx`` of its last decode: a view, valid until the next decode."""
    addr = ctypes.cast(ll.llama_get_logits_ith(ctx_ptr, idx), ctypes.c_void_p).value
    if not addr:
        raise EngineError(f"llama.cpp returned no logits for batch row {idx}")
    return np.asarray(_FloatRow(addr, n_vocab))


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


def quantize(src: Path, dst: Path, ftype: str = "F32", threads: int = 0) -> None:
    """Convert a GGUF file with llama.cpp's own quantizer (``allow_requantize`` lets it go from Q4_1 to F32)."""
    init_backend()
    check_gguf_file(src)
    params = ll.llama_model_quantize_default_params()
    params.nthread = threads or default_threads()
    name = "LLAMA_FTYPE_ALL_F32" if ftype == "F32" else f"LLAMA_FTYPE_MOSTLY_{ftype}"
    params.ftype = getattr(ll, name)
    params.allow_requantize = True
    _log_tail.clear()
    rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise _failure(f"llama.cpp could not convert {src.name} to {ftype}", "Check free disk space.")


def builtin_chat(template: str, messages: list[dict]) -> str | None:
    """llama.cpp's own renderer for the template families it knows (matched from the template's text), the
    generation prompt opened; None where it does not recognise the template."""
    keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
    chat = (ll.llama_chat_message * len(keep))(*[ll.llama_chat_message(r, c) for r, c in keep])
    tmpl = template.encode("utf-8")
    size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, chat, len(keep), True, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    return None
