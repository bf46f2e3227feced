"""A vision projector (an ``mmproj`` GGUF) beside its target, through llama.cpp's libmtmd: a prompt's text and images
become token ids, and the target's context evaluates the images among them.

An image takes as many positions in a prompt as the projector makes embeddings for it. In the token ids each of
those positions holds the image's *placeholder*: a negative id derived from the image's SHA-256, the same for every
position of the image. So token lists stay plain ``list[int]`` everywhere (the loop, the cache's prefix reuse, the
stats' prompt count), the same image sent again in the next turn matches the cached prefix, and a different one does
not. The projector keeps the prepared image (its ``mtmd_input_chunk``) for each placeholder it handed out.
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from pathlib import Path

import llama_cpp.llama_cpp as ll

from ..errors import EngineError
from ..gguf_file import check_gguf_file
from .backend import Cancelled, failure, init_backend, log_callback, log_tail
from .model import Model

KEEP_IMAGES = 64  # prepared images kept for the prompts that name them (each holds its preprocessed pixels)


def _mtmd():
    """llama-cpp-python's libmtmd bindings (loading them loads the library)."""
    try:
        import llama_cpp.mtmd_cpp as mt
    except Exception as exc:  # (an install without libmtmd)
        raise EngineError(f"This llama-cpp-python has no libmtmd, which images need ({exc}). Install "
                          "llama-cpp-python 0.3.36 or later as the README shows.") from None
    return mt


def placeholder(image_id: bytes) -> int:
    """The negative token id every position of an image holds, from its id (libmtmd's SHA-256 of the bytes)."""
    return -1 - int(image_id[:7] or b"0", 16)


class Projector:
    """A projector loaded for ``model`` (libmtmd checks that its embeddings are the model's size)."""

    def __init__(self, path: str | Path, model: Model, n_threads: int, use_gpu: bool = False):
        init_backend()
        self.path = Path(path)
        check_gguf_file(self.path)
        mt = self._mt = _mtmd()
        mt.mtmd_helper_log_set(log_callback, ctypes.c_void_p(0))  # its warnings and errors into our log tail
        params = mt.mtmd_context_params_default()
        params.use_gpu = bool(use_gpu)
        params.n_threads = n_threads
        params.print_timings = False
        log_tail.clear()
        ptr = mt.mtmd_init_from_file(str(self.path).encode(), model.ptr, params)
        if not ptr:
            raise failure(f"llama.cpp could not load the projector {self.path.name} for {model.path.name}",
                          "Use the mmproj file made for this model (from the same repository).")
        self.ptr = ptr
        self.model = model
        if not mt.mtmd_support_vision(ptr):
            self.close()
            raise EngineError(f"{self.path.name} is not a vision projector (it takes no images).")
        self.marker = mt.mtmd_default_marker().decode()
        self.size_bytes = self.path.stat().st_size
        self._chunks: OrderedDict[int, tuple[int, int, int]] = OrderedDict()  # placeholder -> chunk, n_tokens, n_pos
        # A request is tokenized (adding images, dropping the oldest) while another generates: a chunk being
        # evaluated must not be freed under it.
        self._lock = threading.Lock()

    # --- prompts --------------------------------------------------------------------------------------------
    def tokenize(self, text: str, images: list[bytes], add_special: bool = True) -> list[int]:
        """Token ids of ``text`` with each media marker replaced by the next image's placeholder positions."""
        mt = self._mt
        if text.count(self.marker) != len(images):
            raise EngineError(f"The prompt marks {text.count(self.marker)} images but {len(images)} were given.")
        bitmaps = []
        chunks = mt.mtmd_input_chunks_init()
        try:
            for i, data in enumerate(images):
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                log_tail.clear()
                bitmap = mt.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False)
                if not bitmap:
                    raise EngineError(f"Image {i + 1} could not be decoded: the file is damaged or cut short.")
                bitmaps.append(bitmap)
            raw = text.encode("utf-8")
            inp = mt.mtmd_input_text(raw, len(raw), add_special, True)
            arr = (ctypes.c_void_p * max(1, len(bitmaps)))(*bitmaps)
            log_tail.clear()
            rc = mt.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise failure("The images could not be prepared for the model", "Try another image.")
            return self._ids(chunks)
        finally:
            for bitmap in bitmaps:
                mt.mtmd_bitmap_free(bitmap)
            mt.mtmd_input_chunks_free(chunks)

    def _ids(self, chunks) -> list[int]:
        mt = self._mt
        ids: list[int] = []
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            kind = mt.mtmd_input_chunk_get_type(chunk)
            if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                toks = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(toks[: n.value])
            elif kind == mt.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                n_tokens = int(mt.mtmd_input_chunk_get_n_tokens(chunk))
                key = placeholder(mt.mtmd_input_chunk_get_id(chunk) or b"")
                # (M-RoPE models' images take fewer positions than tokens: Context.position)
                self._keep(key, mt.mtmd_input_chunk_copy(chunk), n_tokens, int(mt.mtmd_input_chunk_get_n_pos(chunk)))
                ids.extend([key] * n_tokens)
            else:
                raise EngineError("Only images are taken (not audio).")
        return ids

    def _keep(self, key: int, chunk: int, n_tokens: int, n_pos: int) -> None:
        with self._lock:
            old = self._chunks.pop(key, None)
            if old:
                self._mt.mtmd_input_chunk_free(old[0])
            self._chunks[key] = (chunk, n_tokens, n_pos)
            while len(self._chunks) > KEEP_IMAGES:
                self._mt.mtmd_input_chunk_free(self._chunks.popitem(last=False)[1][0])

    def n_tokens(self, key: int) -> int:
        """Positions the image with this placeholder takes."""
        with self._lock:
            return self._chunk(key)[1]

    def n_pos(self, key: int) -> int:
        """Positions (of the text that follows) the image takes: its tokens, or fewer on an M-RoPE model."""
        with self._lock:
            return self._chunk(key)[2]

    def _chunk(self, key: int) -> tuple[int, int, int]:
        held = self._chunks.get(key)
        if held is None:
            raise EngineError("An image of this conversation is no longer held by the engine: send it again.")
        self._chunks.move_to_end(key)
        return held

    # --- evaluation -----------------------------------------------------------------------------------------
    def evaluate(self, ctx_ptr, key: int, n_past: int, n_batch: int, logits_last: bool) -> None:
        """Encode the image and decode its embeddings into sequence 0 of a context at ``n_past``."""
        new_n_past = ll.llama_pos(0)
        log_tail.clear()
        with self._lock:
            chunk = self._chunk(key)[0]
            rc = self._mt.mtmd_helper_eval_chunk_single(self.ptr, ctx_ptr, chunk, n_past, 0, n_batch, logits_last,
                                                         ctypes.byref(new_n_past))
        if rc == 2:
            raise Cancelled()
        if rc != 0:
            raise failure(f"llama.cpp could not evaluate an image (code {rc})", "The context may be full.")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            for chunk, *_ in getattr(self, "_chunks", {}).values():
                self._mt.mtmd_input_chunk_free(chunk)
            self._chunks = OrderedDict()
            self._mt.mtmd_free(self.ptr)
            self.ptr = None
