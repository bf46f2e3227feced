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

import numpy as np

from .constraint import Constrained, Constraint
from .draft_control import MAX_DRAFT, DraftLength, DraftParams
from .drafters import Draft, Drafter
from .errors import EngineError
from .events import Done, Event, PromptProgress, Round, Stats, TextDelta
from .grammar import Grammar
from .llama import Cancelled, Context, Model
from .logprobs import MAX_TOP, TokenLogprob, certain, from_dist, from_logits
from .measured import Measured
from .sampling import Noise, SamplingParams, distribution, greedy_token, sample
from .text_stream import TextStream


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    draft: DraftParams = field(default_factory=DraftParams)
    grammar: Grammar | None = None  # the answer follows it (a JSON schema, GBNF...)
    shown: frozenset[int] = frozenset()  # special tokens written out in the text (a tool-call marker: [TOOL_CALLS])
    # The target's log-probability of each token and of its top N alternatives (0 to 20); None: not computed.
    logprobs: int | None = None
    post_sampling_probs: bool = False  # ...of the sampling chain's distribution rather than the raw logits'
    prompt_progress: bool = False  # PromptProgress events while the prompt is evaluated, batch by batch

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise EngineError(f"Invalid --max-tokens {self.max_tokens}: it must be at least 1.")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP:
            raise EngineError(f"Invalid logprobs {self.logprobs}: ask for 0 to {MAX_TOP} alternatives per token.")
        self.sampling.validate()
        self.draft.validate()


def speculative_generate(
    target: Context,
    drafter: Drafter,
    prompt_ids: list[int],
    params: GenerationParams,
    cancel: threading.Event | None = None,
    measured: Measured | None = None,
) -> Iterator[Event]:
    """``measured``: what rounds cost with this drafter, from earlier answers (updated by this one)."""
    sp = params.sampling
    rng = Noise(sp.seed)
    control = DraftLength(params.draft, drafter.SIGNAL_EDGES, drafter.SIGNAL_PRIOR, measured,
                          drafter.SIGNAL_GROWS)
    gate = control if params.draft.adaptive else None
    stats = Stats(drafter=drafter.name, seed=-1 if sp.greedy else rng.seed)
    if not prompt_ids:
        raise EngineError("The prompt is empty.")
    if len(prompt_ids) >= target.n_ctx:
        raise EngineError(
            f"The prompt is {len(prompt_ids)} tokens but the context holds {target.n_ctx}. "
            "Shorten the prompt or raise the context size (--ctx)."
        )
    choose = Choice(target.model, params, rng)
    if choose.constraint and drafter.speculates:  # forced tokens join the draft
        drafter = Constrained(drafter, choose.constraint)
    out = Output(target.model, params, list(prompt_ids))
    finish = None
    t_start = time.perf_counter()
    target.set_cancel(cancel)
    try:
        yield from _prefill(target, prompt_ids, stats, params.prompt_progress, t_start)
        drafter.begin(prompt_ids)
        rng.at = len(prompt_ids)
        pending, accepted, draft = [choose.pick(target.logits(-1))], 0, Draft()
        t_first = time.perf_counter()
        stats.time_to_first_token_s = t_first - t_start
        t_end = None  # when the last round ended: the time until the next starts is a round's cost too
        while True:
            yield from out.commit(pending, accepted, choose.reported(), draft.source or drafter.name)
            stats.n_tokens = len(out.ids)
            stats.decode_seconds = time.perf_counter() - t_first
            if len(target.tokens) > len(out.history):  # stopped inside an accepted draft
                target.truncate(len(out.history))
            room = min(target.n_ctx - len(out.history), params.max_tokens - len(out.ids))  # [last, d1..dk] must fit
            finish = out.finish or ("cancelled" if cancel is not None and cancel.is_set() else None) or (
                "length" if room < 0 else None)
            if finish:
                break
            # After recurrent state went back to a saved one, a round replays the accepted tokens and drafts nothing
            # (as llama-server does): the state saved before the next draft then holds all of them. So does one where
            # the drafter reads on in a long prompt (its time is drafting time): the target answers plainly meanwhile.
            t0 = time.perf_counter()
            replaying = target.n_pending > 0 or drafter.read_on()
            limit = 0 if replaying else min(MAX_DRAFT, target.n_batch - 1, room)  # (one batch verifies a draft)
            rng.at = len(out.history)  # the next token's position: where this round's draws are keyed
            draft = drafter.draft_round(out.history, 0 if replaying else min(control.next(room), room), limit, sp, rng,
                                        gate)
            k = _usable(draft, limit, params.draft.draft_min, target.model)
            t1 = time.perf_counter()
            pending, accepted = _verify(target, out.history, draft, k, choose)
            t2 = time.perf_counter()
            if k:
                drafter.accept(accepted)
            _count(stats, draft, k, accepted, t1 - t0, t2 - t1, choose.constraint)
            if not replaying:  # a replay round's cost is not a plain step's
                control.record(draft, k, accepted, t1 - t0, t2 - t1, None if t_end is None else t0 - t_end)
            t_end = None if replaying else t2
            yield Round(k, accepted, t1 - t0, t2 - t1, replace(stats))  # a snapshot: stats keep changing
    except Cancelled:
        finish = "cancelled"
    finally:
        target.set_cancel(None)

    tail = out.stream.flush()
    if tail:  # (text held back for a stop string that never came: its tokens come with it)
        yield TextDelta(tail, out.unshown, False, out.logprobs_of(out.unshown))
    stats.n_tokens = len(out.ids)
    if choose.constraint:
        stats.grammar_seconds = choose.constraint.seconds
    yield Done(finish or "stop", out.stream.text, out.ids, stats, out.flags, out.logprobs)


