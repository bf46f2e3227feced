"""llama.cpp itself: the backend's one-time set-up and its log, the devices and build features, the staging API's
C++ names, and the few calls that stand alone (quantize, the built-in chat templates, a logits row).

The package ``app.engine.llama`` is the only place that imports ``llama_cpp``: this module, ``model`` (weights and
vocabulary), ``context`` (one KV cache and its rollback) and ``heads`` (the small contexts heads draft in).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections import deque
from pathlib import Path

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from ..fit import Gpu
from ..gguf_file import check_gguf_file

_init_lock = threading.Lock()
_initialised = False
log_tail: deque[str] = deque(maxlen=40)  # recent llama.cpp warnings/errors, quoted in our error messages
_echo = False  # also write each of them to stderr (``echo_log``)


@ll.llama_log_callback
def log_callback(level: int, text: bytes, _user_data) -> None:
    # GGML_LOG_LEVEL_WARN = 3, ERROR = 4. Everything else is noise for a chat app.
    if level in (3, 4) and text:
        line = text.decode("utf-8", "replace").strip()
        if line:
            log_tail.append(line)
            if _echo:
                os.write(2, f"llama.cpp: {line}\n".encode("utf-8", "replace"))


def echo_log() -> None:
    """Write llama.cpp's warnings and errors to stderr as they come, unbuffered (the engine worker's stderr is its
    log file: what llama.cpp said before a crash is read there)."""
    global _echo
    _echo = True


# ggml's CPU backend serves K-quant and IQ matmuls (Q4_K_M files and the like) of 8+ tokens with tiled kernels that
# round differently from the one-token dot products, so a verification batch could flip a near-tie that plain
# decoding resolves the other way. ggml reads this once, at the first matmul; a user who sets it keeps the choice
# (and ``batch_invariant`` says so).
TILED_MM = "GGML_CPU_TILED_MM"
os.environ.setdefault(TILED_MM, "0")


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging into ``log_tail`` (quiet by default)."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        if not os.environ.get("SPECCHAT_LLAMA_LOG"):
            ll.llama_log_set(log_callback, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _initialised = True


def last_llama_error() -> str:
    """The first llama.cpp error line since the log was last cleared: the root cause, in its own words."""
    for line in log_tail:
        if "error" in line.lower():
            return line
    return log_tail[-1] if log_tail else ""


def failure(what: str, hint: str) -> EngineError:
    """An error quoting llama.cpp's own explanation (logged since the last ``log_tail.clear()``)."""
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


def batch_invariant(gpu_layers: int = 0) -> bool:
    """Whether a token's logits come out bit-identical whether it is decoded alone or in a verification batch.

    Three CPU paths serve a batch with kernels that round differently from the one-token dot products, so a
    near-tie can flip greedy output: llamafile's tinyBLAS (SpecChat's install builds llama.cpp with
    GGML_LLAMAFILE=OFF), weights repacked for batched kernels (``Model`` loads with ``use_extra_bufts`` off) and
    ggml's tiled K-quant matmul (``TILED_MM``, off unless the user turned it on). A GPU picks its kernels by batch
    size too: with the target's layers offloaded (``gpu_layers`` != 0) a batch rounds differently (measured on an
    H100 with the pinned build, 2026-11-27: logits apart by up to 0.04 on F32 weights and 0.6 on Q4_K_M, the top
    token moved in about one row of 8-32; docs/benchmarks.md), as it does in llama.cpp's own speculation."""
    if gpu_layers and supports_gpu_offload():
        return False
    return "LLAMAFILE = 1" not in system_info() and os.environ.get(TILED_MM, "0").strip() in ("0", "")


