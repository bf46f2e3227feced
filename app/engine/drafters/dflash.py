"""Block drafts: DFlash and DSpark (a GGUF with ``general.architecture = dflash``), llama.cpp's ``draft-dflash`` and
``draft-dspark``.

A block draft is a small model that drafts a whole block in one forward pass, conditioned on the target's hidden
states. For every token the target evaluates, the draft's context receives the inputs of the layers it names
(``dflash.target_layers``) at the same position (its graph projects them into its cache; ``llama.block``), and
each round decodes ``[last token, <mask> x k]`` at the next positions in one pass, attending over that cache and
the block, both ways unless the draft was trained causal. DFlash reads a draft token from each mask row. DSpark
adds a Markov head (each row's logits are biased by the previous row's pick, chained inside llama.cpp's graph) and
a confidence head, and reads from the anchor's row on unless its metadata says ``sample_from_anchor = false``; with
``--draft-p-min`` above 0 it stops where the confidence falls under it, as llama.cpp does. The block's rows are
dropped afterwards: the target's features replace them once it has verified the block, so greedy output stays
identical to plain decoding and sampled output keeps the target's distribution (each token is drawn from its row's
distribution, which depends on the history alone).

DFlash2 (``dflash.selector_top_k`` > 0: a selector and short convolutions in its layers) is ``draft-dflash`` too:
its graph scores, per row, its top candidates against each of the previous row's, and the draft walks that lattice
from the anchor as llama.cpp does (a deterministic proposal, so sampled output keeps the target's distribution).

Block size (``dflash.block_size``), anchor layout and causality come from the draft's metadata; a block drafts at
most ``block_size - 1`` tokens (DSpark from the anchor: ``block_size``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from ..gguf_file import GgufInfo, metadata
from ..llama import Context, Model
from ..llama.backend import missing_ext
from ..llama.block import BlockContext
from ..llama.heads import LAYER_INPUT_FUNCTIONS
from ..sampling import Noise, SamplingParams
from .base import Draft, Drafter, Gate, Stop
from .draft_model import ModelDrafter, next_draft_token
from .eagle3 import LAYER_INPUT_ARCHS

ARCH = "dflash"
MARKOV_HEAD = "markov_w1.weight"  # llama.cpp tells DSpark from DFlash by it


@dataclass(frozen=True)
class BlockSettings:
    """What a block draft's file says about how it drafts."""

    layers: tuple[int, ...]  # the target layers whose inputs it reads
    block_size: int
    sample_from_anchor: bool  # DSpark: the anchor's row drafts too
    causal: bool
    confidence: bool  # DSpark: a confidence head
    selector_top_k: int  # DFlash2: the candidates per row its selector scores (0: DFlash)

    @classmethod
    def of(cls, kv: dict) -> BlockSettings:
        """From the draft's metadata."""
        return cls(tuple(int(x) for x in kv.get(f"{ARCH}.target_layers", ())), int(kv.get(f"{ARCH}.block_size", 16)),
                   bool(kv.get(f"{ARCH}.sample_from_anchor", True)), bool(kv.get(f"{ARCH}.attention.causal", False)),
                   bool(kv.get(f"{ARCH}.has_confidence_head", True)), int(kv.get(f"{ARCH}.selector_top_k", 0)))


def block_problems(target: GgufInfo, draft: GgufInfo) -> list[str]:
    """Why ``draft`` cannot draft for ``target`` (empty: it can), from the two headers; each would abort llama.cpp
    or draft garbage."""
    t, d = target.kv, draft.kv
    arch = str(t.get("general.architecture"))
    if arch not in LAYER_INPUT_ARCHS:
        return [f"llama.cpp exposes the layer inputs a block draft reads only for {', '.join(LAYER_INPUT_ARCHS)} "
                f"targets, not {arch}"]
    s = BlockSettings.of(d)
    hidden, width = int(t.get(f"{arch}.embedding_length", 0)), int(d.get(f"{ARCH}.embedding_length", 0))
    n_layer = int(t.get(f"{arch}.block_count", 0)) - int(t.get(f"{arch}.nextn_predict_layers", 0))
    problems = []
    if width != hidden:
        problems.append(f"it reads features {width} wide per layer, the target's hidden size is {hidden} (a draft "
                        "for another model)")
    if not s.layers or max(s.layers) >= n_layer or min(s.layers) < 0:
        problems.append(f"it reads the inputs of layers {list(s.layers)}, the target has {n_layer} (0 to "
                        f"{n_layer - 1})")
    t_vocab, d_vocab = len(t.get("tokenizer.ggml.tokens") or ()), len(d.get("tokenizer.ggml.tokens") or ())
    if t_vocab != d_vocab:
        problems.append(f"its vocabulary has {d_vocab:,} tokens, the target's {t_vocab:,}")
    if s.block_size < 2:
        problems.append(f"its block size is {s.block_size}: it has no room to draft")
    return problems


