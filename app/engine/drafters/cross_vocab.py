"""Drafting across vocabularies: a draft model whose tokenizer differs from the target's drafts through text.

The draft continues the conversation in its own tokens: it sees the committed text (the target's tokens rendered
with their special tokens, so chat markers the draft also knows become its own) tokenized in its vocabulary; this
measured better than the conversation in the draft's own chat template (bench/perf_cross_vocab_template.py). Its
proposal goes back as text, re-tokenized in the target's vocabulary together with a short look-behind of committed
text, so a word split across the boundary is handled: only tokens past the look-behind's own tokenization are
proposed, and none when the proposal would change a committed token (as transformers'
``AssistedCandidateGeneratorDifferentTokenizers`` does). The target verifies as with any drafter.

The proposal is deterministic (accepted where it is the target's own draw), so sampled output keeps the target's
exact distribution; greedy output is identical to plain decoding. After verification the draft's cache follows the text
the target committed: the next round re-tokenizes it and keeps the longest common prefix (``reuse_prefix``).
"""
from __future__ import annotations

from ..llama import Context, Model, common_prefix
from ..sampling import Noise, SamplingParams, draft_pick
from .base import Draft, Drafter, Gate, Stop, stop_at
from .draft_model import ModelDrafter, catch_up, prefill_draft


class TextDrafter(Drafter):
    name = "model (as text)"
    label = "draft model (as text)"
    SIGNAL_EDGES = ModelDrafter.SIGNAL_EDGES
    SIGNAL_PRIOR = ModelDrafter.SIGNAL_PRIOR
    LOOK_BEHIND = 4  # committed target tokens re-tokenized with each proposal

    def __init__(self, ctx: Context, target: Model):
        self.ctx = ctx
        self.draft = ctx.model
        self.target = target
        self._ids: list[int] = []  # target tokens whose text is in _text (a leading BOS left out)
        self._ends: list[int] = []  # where each of them ends in _text
        self._text = b""

    # --- the committed text, kept in step with the target's history --------------------------------------------
    def _piece(self, token: int) -> bytes:
        return self.target.piece_text(token)

    def _sync(self, history: list[int]) -> None:
        if self.target.add_bos and history and history[0] == self.target.bos:
            history = history[1:]  # the draft's tokenizer adds its own
        n = common_prefix(self._ids, history)
        del self._ids[n:], self._ends[n:]
        self._text = self._text[: self._ends[-1] if self._ends else 0]
        for tok in history[n:]:
            self._text += self._piece(tok)
            self._ids.append(tok)
            self._ends.append(len(self._text))

    def _draft_ids(self) -> list[int]:
        return self.draft.tokenize(self._text, add_special=True, parse_special=True)

    # --- the Drafter protocol -------------------------------------------------------------------------------
    def begin(self, prompt_ids: list[int]) -> None:
        self._ids, self._ends, self._text = [], [], b""
        self._sync(prompt_ids)
        prefill_draft(self.ctx, self._draft_ids())

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: Noise,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        ctx = self.ctx
        self._sync(history)
        first_s, n_first = catch_up(ctx, self._draft_ids())
        draft = Draft(n_evals=1, first_s=first_s, n_first=n_first)
        tokens: list[int] = []
        for i in range(n_max):
            tok, confident, gap = draft_pick(ctx.logits(-1), self.p_min)
            if not confident or self.draft.is_eog(tok) or (gate is not None and not gate.take(gap)):
                break
            tokens.append(tok)
            if i + 1 == n_max or (gate is not None and not gate.look_further()):
                break
            ctx.decode([tok], n_logits=1, n_speculative=1)
            draft.n_evals += 1
        draft.tokens = self._retokenize(b"".join(self.draft.piece(t) for t in tokens))[:n_max]
        draft.tokens = draft.tokens[: stop_at(draft.tokens, stop)]  # (the target's tokens are known only here)
        return draft

    def _retokenize(self, text: bytes) -> list[int]:
        """The target's tokens for ``text`` following the committed text."""
        if not text:
            return []
        start = self._ends[-self.LOOK_BEHIND - 1] if len(self._ends) > self.LOOK_BEHIND else 0
        behind = self._text[start:]
        before = self.target.tokenize(behind, add_special=False, parse_special=True)
        after = self.target.tokenize(behind + text, add_special=False, parse_special=True)
        if after[: len(before)] != before:
            return []  # the proposal would merge into committed tokens: nothing to propose this round
        return after[len(before) :]
