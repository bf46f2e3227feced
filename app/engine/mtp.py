"""Drafting with a model's own next-token-prediction (MTP, "nextn") layers: no second model.

Qwen3.5/3.6, GLM-4.5+ and DeepSeek V3 GGUFs carry one or more MTP layers after the trunk. Such a layer predicts the
token after next from two inputs: the embedding of token t and the trunk's hidden state at position t - 1. It runs
in its own llama.cpp context (``LLAMA_CONTEXT_TYPE_MTP``) on the target's weights, with its own small cache holding
the MTP layer's attention. Position p of that cache holds (token at p, the target's hidden state at p - 1); the
target keeps those hidden states for every token it evaluates (``Context.keep_hidden``).

Each round: the MTP cache catches up on the positions the target committed since the last round, and the row for
the pending token (the target's newest, not yet evaluated) gives the first draft token; each further token feeds
the MTP layer its own hidden state back. The drafted positions are dropped from the MTP cache afterwards: the
target's hidden states replace them once it has verified them. The target verifies as with any drafter, so greedy
output stays identical to plain decoding and sampled output keeps the target's distribution.
"""
from __future__ import annotations

import ctypes
import time

import llama_cpp.llama_cpp as ll
import numpy as np

from .drafters import Draft, Gate, ModelDrafter, Stop, next_draft_token
from .errors import EngineError
from .events import method_name
from .llama import Context, _failure, _FloatRow, common_prefix, logits_row
from .sampling import SamplingParams


