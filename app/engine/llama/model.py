"""A loaded GGUF model (weights and vocabulary) and the settings it is loaded and given a context with."""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import llama_cpp.llama_cpp as ll

from ..gguf_file import check_gguf_file, read_info
from .backend import failure, init_backend, log_tail


@dataclass(frozen=True)
class ModelSettings:
    """How to load one GGUF model and size its context (llama.cpp's -c, -t, -ngl)."""

    path: Path
    n_ctx: int = 0  # 0: min(training context, 4096)
    n_threads: int = 0  # 0: physical cores
    n_gpu_layers: int = 0  # -1: all layers
    offload_why: str = ""  # why n_gpu_layers is what it is, in words (shown with it: the fit, or "as asked")
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
        params.n_gpu_layers = int(n_gpu_layers) if n_gpu_layers >= 0 else -1  # (llama.cpp's own "every layer")
        params.vocab_only = bool(vocab_only)
        params.use_extra_bufts = False  # repacked weights: one token and a batch take kernels that round apart
        params.load_mtp = True  # a model's own next-token-prediction layers, where it has them (--drafter mtp)
        log_tail.clear()
        ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            raise failure(
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
        self.bos_named = info.bos_named  # False: no BOS id in the file, llama.cpp assumed its default (``bos``)
        self.kv_bytes_per_token = info.kv_bytes_per_token  # F16 K and V of the attention layers
        self.recurrent_bytes = info.recurrent_bytes  # one copy of the recurrent state (a snapshot, a checkpoint)
        self._piece_cache: dict[int, bytes] = {}
        self._text_cache: dict[int, bytes] = {}
        self.template_override: str | None = None  # a chat template used instead of the file's (--chat-template)

    # --- metadata -------------------------------------------------------------------------------------------
    def chat_template(self) -> str | None:
        if self.template_override is not None:
            return self.template_override
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

    def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids`` (special tokens rendered as empty)."""
        return b"".join(self.piece(t) for t in ids).decode("utf-8", errors="replace")

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


