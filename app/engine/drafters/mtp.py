"""Drafting with a model's own next-token-prediction (MTP, "nextn") layers: no second model.

Qwen3.5/3.6, GLM-4.5+ and DeepSeek V3 GGUFs carry one or more MTP layers after the trunk. Such a layer predicts the
token after next from two inputs: the embedding of token t and the trunk's hidden state at position t - 1. It runs
in its own llama.cpp context (``LLAMA_CONTEXT_TYPE_MTP``) on the target's weights, with its own small cache holding
the MTP layer's attention. Position p of that cache holds (token at p, the target's hidden state at p - 1); the
target keeps those hidden states for every token it evaluates (``llama.heads.HiddenStates``).

Each round: the MTP cache catches up on the positions the target committed since the last round, and the row for
the pending token (the target's newest, not yet evaluated) gives the first draft token; each further token feeds
the MTP layer its own hidden state back. The drafted positions are dropped from the MTP cache afterwards: the
target's hidden states replace them once it has verified them. The target verifies as with any drafter, so greedy
output stays identical to plain decoding and sampled output keeps the target's distribution.

Some uploads ship the MTP layers as a file of their own beside a model converted without them
(convert_hf_to_gguf.py ``--mtp`` / ``--no-mtp``: ``mtp-*.gguf``, in unsloth's ``MTP/`` folder). ``MtpFileDrafter``
runs that file's layers in the same way, on the target's hidden states (llama.cpp: ``--spec-type draft-mtp -md``).
"""
from __future__ import annotations

import time
from bisect import bisect_left
from pathlib import Path

import numpy as np

from ..errors import EngineError
from ..gguf_file import GgufInfo, read_info
from ..llama import Context, Model, common_prefix
from ..llama.heads import HeadContext, HiddenStates, captured
from ..sampling import Noise, SamplingParams
from .base import Draft, Drafter, Gate, Stop
from .draft_model import ModelDrafter, next_draft_token


