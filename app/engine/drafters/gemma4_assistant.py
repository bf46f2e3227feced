"""Drafting with Gemma 4's assistant: a small model (``gemma4-assistant``) that drafts from the target's own cache.

It has no keys or values of its own: each of its layers attends over the target's KV cache (its sliding-window
layers over the target's last sliding-window layer, its full layers over the target's last layer), and it reads
the target's token embeddings. Each step takes one row, a token and a hidden state of the target's width: the
pending token with the target's hidden state before it, then each drafted token with the assistant's own output.
Every step sits at the target's next position (llama.cpp requires it), and nothing is left behind to roll back:
the target verifies as with any drafter, so greedy output stays identical and sampled output keeps the target's
distribution. llama.cpp runs it as its ``draft-mtp`` type with a separate file (``--spec-type draft-mtp -md``).

Its context shares the target's cache, which makes two things unsafe that are safe elsewhere: creating it resets
the target's cache bookkeeping (so it is made before the target decodes anything), and clearing its memory would
clear the target's (so ``clear`` does nothing). A target of another architecture crashes llama.cpp, so the pair is
checked from the two headers before the context is made.
"""
from __future__ import annotations

import time

import numpy as np

from ..gguf_file import GgufInfo
from ..llama import Context, Model
from ..llama.heads import HiddenStates, captured
from ..sampling import Noise, SamplingParams
from .base import Draft, Gate, Stop
from .mtp import MtpDrafter

ARCH = "gemma4-assistant"
TARGET_ARCH = "gemma4"


def assistant_problems(target: GgufInfo, assistant: GgufInfo) -> list[str]:
    """Why ``assistant`` cannot draft for ``target`` (empty: it can), from the two headers. Each of these would crash
    llama.cpp or give garbage drafts, so nothing is created before they are checked."""
    name = assistant.path.name
    if target.architecture != TARGET_ARCH:
        return [f"{name} is Gemma 4's assistant: it drafts only for a Gemma 4 target, not {target.architecture}"]
    t, a = target.kv, assistant.kv
    problems = []
    if int(a.get(f"{ARCH}.embedding_length_out", 0)) != target.n_embd:
        problems.append(f"it expects a target hidden size of {a.get(f'{ARCH}.embedding_length_out')}, the target "
                        f"has {target.n_embd} (an assistant of another Gemma 4 size)")
    if assistant.n_vocab != target.n_vocab:
        problems.append(f"its vocabulary has {assistant.n_vocab:,} tokens, the target's {target.n_vocab:,}")
    pattern = [bool(x) for x in t.get(f"{TARGET_ARCH}.attention.sliding_window_pattern", ())]
    if len(pattern) < 2 or not pattern[-2] or pattern[-1]:
        problems.append("the target's last two layers are not a sliding-window layer then a full one")
    for key in ("attention.key_length", "attention.key_length_swa", "attention.head_count_kv"):
        tv, av = _last(t.get(f"{TARGET_ARCH}.{key}", 0)), _last(a.get(f"{ARCH}.{key}", 0))
        if int(tv) != int(av):
            problems.append(f"its {key} is {av}, the target's {tv}")
    return problems


def _last(value):
    """A per-layer value's last layer (the one the assistant reads), or the value itself."""
    return value if np.ndim(value) == 0 else value[-1]


class AssistantDrafter(MtpDrafter):
    name = "assistant"
    label = "Gemma 4 assistant"
    # As a head given for the draft (-md): its file's architecture, the method that picks it besides the draft
    # model's (llama.cpp: --spec-type draft-mtp -md FILE), and how the pair check names it
    ARCH, METHOD = ARCH, MtpDrafter.name
    DESCRIBED, READS = "Gemma 4's assistant", "the target's own cache"

    @staticmethod
    def target_problem(arch: str) -> str:
        """Why a target of this architecture cannot have this head, as a clause ('' if it can)."""
        return "" if arch == TARGET_ARCH else f"which drafts only for a Gemma 4 target, not {arch}"

    @staticmethod
    def made_for(target: dict, other: dict) -> bool:
        """Is the file whose metadata is ``other`` an assistant for the target whose metadata is ``target``?"""
        return (target.get("general.architecture") == TARGET_ARCH and other.get("general.architecture") == ARCH
                and other.get(f"{ARCH}.embedding_length_out") == target.get(f"{TARGET_ARCH}.embedding_length"))

    pair_problems = staticmethod(assistant_problems)
    N_BATCH = 1  # one row per step

    def __init__(self, target: Context, assistant: Model):
        self._open(target, assistant, target.model.n_embd, mtp_type=True)
        self.capture = captured(target, HiddenStates)

    def clear(self) -> None:
        pass  # its memory is the target's: clearing it would clear the target's cache

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: Noise,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        n_past = len(history) - 1  # the target holds history[:n_past]; history[-1] is pending, at n_past
        hidden = self.capture.rows
        h = hidden.get(n_past - 1)
        for p in [p for p in hidden if p != n_past - 1]:  # no other row is ever needed again
            del hidden[p]
        if h is None:  # (a cached prompt prefix after a reset: the target's state before it is gone)
            return Draft()
        t0 = time.perf_counter()
        at = self.target.position(n_past)  # (less than n_past after an image that takes fewer positions than cells)
        self.ctx.decode([(at, history[-1], h)], output_last=True)
        gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
        draft = Draft(signals=[] if gate else None, n_evals=1, first_s=time.perf_counter() - t0, n_first=1)
        self._chain(draft, n_max, sp, rng, gate, stop, lambda i: at)
        return draft
