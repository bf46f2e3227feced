"""Drafters propose tokens for the target to verify. One loop serves them all; ``NoDrafter`` is speculation off.

A drafter sees the committed history (prompt + accepted output, ending with the newest token, which the target
has not evaluated yet) and proposes up to ``n_max`` continuation tokens. When sampling, it also returns the
distribution each token was drawn from (``None`` = a deterministic proposal, treated as one-hot).
"""
from __future__ import annotations

import time

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from .llama import Context
from .sampling import SamplingParams, distribution, draft_pick, sample


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] | None = None  # q per token when the drafter sampled from a distribution
    signals: list[float] | None = None  # per token: the drafter's confidence signal, when asked for
    n_evals: int = 0  # draft-model decode calls spent (the marginal cost of a token is one call)
    first_s: float = 0.0  # seconds of the first call, which also catches up on the tokens made since the last draft
    n_first: int = 0  # tokens the first call evaluated
    forced: list[bool] = field(default_factory=list)  # per token, under a grammar: forced by it, not drafted


class Gate(Protocol):
    """The adaptive controller's say in a draft, token by token (``DraftLength``)."""

    def take(self, signal: float) -> bool:
        """Propose this token (already drafted: its cost is paid), whose confidence signal is ``signal``?"""

    def look_further(self) -> bool:
        """Pay for one more draft step, to see the token after the last one taken?"""


Stop = Callable[[int], bool]  # a grammar's say in a draft: end it after this token?


def stop_at(tokens: list[int], stop: Stop | None) -> int:
    """How many of ``tokens`` a draft keeps: through the first one ``stop`` ends it after."""
    if stop is not None:
        for i, tok in enumerate(tokens):
            if stop(tok):
                return i + 1
    return len(tokens)


class Drafter(Protocol):
    name: str
    SIGNAL_EDGES: tuple[float, ...]  # buckets of the confidence signal, for the adaptive controller
    SIGNAL_PRIOR: tuple[float, ...]  # expected acceptance per bucket before any measurement
    # (optional) AFTER_FORCED = False: under a grammar, never drafts after tokens the grammar forced in the round

    def begin(self, prompt_ids: list[int]) -> None:
        """A generation starts from this prompt (the drafter may prefill or index it)."""

    def propose(
        self, history: list[int], n_max: int, sp: SamplingParams, rng: np.random.Generator,
        gate: Gate | None = None, stop: Stop | None = None,
    ) -> Draft:
        """Up to ``n_max`` tokens that may follow ``history``. If ``gate`` is given, ask it to take each token
        (passing its confidence signal) and, where drafting costs a step, whether to look further; report the
        signals in ``Draft.signals``. If ``stop`` is given, pass it each token proposed, in order, and end the draft
        after the first for which it answers True."""


class NoDrafter:
    """Speculation off: the same loop, verifying one token per round."""

    name = "none"
    SIGNAL_EDGES = ()
    SIGNAL_PRIOR = (0.0,)

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        return Draft()


class ModelDrafter:
    """A small GGUF model with the target's vocabulary drafts autoregressively in its own context.

    Greedy drafting stops early when the draft's top probability falls under ``p_min`` (llama.cpp's
    ``--draft-p-min``): a token it is unsure of is likely to be rejected and costs a draft step for nothing.
    """

    name = "model"
    SIGNAL_EDGES = (0.25, 0.5, 1.0, 2.0, 4.0)  # top-1 minus top-2 logit
    SIGNAL_PRIOR = (0.5, 0.9, 0.95, 0.98, 0.99, 0.995)

    def __init__(self, ctx: Context, p_min: float = 0.0):
        self.ctx = ctx
        self.p_min = p_min

    def begin(self, prompt_ids: list[int]) -> None:
        prefill_draft(self.ctx, prompt_ids)

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        ctx = self.ctx
        first_s, n_first = catch_up(ctx, history)
        gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
        draft = Draft(probs=None if sp.greedy else [], signals=[] if gate else None, n_evals=1, first_s=first_s,
                      n_first=n_first)
        for i in range(n_max):
            tok = next_draft_token(draft, ctx.logits(-1), sp, rng, self.p_min, gate)
            if tok is None or (stop and stop(tok)) or i + 1 == n_max or (gate and not gate.look_further()):
                break
            ctx.decode([tok], n_logits=1, n_speculative=1)  # the next round drops what the target rejects
            draft.n_evals += 1
        return draft


