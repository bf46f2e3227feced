"""The engine: a pair loaded once, generation with any drafter, one at a time, and what the pair costs."""
from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from .costs import Costs, measure
from .drafters import OFF, Drafter, ModelDrafter, registry
from .errors import EngineError, ModelsUnloaded
from .events import Done, Event, Stats
from .fair_lock import FairLock
from .images import for_images, has_images
from .llama import Model, ModelSettings, Projector, default_threads, supports_gpu_offload
from .loop import GenerationParams, logit_bias_for, speculative_generate
from .measured import AcceptanceMemory, Measured, SpeedLog
from .pair import Loaded, LoadedPair
from .speedup import Ceiling
from .threads import RECHECK_S, ThreadChooser


# A plain answer's tokens/s is kept as the GPU's speed (SpeedLog) from this many tokens: a short one's rate is
# mostly its first steps' (llama.cpp's CUDA graphs are captured on the first ones)
PLAIN_SPEED_MIN_TOKENS = 32


class Engine:
    """Owns the llama.cpp models and contexts. One generation at a time (others wait on the lock), and the KV
    caches persist between generations so a chat turn only evaluates what is new."""

    def __init__(self, target: ModelSettings, draft: ModelSettings | None = None, mmproj: Path | None = None,
                 mmproj_found: bool = False, memory: AcceptanceMemory | None = None, speeds: SpeedLog | None = None):
        """``mmproj``: the target's vision projector; ``mmproj_found``: found beside it, not asked for, so one that
        does not fit the target is left out (``projector_problem`` says why) rather than failing the load;
        ``memory``: where how each drafter's tokens fared on this pair is kept across launches; ``speeds``: where
        plain decoding's speed is kept when the target runs wholly on a GPU."""
        self._lock = FairLock()  # one generation at a time, in the order they asked
        self._pair: LoadedPair | None = LoadedPair(target, draft, mmproj, mmproj_found)
        self._threads = ThreadChooser(default_threads())
        self._measured: dict[tuple[str, int], Measured] = {}  # see measured.Measured
        self._memory = memory
        self._speeds = speeds
        self._kept: set[str] = set()  # drafters that started from a profile kept by an earlier launch
        self._recalled: set[str] = set()  # drafters whose kept profile was looked up since loading

    # --- the loaded pair ------------------------------------------------------------------------------------
    @property
    def target(self) -> Loaded | None:
        return self._pair.target if self._pair else None

    @property
    def draft(self) -> Loaded | None:
        """A draft model with a context of its own (None for a head, which drafts through the target's)."""
        return self._pair.draft if self._pair else None

    @property
    def ready(self) -> bool:
        """Whether it answers now (a worker loading its pair again after a crash does not)."""
        return self._pair is not None

    @property
    def has_draft_context(self) -> bool:
        return self.draft is not None

    @property
    def cross_vocab(self) -> list[str]:
        """Why the draft model cannot share the target's token ids (empty: it can); then it drafts as text."""
        return self._pair.cross_vocab

    @property
    def model(self) -> Model:
        self._check_loaded()
        return self._pair.target.model

    @property
    def n_ctx(self) -> int:
        return self._pair.target.ctx.n_ctx

    @property
    def draft_model(self) -> Model | None:
        """The pair's second model: a draft model, or a head (Gemma 4's assistant, EAGLE-3, a block draft)."""
        return self._pair.draft_model

    @property
    def head(self) -> tuple[str, str] | None:
        """A head given as the draft: (its drafter's name, the method besides the draft model's that picks it)."""
        head = self._pair.head
        return (head.name, head.METHOD) if head else None

    @property
    def projector(self) -> Projector | None:
        """The target's vision projector (--mmproj): prompts with images are tokenized by it."""
        return self._pair.projector if self._pair else None

    def detokenize(self, ids: list[int]) -> str:
        return self.model.detokenize(ids)

    # --- generation -----------------------------------------------------------------------------------------
    @property
    def drafters(self) -> tuple[str, ...]:
        """The methods this pair can use, its default first: the draft model (or head), else the target's own MTP
        layers, else prompt lookup. A head answers to the draft model's method and to its own."""
        pair = self._pair
        return registry.usable(pair.target.model, pair.head, pair.draft is not None)

    def check_drafter(self, kind: str) -> None:
        """A clear refusal for a method (or any of a chain's) this pair cannot use, naming those it can."""
        for part in registry.parts(kind):
            if registry.method_of(part) not in self.drafters:
                raise EngineError(registry.refusal(part, self._pair.target.model, self.drafters))

    def make_drafter(self, kind: str, params: GenerationParams) -> Drafter:
        """The drafter ``kind`` names (a method, an n-gram kind, or a chain of them), for this pair."""
        self.check_drafter(kind)
        return registry.make(kind, self._pair, params.draft)

    def check_logit_bias(self, sampling) -> None:
        """A logit bias on a token outside the target's vocabulary is refused before anything runs."""
        logit_bias_for(self.model, sampling)

    def speculation(self, kind: str) -> str:
        """How the pair speculates with this method, in words (the API's model list shows it)."""
        kind = kind if registry.runs_on(kind, self.drafters) else self.drafters[0]
        pair = self._pair
        return registry.speculation(kind, pair.target.model, pair.head, pair.draft.model if pair.draft else None)

    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        drafter: str | Drafter = ModelDrafter.name,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Stream events for one generation. Validates everything before the first token is computed.

        ``drafter`` names a method of the registry or is any ``Drafter``.
        """
        params = params or GenerationParams()
        params.validate()
        self._check_loaded()
        self.check_logit_bias(params.sampling)
        d = self.make_drafter(drafter, params) if isinstance(drafter, str) else drafter
        if has_images(prompt_ids):
            d = self._with_images(d)
        return self._run(d, prompt_ids, params, cancel)

    def _with_images(self, d: Drafter) -> Drafter:
        """A drafter for a prompt with images (``images.for_images``)."""
        if self.projector is None:
            raise EngineError(f"{self.model.path.name} takes no images: load its projector (--mmproj)."
                              + (f" ({self._pair.projector_problem})" if self._pair.projector_problem else ""))
        return for_images(d)

    def _check_loaded(self) -> None:
        if self._pair is None:
            raise ModelsUnloaded("The models were unloaded (another pair was loaded) while this request waited for "
                                 "its turn: send it again.")

    def _run(self, d, prompt_ids, params, cancel) -> Iterator[Event]:
        # Wait for the turn, but leave the queue the moment this generation is cancelled (a client that gave up, a
        # shutdown): an abandoned request must not cost the ones behind it a whole answer.
        if not self._lock.acquire(cancel):
            yield Done("cancelled", "", [], Stats(drafter=d.name))
            return
        try:
            self._check_loaded()  # closed while this generation waited: its drafter's contexts are gone too
            if self.draft:  # the draft's prompt prefill can be long too: let cancel interrupt it
                self.draft.ctx.set_cancel(cancel)
            try:
                self._choose_threads()
                measured = self._measured_for(d.name)
                try:
                    for event in speculative_generate(self._pair.target.ctx, d, prompt_ids, params, cancel, measured):
                        if isinstance(event, Done):  # (before it is handed on)
                            if params.draft.remember:
                                self._remember(prompt_ids, event, params.draft.scope)
                            self._keep_speed(d, params, event)
                        yield event
                        if self._threads.since_last_look >= RECHECK_S:
                            self._choose_threads()
                finally:
                    if self._memory and measured.judged:
                        self._memory.keep(d.name, {**measured.profile(), "offload": self._offload()})
            finally:
                if self.draft:
                    self.draft.ctx.set_cancel(None)
        finally:
            self._lock.release()

    def _keep_speed(self, d: Drafter, params: GenerationParams, done: Done) -> None:
        """A plain answer (speculation off, nothing but the tokens asked of it) made with the target wholly on a GPU
        gives that GPU's speed for this target: kept (``speeds``), for the Models view's expectations of others."""
        s = done.stats
        plain = d.name == OFF and params.grammar is None and params.logprobs is None
        if (self._speeds and plain and done.finish_reason != "cancelled" and s.n_tokens >= PLAIN_SPEED_MIN_TOKENS
                and self._target_on_gpu()):
            self._speeds.keep_plain(s.tokens_per_second)

    def _target_on_gpu(self) -> bool:
        """Every layer of the target offloaded (-ngl -1, or at least its layers and output layer)."""
        ngl = self._pair.settings[0].n_gpu_layers
        return supports_gpu_offload() and (ngl < 0 or ngl >= self.model.n_layer + 1)

    def _remember(self, prompt_ids: list[int], done: Done, scope: str) -> None:
        """A generation's prompt and answer join the earlier answers ``suffix`` drafts from (a prompt with images:
        its answer alone, the images' positions being no text)."""
        self._pair.answers.add(scope, ([] if has_images(prompt_ids) else list(prompt_ids)) + list(done.token_ids))

    def answers_kept(self) -> int:
        """Tokens of earlier generations ``suffix`` may draft from (every scope's)."""
        return self._pair.answers.tokens() if self._pair is not None else 0

    def forget_answers(self) -> None:
        """Forget every earlier answer ``suffix`` would draft from (every scope's)."""
        if self._pair is not None:
            self._pair.answers.clear()

    def _measured_for(self, drafter: str) -> Measured:
        """What earlier answers measured with this drafter at the threads the target runs with now (a round's costs
        depend on both); the first answer with it since loading starts from how its tokens fared on this pair in
        earlier launches, where they were kept."""
        key = (drafter, self._pair.target.ctx.n_threads)
        if key not in self._measured:
            m = self._measured[key] = Measured()
            # Only the first look since loading finds an earlier launch's profile: after the threads change (a busy
            # machine), what it finds was kept by this launch, worth adopting but no earlier launch's.
            earlier = drafter not in self._recalled
            self._recalled.add(drafter)
            if self._memory and isinstance(kept := self._memory.recall(drafter), dict):
                if kept.get("offload") != self._offload():  # (a long batch's weight is the kernels': a GPU's differ)
                    kept = {k: v for k, v in kept.items() if k != "long_batch"}
                if m.adopt(kept) and earlier:
                    self._kept.add(drafter)
        return self._measured[key]

    def _offload(self) -> list[int]:
        """The layers each model offloads (-ngl), as kept with a profile."""
        return [s.n_gpu_layers for s in self._pair.settings]

    def started_from_kept(self, drafter: str) -> bool:
        """Did this drafter start from how its tokens fared on this pair in an earlier launch (``memory``)?"""
        return drafter in self._kept

    def _auto(self) -> list:
        """What follows the cores other programs leave free (no --threads given): contexts, and heads drafting
        beside a target that follows them (they never run at once)."""
        pair = self._pair
        auto = [x.ctx for x, s in zip((pair.target, pair.draft), pair.settings) if x and not s.n_threads]
        return auto + (pair.heads() if pair.target.ctx in auto else [])

    def _choose_threads(self) -> None:
        if auto := self._auto():
            n = self._threads.choose().n_threads
            for x in auto:
                x.set_threads(n)

    def threads(self) -> dict:
        """The threads each model runs with now, and why."""
        why, auto = self._threads.choice.why, self._auto()
        return {role: {"n_threads": x.ctx.n_threads, "why": why if x.ctx in auto else "--threads"}
                for role, x in (("target", self.target), ("draft", self.draft)) if x}

    def offload(self) -> dict:
        """The layers each model put on a GPU, of its layers and output layer (as -ngl counts them), and why."""
        return {role: {"n_gpu_layers": s.n_gpu_layers, "n_layers": m.n_layer + 1, "why": s.offload_why}
                for role, m, s in zip(("target", "draft"), (self.model, self.draft_model), self._pair.settings)
                if m is not None}

    def measure_costs(self, draft_max: int, drafter: str = ModelDrafter.name) -> Costs:
        """Time the operations of a speculative round with the loaded models (see ``costs``); the draft model's
        only for the draft model's method (the others cost next to nothing). Clears both caches."""
        with self._lock:
            try:
                draft = self.draft.ctx if self.draft and drafter == ModelDrafter.name else None
                return measure(self.target.ctx, draft, min(draft_max, self.target.ctx.n_batch - 1))
            finally:
                self._pair.clear()

    def ceiling(self, draft_max: int, drafter: str) -> Ceiling | None:
        """What the pair can reach with this drafter on this machine now, every draft token accepted (timed now;
        clears both caches). None but for a draft model: other drafters' proposals come and go with the text."""
        if drafter != ModelDrafter.name or self.draft is None:
            return None
        return self.measure_costs(draft_max, drafter).ceiling_of(draft_max)

    def alternatives(self) -> tuple[str, ...]:
        """The pair's methods other than its draft model, by name."""
        return tuple(m for m in self.drafters if m not in (ModelDrafter.name, registry.OFF))

    def forget_costs(self) -> None:
        """Drop what earlier answers measured of a round's costs (``measured.Measured``): the next adaptive
        answer measures afresh, as after loading."""
        with self._lock:
            self._measured.clear()

    def reset(self, keep: list[int] = ()) -> None:
        """Forget the cached conversation (every cache), but a prefix ``keep`` of the next prompt, which the target
        holds afterwards (Compare: both runs start from the prompt's images, encoded once)."""
        with self._lock:
            self._pair.clear(keep)

    def state_costs(self) -> dict[str, dict]:
        """Per recurrent model ("target", "draft"): what keeping its state exact has cost so far (``StateCosts``)."""
        return {role: asdict(x.ctx.state_costs) for role, x in (("target", self.target), ("draft", self.draft))
                if x and x.model.recurrent}

    def recurrent_states(self) -> list[dict]:
        """The recurrent state each recurrent model keeps now (``Context.recurrent_state``), target first."""
        return [x.ctx.recurrent_state() for x in (self.target, self.draft) if x and x.model.recurrent]

    def memory_bytes(self) -> int:
        """Weights plus caches of the loaded models (what the pair costs in RAM or VRAM): KV, and for recurrent
        models the state with its snapshots and the saved states held now."""
        head, projector = self._pair.head, self._pair.projector
        return (sum(x.model.size_bytes + x.ctx.cache_bytes() for x in (self.target, self.draft) if x)
                + (head.model.size_bytes if head else 0) + (projector.size_bytes if projector else 0))

    def close(self) -> None:
        """Frees the models; waits for a generation in progress (another thread's) to finish first."""
        with self._lock:
            if self._pair:
                self._pair.close()
            self._pair = None
