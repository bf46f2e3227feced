"""Drafting with an EAGLE-3 head: a one-layer model trained on a target's own features.

An EAGLE-3 GGUF (``general.architecture = eagle3``) names three of the target's layers. The target keeps those
layers' inputs for every token it evaluates (``llama.heads.LayerInputs``); the head's encoder turns the three,
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

import numpy as np

from ..errors import EngineError
from ..gguf_file import GgufInfo, metadata
from ..llama import Context, Model
from ..llama.backend import missing_ext
from ..llama.heads import LAYER_INPUT_FUNCTIONS, LayerInputs, captured
from .mtp import MtpDrafter

ARCH = "eagle3"
# Target architectures whose graphs in the bundled llama.cpp mark their layer inputs as outputs (t_layer_inp).
LAYER_INPUT_ARCHS = ("llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "gemma4", "gpt-oss", "lfm2",
                     "nemotron_h")


def target_layers(kv: dict) -> tuple[int, ...]:
    """The target layers whose inputs the head reads, from its metadata."""
    return tuple(int(x) for x in kv.get(f"{ARCH}.target_layers", ()))


def eagle3_problems(target: GgufInfo, head: GgufInfo) -> list[str]:
    """Why ``head`` cannot draft for ``target`` (empty: it can), from the two headers; each would abort llama.cpp or
    draft garbage."""
    if target.architecture not in LAYER_INPUT_ARCHS:
        return [f"llama.cpp exposes the layer inputs an EAGLE-3 head reads only for {', '.join(LAYER_INPUT_ARCHS)} "
                f"targets, not {target.architecture}"]
    problems = []
    hidden = int(head.kv.get(f"{ARCH}.target_hidden_size", 0))
    if hidden != target.n_embd:
        problems.append(f"it was trained on a target with hidden size {hidden}, this one has {target.n_embd} "
                        "(a head for another model)")
    layers = target_layers(head.kv)
    if len(layers) != 3 or max(layers, default=0) >= target.n_layer:
        problems.append(f"it reads layers {list(layers)}, the target has {target.n_layer}")
    if head.n_vocab != target.n_vocab:
        problems.append(f"its vocabulary has {head.n_vocab:,} tokens, the target's {target.n_vocab:,}")
    return problems


class Eagle3Drafter(MtpDrafter):
    name = ARCH
    label = "EAGLE-3"
    # As a head given for the draft (-md): its file's architecture, the method that picks it besides the draft
    # model's, and how the pair check names it
    ARCH = METHOD = ARCH
    DESCRIBED, READS = "an EAGLE-3 head", "the target's own features"

    @staticmethod
    def target_problem(arch: str) -> str:
        """Why a target of this architecture cannot have such a head, as a clause ('' if it can)."""
        return "" if arch in LAYER_INPUT_ARCHS else (
            f"and llama.cpp exposes the layers it reads only for {', '.join(LAYER_INPUT_ARCHS)} targets, not {arch}")

    pair_problems = staticmethod(eagle3_problems)
    SHIFT = -1  # the row for the token at p sits at p - 1 (with g at p - 1)
    # llama.cpp's EAGLE-3 graph computes logits for every row and hands out the first ones: the row whose output is
    # read must come alone
    SEED_ALONE = True

    def __init__(self, target: Context, head: Model):
        if missing := missing_ext(*LAYER_INPUT_FUNCTIONS):
            raise EngineError(f"This llama.cpp build does not export {', '.join(missing)}, which an EAGLE-3 head needs "
                              "(llama.cpp's staging API): install llama-cpp-python as the README shows, or draft with "
                              "a draft model or n-gram lookup.")
        self._open(target, head, head.n_embd, mtp_type=False)
        self.capture = captured(target, LayerInputs, target_layers(metadata(head.path)))
        self._n_feat = 3 * target.model.n_embd

    def _states(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """g for each row: the head's encoder over the target's layer inputs."""
        return self.ctx.encode(inputs, self._n_feat)
