"""The context a block draft (DFlash, DSpark: ``general.architecture = dflash``) drafts in.

It is the draft model's own, on the target's (``ctx_other``: a draft without token embeddings or an output head
borrows the target's). Two kinds of batch go through it, as in llama.cpp's ``draft-dflash``: rows of the target's
features (the inputs of the layers the draft names, side by side), which its graph projects and writes into its
cache at the target's positions; and a block of tokens, ``[last, <mask> ...]``, decoded in one pass over that cache
with every row an output (logits, and the rows' extra outputs: DSpark's confidences, DFlash2's selector lattice).

The features go in as each target decode leaves them (as llama.cpp's ``process`` hook does), whatever drafts that
round: the cache mirrors the target's position for position, with no copy kept on the side however long the
conversation.
"""
from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as ll
import numpy as np

from ..errors import EngineError
from .backend import FloatRow, failure, in_sequence, logits_row
from .context import Context
from .heads import LayerInputs, OwnCache, nextn_call
from .model import Model


class _Features(LayerInputs):
    """The target's layer inputs, handed on to ``feed(start, rows)`` as each decode leaves them instead of kept."""

    def __init__(self, target: Context, layers: tuple[int, ...], feed):
        super().__init__(target, layers)
        self.feed = feed

    def keep(self, start: int, n: int) -> None:
        self.feed(start, self.read(n))

    def skip(self, start: int, n: int) -> None:
        if n:  # (an image's first batches) zero features hold their places: the draft reads the rest
            self.feed(start, np.zeros((n, len(self.layers) * self.target.model.n_embd), dtype=np.float32))


class BlockContext(OwnCache):
    """A block draft's context, following its target's decodes from its making on."""

    def __init__(self, target: Context, model: Model, layers: tuple[int, ...], n_block_max: int, causal: bool,
                 label: str, lattice: bool = False):
        """A context for ``model`` that follows ``target`` from now on (made before the target decodes anything)."""
        self.target, self.model, self.label = target, model, label
        self.mask = int(ll.llama_vocab_mask(model.vocab))
        if self.mask < 0:
            raise EngineError(f"{model.path.name} names no mask token (tokenizer.ggml.mask_token_id), which a block "
                              "draft fills its block with: the file is incomplete.")
        self.n_batch = max(target.n_batch, n_block_max)
        self._open(target, model, self.n_batch, n_block_max, label)  # every row of a block is an output
        ll.llama_set_causal_attn(self.ptr, causal)  # a block attends both ways unless the draft was trained causal
        # the rows' extra outputs: DSpark's confidences (output rows), DFlash2's lattice (every row of the block)
        nextn_call("llama_set_embeddings_nextn")(self.ptr, True, not lattice)
        self.n_embd = model.n_embd
        n_feat = len(layers) * target.model.n_embd
        self._features = ll.llama_batch_init(self.n_batch, n_feat, 1)  # feature rows, no tokens
        self._feat = np.ctypeslib.as_array(self._features.embd, shape=(self.n_batch * n_feat,)).reshape(-1, n_feat)
        # A draft for an M-RoPE target (Qwen3.5's) has M-RoPE too: llama.cpp reads an embedding row's position in 4
        # sections, section-major ({p, p, p, 0}, as llama.cpp's draft-dflash gives them); a token row's in one.
        mrope = ll.llama_model_rope_type(model.ptr) in (ll.LLAMA_ROPE_TYPE_MROPE, ll.LLAMA_ROPE_TYPE_IMROPE)
        self._sections = (1, 1, 1, 0) if mrope else (1,)
        self._own_pos = (ll.llama_pos * (len(self._sections) * self.n_batch))()
        # ours in place of llama_batch_init's, whose address is kept (a ctypes field's value is a view of the field:
        # it would follow the change, and llama_batch_free would then free ours)
        self._batch_pos = ctypes.cast(self._features.pos, ctypes.c_void_p).value
        self._features.pos = ctypes.cast(self._own_pos, ctypes.POINTER(ll.llama_pos))
        self._block = ll.llama_batch_init(n_block_max, 0, 1)
        self._follow = _Features(target, layers, self.follow)

    def follow(self, start: int, rows: np.ndarray) -> None:
        """The target decoded positions ``start``... and left these features: what the cache held from ``start`` on
        was of tokens the target has dropped since (a rejected draft, an earlier turn), and these replace it."""
        self.drop_from(start)
        if start != self.next_pos():  # (a gap llama.cpp would refuse: none in this engine's decodes) the cache
            return  # stops there, and the draft drafts nothing until the target decodes from that position again
        b = self._features
        for i in range(0, len(rows), self.n_batch):
            chunk = rows[i : i + self.n_batch]
            self._feat[: len(chunk)] = chunk
            n = len(chunk)
            for j in range(n):
                for k, on in enumerate(self._sections):
                    self._own_pos[k * n + j] = (start + i + j) * on
                in_sequence(b, j, logits=False)
            b.n_tokens = n
            if ll.llama_decode(self.ptr, b) != 0:  # (llama.cpp logged why) not the target's failure: the cache
                self.drop_from(start)  # stops before these, and the draft drafts nothing until they come again
                return
        ll.llama_synchronize(self.ptr)

    def decode_block(self, pos0: int, tokens: list[int]) -> None:
        """Decode a block at positions ``pos0``...; every row's outputs can be read."""
        b = self._block
        for j, tok in enumerate(tokens):
            b.token[j] = tok
            b.pos[j] = pos0 + j
            in_sequence(b, j, logits=True)
        b.n_tokens = len(tokens)
        rc = ll.llama_decode(self.ptr, b)
        if rc != 0:
            raise failure(f"llama_decode failed on a block in the {self.label} draft's context (code {rc})",
                          "The context may be full.")
        ll.llama_synchronize(self.ptr)


    def logits(self, row: int) -> np.ndarray:
        """The last block's logits at ``row`` (a view, valid until the next decode)."""
        return logits_row(self.ptr, row, self.model.n_vocab)

    def extra(self, row: int) -> float:
        """The first value of the last block's extra output at ``row`` (DSpark: its confidence head's)."""
        addr = ctypes.cast(nextn_call("llama_get_embeddings_nextn_ith")(self.ptr, row), ctypes.c_void_p).value
        if not addr:
            raise EngineError(f"llama.cpp kept no confidences for the {self.label} draft's block.")
        return float(np.asarray(FloatRow(addr, 1))[0])

    def lattice(self, n_rows: int) -> np.ndarray:
        """The last block's extra outputs, every row (DFlash2: per row its top candidates and their pair scores); a
        view, valid until the next decode."""
        addr = ctypes.cast(nextn_call("llama_get_embeddings_nextn")(self.ptr), ctypes.c_void_p).value
        if not addr:
            raise EngineError(f"llama.cpp kept no selector lattice for the {self.label} draft's block.")
        return np.asarray(FloatRow(addr, n_rows * self.n_embd)).reshape(n_rows, self.n_embd)

    def close(self) -> None:
        if self._follow in self.target.captures:  # (the target outlives it)
            self.target.captures.remove(self._follow)
        if self.ptr:
            # llama_batch_init's own, which llama_batch_free frees (ours is Python's)
            self._features.pos = ctypes.cast(self._batch_pos, ctypes.POINTER(ll.llama_pos))
            ll.llama_batch_free(self._features)
            ll.llama_batch_free(self._block)
            ll.llama_free(self.ptr)
            self.ptr = None