def block_needs(draft: GgufInfo) -> str:
    """What a block draft needs of its target, in words (the pair check shows it)."""
    s, width = BlockSettings.of(draft.kv), int(draft.kv.get(f"{ARCH}.embedding_length", 0))
    selector = f", walked by a selector over each row's top {s.selector_top_k} (DFlash2)" if s.selector_top_k else ""
    return (f"a target of hidden size {width} whose layers {list(s.layers)} it reads (the target keeps their "
            f"inputs), with its vocabulary; blocks of {s.block_size} positions{selector}")


class DFlashDrafter(Drafter):
    name = ARCH
    label = "DFlash"
    # As a head given for the draft (-md): its file's architecture, the method that picks it besides the draft
    # model's, and how the pair check names it
    ARCH = METHOD = ARCH
    DESCRIBED = "a DFlash block draft"
    READS = "the inputs of the target layers it names (dflash.target_layers), a block per pass"
    SIGNAL_EDGES = ModelDrafter.SIGNAL_EDGES  # the greedy pick's top-1 minus top-2 logit, per row
    READS_TEXT = False  # its cache mirrors the target's, image positions and all (their features, as the target's)
    SIGNAL_PRIOR = ModelDrafter.SIGNAL_PRIOR
    AFTER_FORCED = False  # drafts from the target's features: never after tokens it has not evaluated
    FROM_ANCHOR = False  # DFlash reads a draft token from each mask row; DSpark from the anchor's row on

    @classmethod
    def kind(cls, info: GgufInfo) -> type[DFlashDrafter]:
        """The block drafter this file is: a Markov head makes it DSpark (as llama.cpp tells them apart)."""
        return DSparkDrafter if MARKOV_HEAD in info.tensors else DFlashDrafter

    needs = staticmethod(block_needs)
    pair_problems = staticmethod(block_problems)

    @staticmethod
    def target_problem(arch: str) -> str:
        """Why a target of this architecture cannot have such a draft, as a clause ('' if it can)."""
        return "" if arch in LAYER_INPUT_ARCHS else (
            f"and llama.cpp exposes the layers it reads only for {', '.join(LAYER_INPUT_ARCHS)} targets, not {arch}")

    def __init__(self, target: Context, draft: Model):
        if missing := missing_ext(*LAYER_INPUT_FUNCTIONS):
            raise EngineError(f"This llama.cpp build does not export {', '.join(missing)}, which a block draft needs "
                              "(llama.cpp's staging API): install llama-cpp-python as the README shows, or draft with "
                              "a draft model or n-gram lookup.")
        s = self.settings = BlockSettings.of(metadata(draft.path))  # (the pair checked it fits: pair_problems)
        self.target, self.model = target, draft
        self.anchor_drafts = self.FROM_ANCHOR and s.sample_from_anchor  # the anchor's row drafts
        self.max_block = s.block_size if self.anchor_drafts else s.block_size - 1  # tokens one block can draft
        # (made before the target decodes anything: from then on it follows every decode of the target's)
        self.ctx = BlockContext(target, draft, s.layers, s.block_size + 1, s.causal, self.label,
                                lattice=s.selector_top_k > 0)

    def set_threads(self, n: int) -> None:
        self.ctx.set_threads(n)

    def clear(self) -> None:
        self.ctx.clear()  # (with the target's cache: its next decode starts the mirror over)

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: Noise,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        t0 = time.perf_counter()
        n = min(n_max, self.max_block)
        if n <= 0:
            return Draft()
        n_past = len(history) - 1  # the target holds history[:n_past]; history[-1] is pending, at n_past
        self.ctx.drop_from(n_past)  # what the target evaluated past it: the rejected part of the last draft
        if self.ctx.next_pos() != n_past:  # (features missing: see BlockContext.follow)
            return Draft()
        skip = 0 if self.anchor_drafts else 1  # rows before the first that drafts
        block = [history[-1]] + [self.ctx.mask] * (n + skip - 1)
        try:
            self.ctx.decode_block(n_past, block)
            gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
            walk = self.settings.selector_top_k > 0  # DFlash2: a deterministic proposal
            draft = Draft(signals=[] if gate else None, n_evals=1, first_s=time.perf_counter() - t0,
                          n_first=len(block))
            if walk:
                self._walk(draft, len(block), gate, stop)
            else:
                self._read_rows(draft, range(skip, len(block)), sp, rng, gate, stop)
        finally:
            self.ctx.drop_from(n_past)  # the block's rows: the target's features replace them
        return draft

    def _read_rows(self, draft: Draft, rows: range, sp: SamplingParams, rng: Noise, gate: Gate | None,
                   stop: Stop | None) -> None:
        """A token from each row's logits, in order: its greedy pick or a sample (with its distribution)."""
        for row in rows:
            if not self._confident(row):
                break
            tok = next_draft_token(draft, self.ctx.logits(row), sp, rng, self._p_min_of_probs(), gate)
            if tok is None or (stop and stop(tok)):
                break

    def _walk(self, draft: Draft, n_rows: int, gate: Gate | None, stop: Stop | None) -> None:
        """DFlash2, as llama.cpp walks it: row i (after the anchor's) holds its top-k candidate ids, then the score of
        each candidate after each of row i - 1's; from the anchor, take the best after the previous pick. With
        --draft-p-min above 0, stop where that pick's softmax share of its scores falls under it."""
        k = self.settings.selector_top_k
        pick = 0  # (the anchor's row: one predecessor, its scores repeated)
        for row in self.ctx.lattice(n_rows)[1:]:
            scores = row[k + pick * k : k + (pick + 1) * k]
            pick = int(np.argmax(scores))
            if self.p_min > 0.0 and 1.0 / np.exp(scores - scores[pick]).sum() < self.p_min:
                break
            if gate:
                gap = float(scores[pick] - np.partition(scores, -2)[-2]) if k > 1 else float("inf")
                if not gate.take(gap):
                    break
                draft.signals.append(gap)
            draft.tokens.append(tok := int(row[pick]))
            if stop and stop(tok):
                break

    def _confident(self, row: int) -> bool:
        """Does the draft's own confidence let this row draft (DSpark's head; DFlash has none)?"""
        return True

    def _p_min_of_probs(self) -> float:
        """--draft-p-min as a floor on the row's top probability (DFlash, as llama.cpp applies it)."""
        return self.p_min

    def close(self) -> None:
        self.ctx.close()


class DSparkDrafter(DFlashDrafter):
    name = METHOD = "dspark"
    label = "DSpark"
    DESCRIBED = "a DSpark block draft (DFlash with Markov and confidence heads)"
    FROM_ANCHOR = True  # (unless its metadata says sample_from_anchor = false)

    def with_p_min(self, p_min: float) -> DFlashDrafter:
        if p_min > 0.0 and not self.settings.confidence:
            raise EngineError(f"{self.model.path.name} has no confidence head, which --draft-p-min {p_min} asks of a "
                              "DSpark draft: set --draft-p-min 0 to draft with it (as llama.cpp asks).")
        return super().with_p_min(p_min)

    def _confident(self, row: int) -> bool:
        """llama.cpp: a DSpark draft stops where its confidence head falls under --draft-p-min."""
        return self.p_min <= 0.0 or self.ctx.extra(row) >= self.p_min

    def _p_min_of_probs(self) -> float:
        return 0.0  # (its confidence head judges instead)
