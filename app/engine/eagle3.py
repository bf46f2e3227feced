"""Drafting with an EAGLE-3 head: a one-layer model trained on a target's own features.

An EAGLE-3 GGUF (``general.architecture = eagle3``) names three of the target's layers. The target keeps those
layers' inputs for every token it evaluates (``Context.keep_layer_inputs``); the head's encoder turns the three,
side by side, into one feature g per position, and its decoder layer drafts: at position p - 1 of its own small
cache it reads the token at p with g at p - 1, and each further token feeds it its own hidden state back. Its
logits cover the target's vocabulary (a head with a smaller draft vocabulary maps its ids to the target's inside
llama.cpp's graph), so the target verifies as with any drafter: greedy output stays identical to plain decoding and
sampled output keeps the target's distribution. llama.cpp runs it as ``--spec-type draft-eagle3 -md HEAD``.

Its rounds are the MTP drafter's with two differences: rows sit one position earlier, and the target's inputs go
through the encoder first. Only some target architectures' llama.cpp graphs expose layer inputs, and enabling them
on any other aborts the process, so the pair is checked from the two headers before anything is enabled.
"""
from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as ll
import numpy as np

from .errors import EngineError
from .gguf_file import metadata
from .llama import Context, Model, _failure, _FloatRow, missing_ext
from .mtp import MtpDrafter

ARCH = "eagle3"
# Target architectures whose graphs in the bundled llama.cpp mark their layer inputs as outputs (t_layer_inp).
LAYER_INPUT_ARCHS = ("llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "gemma4", "gpt-oss", "lfm2",
                     "nemotron_h")


def target_layers(head: Model) -> tuple[int, ...]:
    return tuple(int(x) for x in metadata(head.path).get(f"{ARCH}.target_layers", ()))


def eagle3_problems(target: Model, head: Model) -> list[str]:
    """Why ``head`` cannot draft for ``target`` (empty: it can); each would abort llama.cpp or draft garbage."""
    if target.arch not in LAYER_INPUT_ARCHS:
        return [f"llama.cpp exposes the layer inputs an EAGLE-3 head reads only for {', '.join(LAYER_INPUT_ARCHS)} "
                f"targets, not {target.arch}"]
    problems = []
    hidden = int(metadata(head.path).get(f"{ARCH}.target_hidden_size", 0))
    if hidden != target.n_embd:
        problems.append(f"it was trained on a target with hidden size {hidden}, this one has {target.n_embd} "
                        "(a head for another model)")
    layers = target_layers(head)
    if len(layers) != 3 or max(layers, default=0) >= target.n_layer:
        problems.append(f"it reads layers {list(layers)}, the target has {target.n_layer}")
    if head.n_vocab != target.n_vocab:
        problems.append(f"its vocabulary has {head.n_vocab:,} tokens, the target's {target.n_vocab:,}")
    return problems


class Eagle3Drafter(MtpDrafter):
    name = "eagle3"
    SHIFT = -1  # the row for the token at p sits at p - 1 (with g at p - 1)
    # llama.cpp's EAGLE-3 graph computes logits for every row and hands out the first ones: the row whose output is
    # read must come alone
    SEED_ALONE = True

    def __init__(self, target: Context, head: Model, p_min: float = 0.0):
        if missing := missing_ext("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp"):
            raise EngineError(f"This llama.cpp build does not export {', '.join(missing)}, which an EAGLE-3 head needs "
                              "(llama.cpp's staging API): install llama-cpp-python as the README shows, or draft with "
                              "a draft model or n-gram lookup.")
        if problems := eagle3_problems(target.model, head):
            raise EngineError(f"{head.path.name} cannot draft for {target.model.path.name}: " + "; ".join(problems)
                              + ".")
        self._open(target, head, head.n_embd, p_min, ctx_type=ll.LLAMA_CONTEXT_TYPE_DEFAULT)
        target.keep_layer_inputs(target_layers(head))
        self._n_feat = 3 * target.model.n_embd
        self._enc = ll.llama_batch_init(self.N_BATCH, self._n_feat, 1)  # feature rows, no tokens
        self._feat = np.ctypeslib.as_array(self._enc.embd, shape=(self.N_BATCH * self._n_feat,)).reshape(
            -1, self._n_feat)

    def _inputs(self) -> dict[int, np.ndarray]:
        return self.target.layer_inputs

    def _states(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """g for each row: the head's encoder over the target's layer inputs, a batch at a time. The encoder writes
        no cache, but llama.cpp checks its positions as for a decode: they follow the head's cache."""
        from llama_cpp.llama_cpp_ext import llama_get_embeddings_nextn

        out, b = [], self._enc
        pos0 = int(ll.llama_memory_seq_pos_max(self.mem, 0)) + 1
        for i in range(0, len(inputs), self.N_BATCH):
            chunk = inputs[i : i + self.N_BATCH]
            for j, x in enumerate(chunk):
                self._feat[j] = x
                b.pos[j] = pos0 + j
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = 0
                b.logits[j] = 1
            b.n_tokens = len(chunk)
            rc = ll.llama_encode(self.ptr, b)
            if rc != 0:
                raise _failure(f"llama_encode failed in the EAGLE-3 head (code {rc})", "Check the head's file.")
            addr = ctypes.cast(llama_get_embeddings_nextn(self.ptr), ctypes.c_void_p).value
            out += list(np.array(_FloatRow(addr, len(chunk) * self.n_embd)).reshape(len(chunk), self.n_embd))
        return out

    def close(self) -> None:
        if self.ptr:
            ll.llama_batch_free(self._enc)
        super().close()
