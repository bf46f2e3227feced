"""A draft model: a small GGUF with the target's vocabulary drafts autoregressively in a context of its own
(llama.cpp's ``draft-simple``). Its helpers (prefill, catch-up, one greedy or sampled step) serve the draft of
another vocabulary and the heads too."""
from __future__ import annotations

import time

import numpy as np

from ..llama import Context
from ..sampling import Noise, SamplingParams, distribution, draft_pick, sample
from .base import Draft, Drafter, Gate

# A draft model reads the prompt after the target has, and a long one took it as long again on the starter (1,717
# tokens: 30.1 s to the first token, 14.0 s without a draft). So a prompt's uncached rest up to READ_AT_ONCE tokens
# (a chat's next turn) is read before the first token, and a longer one READ_PIECE tokens a round while the target
# answers plainly, until the draft has read all of it and drafts.
READ_AT_ONCE = 128
READ_PIECE = 64


class ModelDrafter(Drafter):
    """A small GGUF model with the target's vocabulary drafts autoregressively in its own context.

    Greedy drafting stops early when the draft's top probability falls under ``p_min`` (llama.cpp's
    ``--draft-p-min``): a token it is unsure of is likely to be rejected and costs a draft step for nothing.
    """

    name = "model"
    label = "draft model"
    # Top-1 minus top-2 logit. Acceptance climbs steeply below 0.15 and is flat above (the starter pair, 20 chat
    # answers: 51% under 0.05, 64% to 0.1, 83% to 0.15, 99-100% from there), so the buckets are narrow there: one
    # bucket under 0.25 mixed coin flips with sure tokens, and rounds ended at tokens the target nearly always took.
    SIGNAL_EDGES = (0.05, 0.1, 0.15, 0.3, 1.0, 2.0, 4.0)
    SIGNAL_PRIOR = (0.5, 0.6, 0.8, 0.9, 0.98, 0.99, 0.995, 0.995)

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.unread: list[int] = []  # the prompt's tokens still to read (read_on), after those the context holds

    def begin(self, prompt_ids: list[int]) -> None:
        n = self.ctx.reuse_prefix(prompt_ids[:-1])
        self.unread = prompt_ids[n:-1] if len(prompt_ids) - 1 - n > READ_AT_ONCE else []
        if not self.unread:
            prefill_draft(self.ctx, prompt_ids)

    def read_on(self, n: int = READ_PIECE) -> bool:
        if not self.unread:
            return False
        piece, self.unread = self.unread[:n], self.unread[n:]
        self.ctx.decode(piece, n_logits=0)
        if not self.unread:
            self.ctx.checkpoint()  # (as prefill_draft: where a recurrent draft restarts)
        return True

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        ctx = self.ctx
        if self.unread:  # (the loop drafts nothing while the prompt is being read)
            return Draft()
        first_s, n_first = catch_up(ctx, history)
        gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
        draft = Draft(signals=[] if gate else None, n_evals=1, first_s=first_s, n_first=n_first)
        for i in range(n_max):
            tok = next_draft_token(draft, ctx.logits(-1), sp, rng, self.p_min, gate)
            if tok is None or (stop and stop(tok)) or i + 1 == n_max or (gate and not gate.look_further()):
                break
            ctx.decode([tok], n_logits=1, n_speculative=1)  # the next round drops what the target rejects
            draft.n_evals += 1
        return draft


def next_draft_token(draft: Draft, logits: np.ndarray, sp: SamplingParams, rng: Noise, p_min: float,
                     gate: Gate | None) -> int | None:
    """A draft model's step: its greedy pick (judged by --draft-p-min and the gate, with the logit gap recorded as
    the signal) or a draw from its distribution q; appended to ``draft``. None: stop here."""
    if sp.greedy:
        tok, confident, gap = draft_pick(logits, p_min)
        if not confident:
            draft.unsure = True
            return None
        if gate:
            if not gate.take(gap):
                return None
            draft.signals.append(gap)
    else:
        q = distribution(logits, sp)
        if p_min > 0.0 and q.max() < p_min:
            draft.unsure = True
            return None
        tok = sample(q, rng, len(draft.tokens))  # (drawn with the numbers the target draws this position with)
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