def inexact_note(gpu_layers: int = 0) -> str:
    """Why greedy output with speculation can part from plain decoding here, and what keeps it bit-identical ('' where
    it is: ``batch_invariant``)."""
    if batch_invariant(gpu_layers):
        return ""
    cause, fix = (("the GPU picks other kernels for a verification batch than for one token", "-ngl 0")
                  if batch_invariant() else
                  ("batched kernels are on (a llama.cpp build with llamafile, or GGML_CPU_TILED_MM set)",
                   "reinstall as the README shows and leave GGML_CPU_TILED_MM unset"))
    return (f"{cause[0].upper()}{cause[1:]}, so greedy output can differ from plain decoding at rare near-ties (as "
            f"llama.cpp's own speculation does). For bit-identical output: {fix}.")


def default_threads() -> int:
    """Physical cores: llama.cpp decoding is memory-bound and hyper-threads only add contention."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil may not know on exotic platforms
        n = None
    return max(1, n or os.cpu_count() or 1)


class FloatRow:
    """A float32 row at a C address, for numpy to view (np.ctypeslib.as_array costs ~30 µs a call; this ~2)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, addr: int, n: int):
        self.__array_interface__ = {"data": (addr, False), "shape": (n,), "typestr": "<f4", "version": 3}


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
            ext(name)
        except AttributeError:
            missing.append(name)
    return missing


@functools.cache
def ext(name: str):
    from llama_cpp.llama_cpp_ext import _ctypes_function_from_names

    gnu, msvc, argtypes, restype = _EXT[name]
    names = (name, f"_Z{len(name)}{name}{gnu}", f"?{name}@@{msvc}")
    return _ctypes_function_from_names(names, argtypes, restype)(lambda *a: None)


class Cancelled(Exception):
    """A decode was interrupted by the cancel event; the cache was rolled back."""


def in_sequence(b, j: int, logits: bool) -> None:
    """Row ``j`` of a batch belongs to sequence 0 alone; ``logits``: its outputs can be read."""
    b.n_seq_id[j] = 1
    b.seq_id[j][0] = 0
    b.logits[j] = int(logits)


def logits_row(ctx_ptr, idx: int, n_vocab: int) -> np.ndarray:
    """A context's logits for batch row ``idx`` of its last decode: a view, valid until the next decode."""
    addr = ctypes.cast(ll.llama_get_logits_ith(ctx_ptr, idx), ctypes.c_void_p).value
    if not addr:
        raise EngineError(f"llama.cpp returned no logits for batch row {idx}")
    return np.asarray(FloatRow(addr, n_vocab))


def quantize(src: Path, dst: Path, ftype: str = "F32", threads: int = 0) -> None:
    """Convert a GGUF file with llama.cpp's own quantizer (``allow_requantize`` lets it go from Q4_1 to F32)."""
    init_backend()
    check_gguf_file(src)
    params = ll.llama_model_quantize_default_params()
    params.nthread = threads or default_threads()
    name = "LLAMA_FTYPE_ALL_F32" if ftype == "F32" else f"LLAMA_FTYPE_MOSTLY_{ftype}"
    params.ftype = getattr(ll, name)
    params.allow_requantize = True
    log_tail.clear()
    rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise failure(f"llama.cpp could not convert {src.name} to {ftype}", "Check free disk space.")


def builtin_chat(template: str, messages: list[dict], add_generation_prompt: bool = True) -> str | None:
    """llama.cpp's own renderer for the template families it knows (matched from the template's text), the
    generation prompt opened (unless told not to); None where it does not recognise the template."""
    keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
    chat = (ll.llama_chat_message * len(keep))(*[ll.llama_chat_message(r, c) for r, c in keep])
    tmpl = template.encode("utf-8")
    size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, chat, len(keep), add_generation_prompt, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    return None


@functools.cache
def builtin_template_names() -> frozenset[str]:
    """The names of llama.cpp's own chat formats (``llama3``, ``chatml``, ``command-r``...), which ``builtin_chat``
    takes in place of a template's text, as llama-server's ``--chat-template NAME`` does."""
    n = ll.llama_chat_builtin_templates((ctypes.c_char_p * 0)(), 0)
    names = (ctypes.c_char_p * n)()
    ll.llama_chat_builtin_templates(names, n)
    return frozenset(name.decode() for name in names)
