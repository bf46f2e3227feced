"""A grammar applied to one generation: the target's token choices masked by it, exactly, and the runs of tokens
it forces joined to the draft for free.

Exactness: the grammar's state follows the tokens the target commits, and every verified position picks from the
target's logits under the mask of the state the draft has reached there (greedy: the masked argmax; sampling: the
sampling transform over the masked logits is p). A draft token the grammar forbids has p = 0, so it is rejected
like any other the target would not choose; it is never fed to the grammar.
"""
from __future__ import annotations

import time
import warnings
import weakref

import numpy as np

from .drafters import Draft, Drafter, Gate, Wrapper
from .errors import EngineError
from .grammar import Grammar
from .grammar_sandbox import on_big_stack, verdict
from .llama import Model
from .sampling import Dist, Noise, SamplingParams, distribution, greedy_token

_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Model -> llguidance's view of its vocab


def _tokenizer(model: Model):
    """llguidance's tokenizer for a model (about a second for a 262k vocabulary: made once per loaded model), with
    every end-of-generation token as an end the grammar accepts."""
    tok = _tokenizers.get(model)
    if tok is None:
        from llguidance.llamacpp import lltokenizer_from_vocab

        eog = list(model.eog_tokens)
        with warnings.catch_warnings():  # (it calls a llama_cpp function deprecated under another name)
            warnings.simplefilter("ignore", DeprecationWarning)
            tok = lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab, eos_token=eog)
        _tokenizers[model] = tok
    return tok


class Constraint:
    """One generation's grammar state over the target's vocabulary. ``seconds`` is the time spent in the grammar
    (masks, checks, forced tokens), measured."""

    def __init__(self, grammar: Grammar, model: Model):
        from llguidance import LLMatcher

        self.n_vocab = model.n_vocab
        self.eog = frozenset(model.eog_tokens)
        self.tokenizer = _tokenizer(model)
        error = verdict(grammar.definition)  # (cached: a Grammar's own check), never a crash
        if error:
            raise EngineError(f"The grammar cannot be used: {error}")
        # compiling recurses: on a big stack, not the generation thread's (see grammar_sandbox)
        self.matcher = on_big_stack(LLMatcher, self.tokenizer, grammar.definition, log_level=0)
        self.seconds = 0.0
        self.n_masks = 0  # full masks computed (a top token the grammar allows needs none)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise EngineError(f"The grammar failed: {self.matcher.get_error()}")

    # --- the target's choice under the mask ------------------------------------------------------------------
    def allowed(self) -> np.ndarray:
        """Which tokens the grammar allows next (a bool per token)."""
        t0 = time.perf_counter()
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)
        self.n_masks += 1
        self.seconds += time.perf_counter() - t0
        return mask

    def allows(self, token: int) -> bool:
        t0 = time.perf_counter()
        # (validate_tokens answers 0 for an end of generation even where the mask allows it)
        ok = self.matcher.is_accepting() if token in self.eog else self.matcher.validate_tokens([token]) == 1
        self.seconds += time.perf_counter() - t0
        return ok

    def greedy(self, logits: np.ndarray) -> int:
        """The masked argmax (the first of tied maxima, as np.argmax): the plain argmax when the grammar allows it,
        which needs no mask."""
        top = greedy_token(logits)
        if self.allows(top):
            return top
        allowed = np.flatnonzero(self.allowed())
        if not len(allowed):
            raise EngineError("The grammar allows no token here.")
        return int(allowed[np.argmax(logits[allowed])])

    def distribution(self, logits: np.ndarray, sp: SamplingParams) -> Dist:
        """p: the sampling transform over the logits of the tokens the grammar allows. Computed on those logits
        alone, which is the same as over the whole vocabulary with the others at -inf (they drop out of top-k, of
        top-p's sum, of min-p's maximum) but never scans a vocabulary of -inf for the top k of a handful."""
        allowed = np.flatnonzero(self.allowed())
        if not len(allowed):
            raise EngineError("The grammar allows no token here.")
        d = distribution(logits[allowed], sp)
        return Dist(allowed[d.idx], d.p)  # (allowed is ascending: the ids stay in order)

    # --- state ------------------------------------------------------------------------------------------------
    def commit(self, token: int) -> None:
        """Advance past a token the target chose (always one the mask allowed). An end of generation is not fed
        to the grammar: nothing follows it, and llguidance keeps no history entry for it to roll back."""
        if token in self.eog:
            return
        t0 = time.perf_counter()
        self.matcher.consume_token(token)
        self.seconds += time.perf_counter() - t0
        self._check()

    def forced(self) -> list[int]:
        """Tokens spelling the bytes the grammar forces next (keys, quotes, brackets of a schema), as far as the
        grammar accepts them. A proposal: the target verifies them like any drafted token, so a split the model
        would not have chosen costs a rejection, never a change of output."""
        t0 = time.perf_counter()
        forced = self.matcher.compute_ff_bytes()
        tokens = self.tokenizer.tokenize_bytes(forced) if forced else []
        tokens = tokens[: self.matcher.validate_tokens(tokens)] if tokens else []
        self.seconds += time.perf_counter() - t0
        return tokens

    def valid_prefix(self, tokens: list[int]) -> int:
        t0 = time.perf_counter()
        n = self.matcher.validate_tokens(tokens) if tokens else 0
        self.seconds += time.perf_counter() - t0
        return n

    def forces(self) -> bool:
        """Does the grammar force what comes next?"""
        t0 = time.perf_counter()
        forced = bool(self.matcher.compute_ff_bytes())
        self.seconds += time.perf_counter() - t0
        return forced

    def rollback(self, n: int) -> None:
        if n:
            t0 = time.perf_counter()
            self.matcher.rollback(n)
            self.seconds += time.perf_counter() - t0