class MtpDrafter:
    name = "mtp"
    SIGNAL_EDGES = ModelDrafter.SIGNAL_EDGES  # the same signal: the draft's top-1 minus top-2 logit
    SIGNAL_PRIOR = ModelDrafter.SIGNAL_PRIOR
    N_BATCH = 64  # catch-up rows per decode (a prompt's rows come in such chunks)
    SHIFT = 0  # the row for the token at p sits at position p + SHIFT of this context's cache
    SEED_ALONE = False  # decode the pending token's row on its own (for a graph that computes every row's logits)
    AFTER_FORCED = False  # drafts from the target's own state for history[-1]: never after tokens it has not seen

    def __init__(self, target: Context, p_min: float = 0.0):
        model = target.model
        if model.n_nextn < 1:
            raise EngineError(f"{model.path.name} has no MTP (next-token-prediction) layers to draft with.")
        self._open(target, model, model.n_embd, p_min)
        target.keep_hidden()

    def _open(self, target: Context, model, n_embd: int, p_min: float, ctx_type=ll.LLAMA_CONTEXT_TYPE_MTP) -> None:
        """A context for ``model``'s drafting layers on the target's (``ctx_other``), and a batch whose rows carry a
        token and an ``n_embd``-wide hidden state."""
        from llama_cpp.llama_cpp_ext import llama_set_embeddings_nextn

        self.target, self.model, self.n_embd, self.p_min = target, model, n_embd, p_min
        self._held: list[int] = []  # the history whose positions this cache covers (position 0 has no row)
        params = ll.llama_context_default_params()
        params.ctx_type = ctx_type
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = self.N_BATCH
        params.n_seq_max = 1
        params.n_outputs_max = 1  # one draft row per step
        params.n_threads = params.n_threads_batch = target.n_threads
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # (as the target's: a shared cache's layout)
        params.no_perf = True
        params.ctx_other = target.ptr
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise _failure(f"llama.cpp could not create an MTP context for {model.path.name}",
                           "Try a smaller context (--ctx).")
        self.ptr = ptr
        self.mem = ll.llama_get_memory(ptr)
        llama_set_embeddings_nextn(ptr, True, True)  # the layer's own hidden state, for the next step
        self._batch = ll.llama_batch_init(self.N_BATCH, n_embd, 1)  # rows carry a hidden state...
        self._tokens = (ll.llama_token * self.N_BATCH)()  # ...and a token (llama.cpp reads both)
        self._batch.token = ctypes.cast(self._tokens, ctypes.POINTER(ll.llama_token))
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(self.N_BATCH * n_embd,)).reshape(-1, n_embd)

    def set_threads(self, n: int) -> None:
        ll.llama_set_n_threads(self.ptr, n, n)

    def clear(self) -> None:
        """Forget the cached conversation (as the target does on reset)."""
        ll.llama_memory_clear(self.mem, True)
        self._held = []

    # --- the Drafter protocol ---------------------------------------------------------------------------------
    def begin(self, prompt_ids: list[int]) -> None:
        pass  # propose() catches up from the target's hidden states, prompt included

    def _inputs(self) -> dict[int, np.ndarray]:
        """What the target keeps for this drafter, by position: the hidden state its MTP layers read."""
        return self.target.hidden

    def _states(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The states the rows carry, from the target's inputs (for MTP layers, the same)."""
        return inputs

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: np.random.Generator,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        n_past = len(history) - 1  # the target holds history[:n_past]; history[-1] is pending
        store = self._inputs()
        keep = common_prefix(self._held, history[:n_past])
        ll.llama_memory_seq_rm(self.mem, 0, max(keep + self.SHIFT, 0), -1)
        # Rows (token at p, what the target left at p - 1) for the committed positions, then the pending token's row,
        # whose output is the first draft token. Only the rows known back from the pending one are made: positions the
        # target evaluated without keeping anything (a cached prompt prefix after a reset, a turn with speculation
        # off) are left out, and the drafter attends to what it has; the target still decides.
        ps = list(range(max(keep, 1), n_past + 1))
        inputs = [store.get(p - 1) for p in ps]
        i = len(ps)
        while i and inputs[i - 1] is not None:
            i -= 1
        if i == len(ps):
            self._held = history[:keep]  # (what the cache still holds)
            return Draft()
        self._held = history[:n_past]
        if i:  # a gap after the rows the cache holds: it starts over from the known ones (positions must follow)
            ll.llama_memory_seq_rm(self.mem, 0, 0, -1)
        t0 = time.perf_counter()
        rows = list(zip([p + self.SHIFT for p in ps[i:]], [history[p] for p in ps[i:]], self._states(inputs[i:])))
        n = len(rows) - self.SEED_ALONE
        chunks = [rows[j : min(j + self.N_BATCH, n)] for j in range(0, n, self.N_BATCH)] + [rows[n:]] * self.SEED_ALONE
        for k, chunk in enumerate(chunks):
            self._decode(chunk, output_last=k == len(chunks) - 1)
        first_s = time.perf_counter() - t0
        gate = gate if sp.greedy else None  # (the signal is the greedy pick's logit gap)
        draft = Draft(probs=None if sp.greedy else [], signals=[] if gate else None, n_evals=1, first_s=first_s,
                      n_first=len(rows))
        try:
            self._chain(draft, n_max, sp, rng, gate, stop, lambda k: n_past + 1 + k + self.SHIFT)
        finally:
            ll.llama_memory_seq_rm(self.mem, 0, n_past + self.SHIFT, -1)  # drafted rows: the target's replace them
            for p in [p for p in store if p != n_past - 1]:  # the next round needs the pending row's input only
                del store[p]
        return draft

    def _chain(self, draft: Draft, n_max: int, sp: SamplingParams, rng: np.random.Generator, gate: Gate | None,
               stop: Stop | None, position) -> None:
        """Draft from the row just decoded, each further token fed back with the layer's own hidden state, at
        ``position(i)`` for the i-th."""
        for i in range(n_max):
            tok = next_draft_token(draft, self._logits(), sp, rng, self.p_min, gate)
            if tok is None or (stop and stop(tok)) or i + 1 == n_max or (gate and not gate.look_further()):
                break
            self._decode([(position(i), tok, self._own_hidden())], output_last=True)
            draft.n_evals += 1

    # --- llama.cpp --------------------------------------------------------------------------------------------
    def _decode(self, rows: list[tuple[int, int, np.ndarray]], output_last: bool) -> None:
        b = self._batch
        for j, (pos, tok, h) in enumerate(rows):
            self._tokens[j] = tok
            self._embd[j] = h
            b.pos[j] = pos
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = 0
            b.logits[j] = 1 if output_last and j == len(rows) - 1 else 0
        b.n_tokens = len(rows)
        rc = ll.llama_decode(self.ptr, b)
        if rc != 0:
            raise _failure(f"llama_decode failed in the {method_name(self.name)} drafter's context (code {rc})",
                           "The context may be full.")
        ll.llama_synchronize(self.ptr)
        self._last = len(rows) - 1

    def _logits(self) -> np.ndarray:
        return logits_row(self.ptr, self._last, self.model.n_vocab)

    def _own_hidden(self) -> np.ndarray:
        from llama_cpp.llama_cpp_ext import llama_get_embeddings_nextn_ith

        addr = ctypes.cast(llama_get_embeddings_nextn_ith(self.ptr, self._last), ctypes.c_void_p).value
        return np.asarray(_FloatRow(addr, self.n_embd)).copy()

    def close(self) -> None:
        if self.ptr:
            self._batch.token = ctypes.POINTER(ll.llama_token)()  # ours, not llama_batch_init's
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ptr)
            self.ptr = None
