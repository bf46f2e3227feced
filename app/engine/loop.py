"""The speculative loop: draft, verify in one target batch, accept, roll back — for every drafter alike.

Invariant: ``target.tokens`` (what the target's KV cache holds) is always a prefix of ``history`` and lacks at
least its newest token, which the next round evaluates together with the draft. Rejected positions are dropped
right after each verification, so a generation stopped at any yield leaves the cache consistent.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

from .constraint import Constraint, constrained_draft
from .draft_control import MAX_DRAFT, DraftLength, DraftParams
from .drafters import Draft, Drafter, NoDrafter
from .errors import EngineError
from .events import Done, Event, Round, Stats, TextDelta
from .grammar import Grammar
from .llama import Cancelled, Context
from .sampling import SamplingParams, accept_or_resample, distribution, greedy_token, make_rng, sample
from .text import TextStream


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    draft: DraftParams = field(default_factory=DraftParams)
    grammar: Grammar | None = None  # the answer follows it (a JSON schema, GBNF...)
    shown: frozenset[int] = frozenset()  # special tokens written out in the text (a tool-call marker: [TOOL_CALLS])

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise EngineError(f"Invalid --max-tokens {self.max_tokens}: it must be at least 1.")
        self.sampling.validate()
        self.draft.validate()


def speculative_generate(
    target: Context,
    drafter: Drafter,
    prompt_ids: list[int],
    params: GenerationParams,
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    model = target.model
    sp = params.sampling
    rng = make_rng(sp.seed)
    control = DraftLength(
        params.draft, getattr(drafter, "SIGNAL_EDGES", ()), getattr(drafter, "SIGNAL_PRIOR", (0.9,))
    )
    gate = control if params.draft.adaptive else None
    stats = Stats(drafter=drafter.name)
    stream = TextStream(params.stop)
    out_ids: list[int] = []
    flags: list[bool] = []
    if not prompt_ids:
        raise EngineError("The prompt is empty.")
    if len(prompt_ids) >= target.n_ctx:
        raise EngineError(
            f"The prompt is {len(prompt_ids)} tokens but the context holds {target.n_ctx}. "
            "Shorten the prompt or raise the context size (--ctx)."
        )

    constraint = Constraint(params.grammar, model) if params.grammar else None
    if constraint:  # the target's choices under the grammar's mask, the grammar advanced past each one chosen
        greedy_of = constraint.greedy
        dist_of = lambda logits: constraint.distribution(logits, sp)  # noqa: E731
    else:
        greedy_of = greedy_token
        dist_of = lambda logits: distribution(logits, sp)  # noqa: E731

    def pick(logits) -> int:
        tok = greedy_of(logits) if sp.greedy else sample(dist_of(logits), rng)
        if constraint:
            constraint.commit(tok)
        return tok

    t_start = time.perf_counter()
    target.set_cancel(cancel)
    try:
        # --- prefill: reuse the cached prefix, evaluate the rest, sample the first token -----------------------
        n_cached = target.reuse_prefix(prompt_ids)
        if n_cached == len(prompt_ids):
            target.truncate(n_cached - 1)
        stats.prompt_cached = target.n_held  # (recurrent state may have gone back to a checkpoint before it)
        stats.prompt_tokens = len(prompt_ids) - stats.prompt_cached
        target.prefill(prompt_ids[len(target.tokens) :])
        drafter.begin(prompt_ids)
        history = list(prompt_ids)
        pending = [pick(target.logits(-1))]
        pending_flags = [False]
        t_first = time.perf_counter()
        stats.time_to_first_token_s = t_first - t_start
        finish = None

        while True:
            # --- commit the tokens this round produced, checking stop conditions token by token -------------
            emitted: list[int] = []
            for tok, from_draft in zip(pending, pending_flags):
                if model.is_eog(tok):
                    finish = "stop"
                    break
                history.append(tok)
                out_ids.append(tok)
                flags.append(from_draft)
                emitted.append(tok)
                text = stream.feed(model.piece_text(tok) if tok in params.shown else model.piece(tok))
                if text:
                    yield TextDelta(text, emitted, from_draft)
                    emitted = []
                if stream.stopped:
                    finish = "stop"
                    break
                if len(out_ids) >= params.max_tokens:
                    finish = "length"
                    break
            stats.n_tokens = len(out_ids)
            stats.decode_seconds = time.perf_counter() - t_first
            if len(target.tokens) > len(history):  # stopped inside an accepted draft
                target.truncate(len(history))
            if finish:
                break
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            room = target.n_ctx - len(history)  # the batch [last, d1..dk] must fit in the context
            if room < 0:
                finish = "length"
                break

            # --- draft ----------------------------------------------------------------------------------------
            # After recurrent state went back to a saved one, this round replays the accepted tokens and drafts
            # nothing (as llama-server does): the state saved before the next draft then holds all of them.
            replaying = target.n_pending > 0
            n_max = 0 if replaying else min(control.next(), room, params.max_tokens - len(out_ids))
            t0 = time.perf_counter()
            if constraint and not replaying and not isinstance(drafter, NoDrafter):  # forced tokens join the draft
                limit = min(MAX_DRAFT, room, params.max_tokens - len(out_ids))
                draft = constrained_draft(drafter, constraint, history, n_max, limit, sp, rng, gate)
                n_max = limit
            else:
                draft = drafter.propose(history, n_max, sp, rng, gate) if n_max > 0 else Draft()
            k = _usable(draft, n_max, params.draft.draft_min, model)
            t1 = time.perf_counter()

            # --- verify [last, d1..dk] in one target batch ----------------------------------------------------
            target.decode([history[-1]] + draft.tokens[:k], n_logits=k + 1, n_speculative=k)
            pending, pending_flags = [], []
            accepted = 0
            for i in range(k + 1):
                logits = target.logits(i)
                if i == k:  # every draft token accepted: the target's own next token comes free
                    pending.append(pick(logits))
                    break
                d = draft.tokens[i]
                if sp.greedy:
                    tok = greedy_of(logits)
                    ok = tok == d
                else:
                    q = draft.probs[i] if draft.probs else None
                    ok, tok = accept_or_resample(dist_of(logits), q, d, rng)
                if constraint:
                    constraint.commit(tok)
                pending.append(tok)
                if not ok:
                    break
                accepted += 1
            pending_flags = [True] * accepted + [False]
            target.truncate(len(history) + accepted)  # drop the rejected draft positions
            t2 = time.perf_counter()

            stats.n_rounds += 1
            stats.n_drafted += k
            stats.n_accepted += accepted
            if draft.forced:
                stats.n_forced += sum(draft.forced[:k])
                stats.n_forced_accepted += sum(draft.forced[:accepted])
            if constraint:
                stats.grammar_seconds = constraint.seconds
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            if not replaying:  # a replay round's cost is not a plain step's
                control.update(k, accepted, t1 - t0, t2 - t1, draft.signals, draft.n_evals, draft.first_s,
                               draft.n_first, draft.forced)
            yield Round(k, accepted, t1 - t0, t2 - t1, replace(stats))  # a snapshot: stats keep changing
    except Cancelled:
        finish = "cancelled"
    finally:
        target.set_cancel(None)

    tail = stream.flush()
    if tail:
        yield TextDelta(tail, [], False)
    stats.n_tokens = len(out_ids)
    if constraint:
        stats.grammar_seconds = constraint.seconds
    yield Done(finish or "stop", stream.text, out_ids, stats, flags)


def _usable(draft: Draft, n_max: int, draft_min: int, model) -> int:
    """How many draft tokens to verify: at most n_max, none past a token the target's vocabulary lacks or past an
    end-of-generation token, and none at all when fewer than --draft-min remain (llama.cpp's rule: a too-short
    draft is not worth a batch)."""
    k = min(len(draft.tokens), n_max)
    for i in range(k):
        tok = draft.tokens[i]
        if tok >= model.n_vocab:
            k = i
            break
        if model.is_eog(tok):
            k = i + 1
            break
    return k if k >= max(draft_min, 1) else 0