class Constrained(Wrapper):
    """A drafter under a grammar: the grammar's part of a round, behind the drafter seam. Its draft: the tokens the
    grammar forces, then what the drafter proposes after them (up to ``n_max`` of its own), then the tokens forced
    after those, and so on; forced tokens cost no draft step and do not count against ``n_max``, only against
    ``limit`` (the batch). A drafter whose ``AFTER_FORCED`` is false drafts only where
    nothing is forced before it in the round.

    The grammar follows the drafter token by token and ends its run where it forbids a token, and where it starts
    forcing (its tokens come free, where a draft model would pay a step for each). A token it forbids is kept or
    cut: greedy, cut (the target would reject it); sampling, kept (the target rejects it and draws from the
    residual: cutting it would make the output depend on a rejection that never happened, and the distribution
    would no longer be the target's). The grammar is left where it was.
    """

    AFTER_FORCED = True  # (its own rounds: the inner drafter's AFTER_FORCED decides where that one drafts)

    def __init__(self, drafter: Drafter, constraint: Constraint):
        super().__init__(drafter)
        self.constraint = constraint

    def draft_round(self, history: list[int], n_max: int, limit: int, sp: SamplingParams,
                    rng: Noise, gate: Gate | None) -> Draft:
        drafter, constraint = self.inner, self.constraint
        out = Draft(signals=[] if gate else None)
        consumed = own = calls = 0
        after_forced = drafter.AFTER_FORCED
        allowed: list[bool] = []  # per token of the drafter's current run: did the grammar allow it
        at = rng.at

        def stop(tok: int) -> bool:
            nonlocal consumed
            ok = constraint.allows(tok)
            allowed.append(ok)
            # An end of generation ends the draft, and is never fed to the grammar: llguidance keeps no history entry
            # for it, so rolling it back would take one token too many.
            if not ok or tok in constraint.eog:
                return True
            constraint.commit(tok)
            consumed += 1
            return constraint.forces()

        try:
            while len(out.tokens) < limit:
                forced = constraint.forced()[: limit - len(out.tokens)]
                for tok in forced:
                    constraint.commit(tok)
                    consumed += 1
                    _append(out, tok, None, forced=True)
                budget = min(n_max - own, limit - len(out.tokens))
                if budget <= 0 or (calls and not forced) or (out.tokens and not after_forced):
                    break
                allowed.clear()
                rng.at = at + len(out.tokens)  # (the drafter's tokens follow those drafted or forced so far)
                d = drafter.propose(history + out.tokens, budget, sp, rng, gate, stop)
                calls += 1
                out.source = out.source or d.source
                out.sized = out.sized and d.sized
                own += len(d.tokens)
                if d.n_evals:
                    out.n_evals += d.n_evals - (1 if out.n_evals else 0)  # later calls' first steps: marginal ones
                    out.first_s += d.first_s
                    out.n_first += d.n_first
                n = len(d.tokens)
                assert len(allowed) == n, f"{drafter.name} drafter: each token it proposes goes to stop(), in order"
                forbidden = n and not allowed[-1]
                keep = n - 1 if forbidden and sp.greedy else n
                for i in range(keep):
                    _append(out, d.tokens[i], d.signals[i] if d.signals else None, forced=False)
                if forbidden or (n and d.tokens[-1] in constraint.eog):
                    break
        finally:
            constraint.rollback(consumed)
            rng.at = at
        return out


def _append(draft: Draft, tok: int, signal: float | None, forced: bool) -> None:
    draft.tokens.append(tok)
    draft.forced.append(forced)
    if draft.signals is not None:
        draft.signals.append(signal)