class MtpDrafter(Drafter):
    name = "mtp"
    label = "MTP"
    SIGNAL_EDGES = ModelDrafter.SIGNAL_EDGES  # the same signal: the draft's top-1 minus top-2 logit
    SIGNAL_PRIOR = ModelDrafter.SIGNAL_PRIOR
    N_BATCH = 64  # catch-up rows per decode (a prompt's rows come in such chunks)
    SHIFT = 0  # the row for the token at p sits at position p + SHIFT of this context's cache
    SEED_ALONE = False  # decode the pending token's row on its own (for a graph that computes every row's logits)
    AFTER_FORCED = False  # drafts from the target's own state for history[-1]: never after tokens it has not seen
    READS_TEXT = False  # the target's states after an image saw it (its positions make no rows here: ``_at``)

    def __init__(self, target: Context):
        model = target.model
        if model.n_nextn < 1:
            raise EngineError(f"{model.path.name} has no MTP (next-token-prediction) layers to draft with.")
        self._open(target, model, model.n_embd, mtp_type=True)
        self.capture = captured(target, HiddenStates)

    @classmethod
    def kind(cls, info: GgufInfo) -> type[MtpDrafter]:
        """The drafter a head file of this class's architecture is (one class per architecture)."""
        return cls

    @staticmethod
    def needs(head: GgufInfo) -> str:
        """What this head needs of its target beyond its architecture, in words ('': nothing to add)."""
        return ""

    @staticmethod
    def pair_problems(target: GgufInfo, head: GgufInfo) -> list[str]:
        """Why this head cannot draft for ``target``, from the two headers: the engine refuses it before loading
        either file (``Pair``), and the pair check and the Hub's advice say the same (every head class has one)."""
        return []

    def _open(self, target: Context, model: Model, n_embd: int, mtp_type: bool) -> None:
        """A context for ``model``'s drafting layers on the target's, whose rows carry a token and an ``n_embd``-wide
        hidden state."""
        self.target, self.model = target, model
        self._held: list[int] = []  # the history whose positions this cache covers (position 0 has no row)
        self._images: list[int] = []  # the prompt's image positions (an answer has none)
        self.ctx = HeadContext(target, model, n_embd, self.N_BATCH, mtp_type, self.label)

    def set_threads(self, n: int) -> None:
        self.ctx.set_threads(n)

    def clear(self) -> None:
        self.ctx.clear()
        self._held = []

    def begin(self, prompt_ids: list[int]) -> None:
        self._images = [p for p, tok in enumerate(prompt_ids) if tok < 0]

    def _at(self, p: int) -> int:
        """Where the row for history[p] sits in this cache: image positions have no token to make a row of, so they
        take no place (the first row after an image carries the state of its last position, which saw it all)."""
        return p - bisect_left(self._images, p) + self.SHIFT

    def _states(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The states the rows carry, from the target's inputs (for MTP layers, the same)."""
        return inputs

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: Noise,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        n_past = len(history) - 1  # the target holds history[:n_past]; history[-1] is pending
        store = self.capture.rows
        keep = common_prefix(self._held, history[:n_past])
        self.ctx.drop_from(self._at(keep))
        # Rows (token at p, what the target left at p - 1) for the committed positions, then the pending token's row,
        # whose output is the first draft token. Only the rows known back from the pending one are made: positions the
        # target evaluated without keeping anything (a cached prompt prefix after a reset, a turn with speculation
        # off) are left out, and the drafter attends to what it has; the target still decides.
        ps = [p for p in range(max(keep, 1), n_past + 1) if history[p] >= 0]
        inputs = [store.get(p - 1) for p in ps]
        i = len(ps)
        while i and inputs[i - 1] is not None:
            i -= 1
        if i == len(ps):
            self._held = history[:keep]  # (what the cache still holds)
            return Draft()
        self._held = history[:n_past]
        if i:  # a gap after the rows the cache holds: it starts over from the known ones (positions must follow)
            self.ctx.drop_from(0)
        t0 = time.perf_counter()
        rows = list(zip([self._at(p) for p in ps[i:]], [history[p] for p in ps[i:]], self._states(inputs[i:])))
        n = len(rows) - self.SEED_ALONE
        chunks = [rows[j : min(j + self.N_BATCH, n)] for j in range(0, n, self.N_BATCH)] + [rows[n:]] * self.SEED_ALONE
        for k, chunk in enumerate(chunks):
            self.ctx.decode(chunk, output_last=k == len(chunks) - 1)
        first_s = time.perf_counter() - t0
        gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
        draft = Draft(signals=[] if gate else None, n_evals=1, first_s=first_s, n_first=len(rows))
        try:
            self._chain(draft, n_max, sp, rng, gate, stop, lambda k: self._at(n_past) + 1 + k)
        finally:
            self.ctx.drop_from(self._at(n_past))  # drafted rows: the target's replace them
            for p in [p for p in store if p != n_past - 1]:  # the next round needs the pending row's input only
                del store[p]
        return draft

    def _chain(self, draft: Draft, n_max: int, sp: SamplingParams, rng: Noise, gate: Gate | None,
               stop: Stop | None, position) -> None:
        """Draft from the row just decoded, each further token fed back with the layer's own hidden state, at
        ``position(i)`` for the i-th."""
        for i in range(n_max):
            tok = next_draft_token(draft, self.ctx.logits(), sp, rng, self.p_min, gate)
            if tok is None or (stop and stop(tok)) or i + 1 == n_max or (gate and not gate.look_further()):
                break
            self.ctx.decode([(position(i), tok, self.ctx.own_hidden())], output_last=True)
            draft.n_evals += 1

    def close(self) -> None:
        self.ctx.close()


def side_file_problems(target: GgufInfo, layers: GgufInfo) -> list[str]:
    """Why the MTP layers of the side file ``layers`` cannot draft for ``target`` (empty: they can), from the two
    headers. They read the target's hidden states and tokens, so width and vocabulary must match; a file made for
    another depth of trunk belongs to another model (its drafts would be near guesses: exact, but slow)."""
    t, d = target, layers
    if t.architecture != d.architecture:
        return [f"it holds the MTP layers of a {d.architecture} model, the target is {t.architecture}"]
    problems = []
    if t.n_embd != d.n_embd:
        problems.append(f"they read hidden states of {d.n_embd:,} values, the target's are {t.n_embd:,} wide")
    if t.n_vocab != d.n_vocab:
        problems.append(f"its vocabulary has {d.n_vocab:,} tokens, the target's {t.n_vocab:,}")
    if (trunk := d.n_layer - d.nextn_layers) != t.n_layer - t.nextn_layers:
        problems.append(f"they follow a trunk of {trunk} layers, the target has {t.n_layer - t.nextn_layers} "
                        "(a file made for another model)")
    return problems


class MtpFileDrafter(MtpDrafter):
    """The target's MTP layers from a file of their own (see the module's notes)."""

    # As a head given for the draft (-md): known by its tensors, not its architecture (the target's); the method
    # that picks it besides the draft model's, and how the pair check names it
    ARCH, METHOD = "", MtpDrafter.name
    DESCRIBED, READS = "a side file of a model's MTP layers", "the target's hidden states"

    def __init__(self, target: Context, layers: Model):
        self._open(target, layers, target.model.n_embd, mtp_type=True)
        self.capture = captured(target, HiddenStates)

    @staticmethod
    def target_problem(arch: str) -> str:
        return ""

    pair_problems = staticmethod(side_file_problems)

    @staticmethod
    def made_for(target: Path, other: Path) -> bool:
        """Is ``other`` a side file of MTP layers that can draft for ``target``?"""
        layers = read_info(other)
        return layers.only_mtp and not side_file_problems(read_info(target), layers)