def _prefill(target: Context, prompt_ids: list[int], stats: Stats, progress: bool,
             t_start: float) -> Iterator[PromptProgress]:
    """Reuse the cached prefix and evaluate the rest, the last token with logits; with ``progress``, say how far
    it got before the first batch and after each."""
    n_cached = target.reuse_prefix(prompt_ids)
    if n_cached == len(prompt_ids):
        target.truncate(n_cached - 1)
    stats.prompt_cached = target.n_held  # (recurrent state may have gone back to a checkpoint before it)
    stats.prompt_tokens = len(prompt_ids) - stats.prompt_cached
    rest = prompt_ids[len(target.tokens) :]
    if not progress:
        target.prefill(rest)
        return
    n = len(prompt_ids)
    yield PromptProgress(n, stats.prompt_cached, stats.prompt_cached, 0.0)
    for done in target.prefill_steps(rest):
        yield PromptProgress(n, stats.prompt_cached, n - len(rest) + done, time.perf_counter() - t_start)


class Choice:
    """The target's choice of a token from its logits: greedy or sampled, under the grammar's mask where one
    constrains the answer (the grammar advanced past each token chosen), and, when asked, the target's
    log-probabilities at each position a token was committed from (``reported``)."""

    def __init__(self, model: Model, params: GenerationParams, rng: Noise):
        self.sp, self.rng = params.sampling, rng
        self.constraint = Constraint(params.grammar, model) if params.grammar else None
        self.bias = logit_bias_for(model, params.sampling)
        self.n_top, self.post_sampling = params.logprobs, params.post_sampling_probs
        self._reported: list[TokenLogprob] = []

    def _biased(self, logits: np.ndarray) -> np.ndarray:
        if self.bias is None:
            return logits
        ids, values = self.bias
        out = logits.astype(np.float32, copy=True)  # (the context's own buffer stays as llama.cpp wrote it)
        np.add.at(out, ids, values)
        return out

    def greedy(self, logits: np.ndarray) -> int:
        logits = self._biased(logits)
        return self.constraint.greedy(logits) if self.constraint else greedy_token(logits)

    def distribution(self, logits: np.ndarray):
        logits = self._biased(logits)
        return self.constraint.distribution(logits, self.sp) if self.constraint else distribution(logits, self.sp)

    def commit(self, tok: int, logits: np.ndarray) -> int:
        """``tok``, chosen from ``logits``, is committed: the grammar advances, its probabilities are noted."""
        if self.n_top is not None:  # (before the grammar advances: its mask is the one the token was chosen under)
            self._reported.append(self._logprob(tok, logits))
        if self.constraint:
            self.constraint.commit(tok)
        return tok

    def _logprob(self, tok: int, logits: np.ndarray) -> TokenLogprob:
        if not self.post_sampling:
            return from_logits(logits, tok, self.n_top)
        return certain(tok, self.n_top) if self.sp.greedy else from_dist(self.distribution(logits), tok, self.n_top)

    def reported(self) -> list[TokenLogprob] | None:
        """The probabilities noted since the last call, one per token committed (None: not asked for)."""
        if self.n_top is None:
            return None
        out, self._reported = self._reported, []
        return out

    def pick(self, logits: np.ndarray, offset: int = 0) -> int:
        """The target's token at position ``rng.at + offset``."""
        tok = self.greedy(logits) if self.sp.greedy else sample(self.distribution(logits), self.rng, offset)
        return self.commit(tok, logits)


