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
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import llama_cpp.llama_cpp as ll

from .errors import EngineError
from .gguf_file import check_gguf_file
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
    """Whether a token's logits come out bit-identical whether it is decoded alone or in a verification batch.

    llamafile's tinyBLAS kernels (on by default in llama.cpp builds) serve batches of 2+ tokens while single
    tokens take ggml's dot products; the sums round differently, so a near-tie can flip greedy output. SpecChat's
    install builds llama.cpp with GGML_LLAMAFILE=OFF, which makes speculative greedy output identical to plain.
    """
    return "LLAMAFILE = 1" not in system_info()


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


class Model:
    """A loaded GGUF model: weights plus vocabulary."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, vocab_only: bool = False):
        init_backend()
        self.path = Path(path)
        check_gguf_file(self.path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers) if n_gpu_layers >= 0 else 1_000_000
        params.vocab_only = bool(vocab_only)
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
        self.can_drop_tail = not (ll.llama_model_is_recurrent(ptr) or ll.llama_model_is_hybrid(ptr))
        self.size_bytes = int(ll.llama_model_size(ptr))
        self.n_layer = 0 if vocab_only else int(ll.llama_model_n_layer(ptr))
        self.kv_bytes_per_token = 0 if vocab_only else self._kv_bytes_per_token()
        self._piece_cache: dict[int, bytes] = {}

    def _kv_bytes_per_token(self) -> int:
        """K and V bytes one cached token takes (F16 cache): layers x 2 x head_dim x kv_heads x 2 bytes.
        (Not for vocab-only models: llama.cpp aborts when asked for the heads of a model without layers.)"""
        n_layer = int(ll.llama_model_n_layer(self.ptr))
        head_dim = int(ll.llama_model_n_embd(self.ptr)) // max(int(ll.llama_model_n_head(self.ptr)), 1)
        return n_layer * 2 * head_dim * int(ll.llama_model_n_head_kv(self.ptr)) * 2

    # --- metadata -------------------------------------------------------------------------------------------
    def chat_template(self) -> str | None:
        raw = ll.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry's raw text (as llama.cpp's compatibility check compares it)."""
        return ll.llama_vocab_get_text(self.vocab, token) or b""

    # --- tokens ---------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
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


class Context:
    """One llama.cpp context (sequence 0) plus the list of tokens its KV cache holds, position by position."""

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512, n_outputs_max: int = 64):
        self.model = model
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(n_batch, n_ctx)
        params.n_ubatch = min(n_batch, n_ctx)
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.n_outputs_max = n_outputs_max
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
        self.tokens: list[int] = []  # what the KV cache holds at positions 0..len-1
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._n_vocab = model.n_vocab
        self._cancel: threading.Event | None = None
        self._abort_cb = ll.ggml_abort_callback(self._should_abort)

    def memory_pos_max(self) -> int:
        """Highest position llama.cpp's memory holds for sequence 0 (-1 when empty); equals len(tokens) - 1."""
        return int(ll.llama_memory_seq_pos_max(self.mem, 0))

    def _should_abort(self, _data) -> bool:
        return bool(self._cancel is not None and self._cancel.is_set())

    def set_cancel(self, event: threading.Event | None) -> None:
        """Let a cancel event interrupt a long ``llama_decode`` (prompt processing) between micro-batches."""
        self._cancel = event

    # --- cache bookkeeping ----------------------------------------------------------------------------------
    def truncate(self, n_keep: int) -> None:
        """Drop every cached position >= n_keep (rejected draft tokens, an edited chat turn)."""
        if n_keep < len(self.tokens):
            self._drop_from(n_keep)

    def _drop_from(self, n_keep: int) -> None:
        if n_keep <= 0 or not ll.llama_memory_seq_rm(self.mem, 0, n_keep, -1):
            # Recurrent/hybrid memory cannot drop a tail; start over rather than corrupt the state.
            ll.llama_memory_clear(self.mem, True)
            n_keep = 0
        del self.tokens[n_keep:]

    def reuse_prefix(self, history: list[int]) -> int:
        """Keep the longest cached prefix of ``history`` and return its length (the next position to fill)."""
        cached = self.tokens
        n = min(len(cached), len(history))
        i = 0
        while i < n and cached[i] == history[i]:
            i += 1
        self.truncate(i)
        return len(self.tokens)

    # --- evaluation -----------------------------------------------------------------------------------------
    def decode(self, tokens: list[int], n_logits: int = 1) -> None:
        """Append ``tokens`` to the cache; keep logits for the last ``n_logits`` of them (read with ``logits``).

        Splits long inputs into n_batch chunks. On failure or cancellation the cache is rolled back to what it
        held before, so the token bookkeeping never disagrees with llama.cpp's memory.
        """
        if not tokens:
            return
        start = len(self.tokens)
        if start + len(tokens) > self.n_ctx:
            raise EngineError(
                f"Context full: {start + len(tokens)} tokens needed but the context holds {self.n_ctx}. "
                "Use a larger context (--ctx) or a shorter prompt/conversation."
            )
        first_logit = len(tokens) - n_logits
        # Outputs are read from the final chunk only (verification batches are a single chunk).
        assert n_logits <= min(self.n_outputs_max, (len(tokens) - 1) % self.n_batch + 1)
        # ggml polls the abort callback at every graph node: a Python call each time, too slow for per-token
        # decodes, so only long (prompt) decodes are made interruptible.
        abortable = self._cancel is not None and len(tokens) > 64
        if abortable:
            ll.llama_set_abort_callback(self.ptr, self._abort_cb, ctypes.c_void_p(0))
        try:
            self._decode_chunks(tokens, start, first_logit)
        finally:
            if abortable:
                ll.llama_set_abort_callback(self.ptr, ll.ggml_abort_callback(), ctypes.c_void_p(0))
        self.tokens.extend(tokens)
        n = (len(tokens) - 1) % self.n_batch + 1
        self._n_out = min(n_logits, n)
        self._last_chunk = n

    def _decode_chunks(self, tokens: list[int], start: int, first_logit: int) -> None:
        batch = self._batch
        _log_tail.clear()  # so a failure quotes this decode's error, not an old one
        done = 0
        while done < len(tokens):
            chunk = tokens[done : done + self.n_batch]
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
                # Processed micro-batches stay in memory: forget them so cache and bookkeeping agree.
                self._drop_from(start)
                if rc == 2:
                    raise Cancelled()
                raise _failure(f"llama_decode failed (code {rc})", "The context may be full or memory short.")
            done += n

    def logits(self, i: int) -> np.ndarray:
        """Logits (a view, valid until the next decode) of the i-th requested output of the last decode.

        ``i`` counts from the first token that asked for logits in the final chunk; -1 is the last token.
        """
        if i < 0:
            idx = self._last_chunk + i
        else:
            idx = self._last_chunk - self._n_out + i
        ptr = ll.llama_get_logits_ith(self.ptr, idx)
        if not ptr:
            raise EngineError(f"llama.cpp returned no logits for output {i}")
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

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


class Cancelled(Exception):
    """A decode was interrupted by the cancel event; the cache was rolled back."""


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