def next_draft_token(draft: Draft, logits: np.ndarray, sp: SamplingParams, rng: np.random.Generator, p_min: float,
                     gate: Gate | None) -> int | None:
    """A draft model's step: its greedy pick (judged by --draft-p-min and the gate, with the logit gap recorded as
    the signal) or a sample from its distribution (recorded as q); appended to ``draft``. None: stop here."""
    if sp.greedy:
        tok, confident, gap = draft_pick(logits, p_min)
        if not confident:
            return None
        if gate:
            if not gate.take(gap):
                return None
            draft.signals.append(gap)
    else:
        q = distribution(logits, sp)
        if p_min > 0.0 and q.max() < p_min:
            return None
        tok = sample(q, rng)
        draft.probs.append(q)
    draft.tokens.append(tok)
    return tok


def prefill_draft(ctx: Context, ids: list[int]) -> None:
    """Prefill all but the last token (the first propose() evaluates it with logits) and checkpoint there (a
    recurrent draft keeps its state here, for Regenerate and for a next turn that changes the answer)."""
    n = ctx.reuse_prefix(ids[:-1])
    ctx.decode(ids[n:-1], n_logits=0)
    ctx.checkpoint()


def catch_up(ctx: Context, ids: list[int]) -> tuple[float, int]:
    """Bring a draft context to ``ids`` (keeping the cached prefix) with fresh logits for the last token; returns
    the seconds this first call took and the tokens it evaluated."""
    n = ctx.reuse_prefix(ids)
    if n == len(ids):  # everything cached, but fresh logits are needed for the last token
        ctx.truncate(n - 1)
        n -= 1
    t0 = time.perf_counter()
    ctx.decode(ids[n:], n_logits=1)
    return time.perf_counter() - t0, len(ids) - n


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the history's last n tokens (longest n first) and
    propose what followed it. Model-free, so drafting costs microseconds; it pays when the answer repeats text
    from the prompt or from itself (code edits, quoting, summaries with names)."""

    name = "ngram"
    SIGNAL_EDGES = (2.5, 3.5)  # length of the matched n-gram
    SIGNAL_PRIOR = (0.6, 0.8, 0.9)
    # Not after tokens a grammar forced: a lookup keyed on them (`": "` and a key) finds the structure that repeats
    # at every key and proposes what followed the last one (3 of 21 such first tokens accepted on the JSON bench,
    # against 11 of 14 at the start of a round).
    AFTER_FORCED = False

    def __init__(self, n_min: int = 2, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def begin(self, prompt_ids: list[int]) -> None:
        # Within one generation the history only grows, so the index is built incrementally from here.
        self._index.clear()
        self._indexed = 0

    def _extend_index(self, history: list[int]) -> None:
        # Index n-grams that have a continuation (end position j < len-1); later occurrences overwrite earlier.
        for j in range(self._indexed, len(history) - 1):
            for n in range(self.n_min, self.n_max + 1):
                if j + 1 >= n:
                    self._index[tuple(history[j + 1 - n : j + 1])] = j + 1
        self._indexed = max(self._indexed, len(history) - 1)

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        self._extend_index(history)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(history) < n:
                continue
            start = self._index.get(tuple(history[-n:]))
            if start is not None:
                tokens = history[start : start + n_max]
                if gate is None:
                    return Draft(tokens=tokens[: stop_at(tokens, stop)])
                draft = Draft(signals=[])
                for tok in tokens:  # (looking further costs nothing here)
                    if not gate.take(n):
                        break
                    draft.tokens.append(tok)
                    draft.signals.append(n)
                    if stop and stop(tok):
                        break
                return draft
        return Draft()