def logit_bias_for(model: Model, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray] | None:
    """The biases to add to the target's logits (token ids, values), or None: the request's, and with ignore_eos a
    ban on every end-of-generation token."""
    pairs = list(sp.logit_bias) + ([(t, -np.inf) for t in model.eog_tokens] if sp.ignore_eos else [])
    if not pairs:
        return None
    if (bad := next((t for t, _ in pairs if t >= model.n_vocab), None)) is not None:
        raise EngineError(f"Invalid logit bias token {bad}: this model's vocabulary has {model.n_vocab} tokens.")
    return np.array([t for t, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.float32)


def _verify(target: Context, history: list[int], draft: Draft, k: int, choose: Choice) -> tuple[list[int], int]:
    """Verify [last, d1..dk] in one target batch: the tokens the round commits (the accepted draft tokens, then the
    target's own) and how many draft tokens were accepted. Rejected positions leave the cache at once.

    At each position the target picks its own token (greedy, or its draw: sampling.py) and a draft token is
    accepted exactly when it is that token, so every token committed is the one plain decoding would have made."""
    target.decode([history[-1]] + draft.tokens[:k], n_logits=k + 1, n_speculative=k)
    pending = []
    for i in range(k + 1):
        pending.append(choose.pick(target.logits(i), i))
        if i == k or pending[-1] != draft.tokens[i]:  # (i == k: all accepted, the target's next token comes free)
            break
    accepted = len(pending) - 1
    target.truncate(len(history) + accepted)  # drop the rejected draft positions
    return pending, accepted


def _count(stats: Stats, draft: Draft, k: int, accepted: int, draft_s: float, verify_s: float,
           constraint: Constraint | None) -> None:
    stats.n_rounds += 1
    stats.n_drafted += k
    stats.n_accepted += accepted
    if draft.forced:
        stats.n_forced += sum(draft.forced[:k])
        stats.n_forced_accepted += sum(draft.forced[:accepted])
    if constraint:
        stats.grammar_seconds = constraint.seconds
    stats.draft_seconds += draft_s
    stats.verify_seconds += verify_s
    if draft.source and k:  # one of several drafters made it: what each contributed (a new dict: Rounds hold copies)
        rounds, drafted, acc = stats.by_drafter.get(draft.source, (0, 0, 0))
        stats.by_drafter = {**stats.by_drafter, draft.source: (rounds + 1, drafted + k, acc + accepted)}


class Output:
    """The answer as it is committed: the history the drafters see, the tokens and their provenance, the text with
    its stop strings, and why it ended (an end-of-generation token, a stop string, --max-tokens)."""

    def __init__(self, model: Model, params: GenerationParams, history: list[int]):
        self.model, self.params, self.history = model, params, history
        self.ids: list[int] = []
        self.flags: list[bool] = []  # per token: from an accepted draft
        self.stream = TextStream(params.stop)
        self.finish: str | None = None
        self.unshown: list[int] = []  # tokens whose text is not whole yet (across rounds): the next TextDelta's
        self.logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []  # one per id, if asked

    def logprobs_of(self, tokens: list[int]) -> list[TokenLogprob] | None:
        """The probabilities of the last ``len(tokens)`` ids (None: not asked for)."""
        return None if self.logprobs is None else self.logprobs[len(self.logprobs) - len(tokens):]

    def commit(self, pending: list[int], accepted: int, logprobs: list[TokenLogprob] | None,
               drafter: str = "") -> Iterator[TextDelta]:
        """Commit a round's tokens (its first ``accepted`` came from the draft, which ``drafter`` made; ``logprobs``:
        theirs, if asked), checking the stop conditions token by token; text as it becomes whole."""
        for i, tok in enumerate(pending):
            from_draft = i < accepted
            if self.model.is_eog(tok):
                self.finish = "stop"
                return
            self.history.append(tok)
            self.ids.append(tok)
            self.flags.append(from_draft)
            self.unshown.append(tok)
            if self.logprobs is not None:
                self.logprobs.append(logprobs[i])
            shown = self.model.piece_text(tok) if tok in self.params.shown else self.model.piece(tok)
            text = self.stream.feed(shown)
            if text:
                yield TextDelta(text, self.unshown, from_draft, self.logprobs_of(self.unshown),
                                drafter if from_draft else "")
                self.unshown = []
            if self.stream.stopped:
                self.finish = "stop"
                return
            if len(self.ids) >= self.params.max_tokens:
                self.finish = "length"
                return


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
