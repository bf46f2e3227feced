"""The engine: a target (and optional draft) model loaded once, chat prompts, and generation with any drafter."""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Iterator

from .compat import compatibility_problems
from .costs import Costs, measure
from .draft_control import MAX_DRAFT
from .drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from .errors import EngineError, ModelsUnloaded
from .events import Done, Event, Stats, method_name
from .llama import Context, Model, ModelSettings, default_threads, gpus
from .memory import Load, check_fits
from .assistant import AssistantDrafter
from .eagle3 import Eagle3Drafter
from .gguf_file import read_info
from .mtp import MtpDrafter
from .text_drafter import TextDrafter
from .threads import RECHECK_S, ThreadChooser
from .turns import Turns
from .loop import GenerationParams, speculative_generate

DRAFTERS = ("model", "mtp", "eagle3", "ngram", "none")
# llama.cpp's speculative types (--spec-type, llama-server's "speculative.type"): the drafter each is here, None where
# SpecChat has no such method
SPEC_TYPES = {"draft-simple": "model", "draft-mtp": "mtp", "draft-eagle3": "eagle3", "draft-dflash": None,
              "draft-dspark": None, "ngram-simple": "ngram", "ngram-map-k": "ngram", "ngram-map-k4v": "ngram",
              "ngram-mod": "ngram", "ngram-cache": "ngram", "none": "none"}


def drafter_for(spec_type: str) -> str:
    """The drafter a llama.cpp speculative type names (every ngram-* is prompt lookup here)."""
    if not isinstance(spec_type, str) or spec_type not in SPEC_TYPES:
        raise EngineError(f"Unknown speculative type {spec_type!r}: use one of {', '.join(SPEC_TYPES)}.")
    if SPEC_TYPES[spec_type] is None:
        raise EngineError(f"{spec_type} is not available in SpecChat yet: use draft-simple (a draft model), "
                          "draft-mtp, draft-eagle3 or ngram-simple.")
    return SPEC_TYPES[spec_type]


# Draft files that are not models of their own but heads drafting through the target's context (no context of
# their own, never as text), by architecture: their class, and the drafter that names them besides "model".
HEADS = {"gemma4-assistant": (AssistantDrafter, "mtp"), "eagle3": (Eagle3Drafter, "eagle3")}
DEFAULT_CTX = 4096


@dataclass
class _Loaded:
    model: Model
    ctx: Context


class Engine:
    """Owns the llama.cpp models and contexts. One generation at a time (others wait on the lock), and the KV
    caches persist between generations so a chat turn only evaluates what is new."""

    def __init__(self, target: ModelSettings, draft: ModelSettings | None = None):
        self._lock = Turns()  # one generation at a time, in the order they asked
        settings = [s for s in (target, draft) if s is not None]
        for s in settings:
            for name, value in (("context size", s.n_ctx), ("threads", s.n_threads)):
                if value < 0:
                    raise EngineError(f"Invalid {name} {value}: use a positive number, or 0 for the default.")
            if s.n_checkpoints < 0:
                raise EngineError(f"Invalid --ctx-checkpoints {s.n_checkpoints}: use 0 (none) or more.")
        # Why the draft cannot share the target's token ids (llama.cpp's pair rule); then it drafts as text.
        self.cross_vocab: list[str] = []
        if draft is not None:  # judged from vocabularies alone, before spending time and memory on weights
            t_vocab, d_vocab = Model(target.path, vocab_only=True), Model(draft.path, vocab_only=True)
            try:
                self.cross_vocab = compatibility_problems(t_vocab, d_vocab)
            finally:
                t_vocab.close()
                d_vocab.close()
        head = HEADS.get(read_info(draft.path).architecture) if draft is not None else None
        if head and self.cross_vocab:
            raise EngineError(f"{draft.path.name} cannot draft for {target.path.name}: "
                              + "; ".join(self.cross_vocab) + ".")
        self._head: AssistantDrafter | Eagle3Drafter | None = None
        self._head_kind = head[1] if head else None
        models: list[Model] = []
        contexts: list[Context] = []
        try:
            for s in settings:  # weights are memory-mapped: opening them is cheap
                models.append(Model(s.path, n_gpu_layers=s.n_gpu_layers))
            # The draft shares the target's context size: it must hold the same conversation.
            n_ctx = target.n_ctx or min(models[0].n_ctx_train or DEFAULT_CTX, DEFAULT_CTX)
            check_fits([Load(m.path.name, m.size_bytes, m.kv_bytes_per_token, m.n_layer, n_ctx, s.n_gpu_layers,
                             m.recurrent_bytes, n_rs, s.n_checkpoints)
                        for m, s, n_rs in zip(models, settings, (target.n_rs_seq, 0))], gpus())
            # The draft needs one output, and no recurrent-state snapshots: it drafts one token per decode, and
            # llama.cpp snapshots only the positions of the last decode (a rejected draft restores a saved state).
            with_context = models[:1] if head else models
            for m, s, n_out, n_rs in zip(with_context, settings, (MAX_DRAFT + 1, 1), (target.n_rs_seq, 0)):
                contexts.append(Context(m, n_ctx, s.n_threads or default_threads(), s.n_batch, n_out, n_rs,
                                        s.n_checkpoints))
            if head:  # before the target decodes anything (Gemma 4's assistant resets the target's cache)
                self._head = head[0](contexts[0], models[1])
        except Exception:
            if self._head:  # it reads the target's context: it goes first
                self._head.close()
            for c in contexts:  # contexts before their models
                c.close()
            for m in models:
                m.close()
            raise
        loaded = [_Loaded(m, c) for m, c in zip(models, contexts)]
        self.target = loaded[0]
        self.draft = loaded[1] if len(loaded) > 1 else None  # a draft model with a context of its own
        # Contexts without --threads follow the cores other programs leave free (they never run at once).
        self._auto = [x.ctx for x, s in zip(loaded, settings) if not s.n_threads]
        if self._head and not target.n_threads:
            self._auto.append(self._head)
        self._threads = ThreadChooser(default_threads())
        self._mtp: MtpDrafter | None = None  # made on first use of --drafter mtp

    @property
    def model(self) -> Model:
        self._check_loaded()
        return self.target.model

    @property
    def n_ctx(self) -> int:
        return self.target.ctx.n_ctx

    # --- prompts --------------------------------------------------------------------------------------------
    def detokenize(self, ids: list[int]) -> str:
        return b"".join(self.model.piece(t) for t in ids).decode("utf-8", errors="replace")

    # --- generation -----------------------------------------------------------------------------------------
    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters this pair can use, its default first: the draft model (or head), else the target's own MTP
        layers, else prompt lookup. A head answers to "model" and to llama.cpp's name for its kind."""
        kinds = {"model": self.draft is not None or self._head is not None, "mtp": self.target.model.n_nextn > 0,
                 "eagle3": False, "ngram": True, "none": True}
        if self._head_kind:
            kinds[self._head_kind] = True
        return tuple(k for k, ok in kinds.items() if ok)

    @property
    def head(self) -> tuple[str, str] | None:
        """A head given as the draft: (its drafter's name, the drafter kind besides "model" that picks it)."""
        return (self._head.name, self._head_kind) if self._head else None

    @property
    def draft_model(self) -> Model | None:
        """The pair's second model: a draft model, or a head (Gemma 4's assistant, EAGLE-3)."""
        return self.draft.model if self.draft else self._head.model if self._head else None

    def check_drafter(self, kind: str) -> None:
        """A clear refusal for a drafter this pair cannot use, naming those it can."""
        if kind not in DRAFTERS:
            raise EngineError(f"Unknown drafter {kind!r}: choose one of {', '.join(DRAFTERS)}.")
        if kind not in self.drafters:
            why = {"model": "This pair has no draft model",
                   "eagle3": "This pair has no EAGLE-3 head (give one as the draft: -md HEAD.gguf)",
                   "mtp": f"{self.target.model.path.name} has no MTP (next-token-prediction) layers to draft with"}[kind]
            usable = [f"{method_name(d)} ({d})" for d in self.drafters if d != "none"]
            raise EngineError(f"{why}: choose {' or '.join(usable)}, or turn speculation off (none).")

    def make_drafter(self, kind: str, params: GenerationParams) -> Drafter:
        self.check_drafter(kind)
        if self._head and kind in ("model", self._head_kind):
            self._head.p_min = params.draft.draft_p_min
            return self._head
        if kind == "model" and self.cross_vocab:
            return TextDrafter(self.draft.ctx, self.target.model, params.draft.draft_p_min)
        if kind == "model":
            return ModelDrafter(self.draft.ctx, params.draft.draft_p_min)
        if kind == "mtp":
            if self._mtp is None:  # (its context and cache live as long as the target's)
                self._mtp = MtpDrafter(self.target.ctx)
                if self.target.ctx in self._auto:
                    self._auto.append(self._mtp)
            self._mtp.p_min = params.draft.draft_p_min
            return self._mtp
        if kind == "ngram":
            return NgramDrafter()
        return NoDrafter()

    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        drafter: str | Drafter = "model",
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Stream events for one generation. Validates everything before the first token is computed.

        ``drafter`` names a built-in drafter or is any object following the ``Drafter`` protocol.
        """
        params = params or GenerationParams()
        params.validate()
        self._check_loaded()
        d = self.make_drafter(drafter, params) if isinstance(drafter, str) else drafter
        return self._run(d, prompt_ids, params, cancel)

    def _check_loaded(self) -> None:
        if self.target is None:
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
                for event in speculative_generate(self.target.ctx, d, prompt_ids, params, cancel):
                    yield event
                    if self._threads.since_last_look >= RECHECK_S:
                        self._choose_threads()
            finally:
                if self.draft:
                    self.draft.ctx.set_cancel(None)
        finally:
            self._lock.release()

    def _choose_threads(self) -> None:
        if self._auto:
            n = self._threads.choose().n_threads
            for ctx in self._auto:
                ctx.set_threads(n)

    def threads(self) -> dict:
        """The threads each model runs with now, and why."""
        auto = self._threads.choice.why
        return {role: {"n_threads": x.ctx.n_threads, "why": auto if x.ctx in self._auto else "--threads"}
                for role, x in (("target", self.target), ("draft", self.draft)) if x}

    def measure_costs(self, draft_max: int, drafter: str = "model") -> Costs:
        """Time the operations of a speculative round with the loaded models (see ``costs``); the draft model's
        only for the model drafter (the others cost next to nothing). Clears both caches."""
        with self._lock:
            try:
                draft = self.draft.ctx if self.draft and drafter == "model" else None
                return measure(self.target.ctx, draft, draft_max)
            finally:
                self._clear_caches()

    def reset(self) -> None:
        """Forget the cached conversation (both KV caches)."""
        with self._lock:
            self._clear_caches()

    def _clear_caches(self) -> None:  # the caller holds the lock
        for loaded in (self.target, self.draft):
            if loaded:
                loaded.ctx.truncate(0)
        if self._mtp:
            self._mtp.clear()

    def state_costs(self) -> dict[str, dict]:
        """Per recurrent model ("target", "draft"): what keeping its state exact has cost so far (``StateCosts``)."""
        return {role: asdict(x.ctx.state_costs) for role, x in (("target", self.target), ("draft", self.draft))
                if x and x.model.recurrent}

    def memory_bytes(self) -> int:
        """Weights plus caches of the loaded models (what the pair costs in RAM or VRAM): KV, and for recurrent
        models the state with its snapshots and the saved states held now."""
        return (sum(x.model.size_bytes + x.ctx.cache_bytes() for x in (self.target, self.draft) if x)
                + (self._head.model.size_bytes if self._head else 0))

    def close(self) -> None:
        """Frees the models; waits for a generation in progress (another thread's) to finish first."""
        with self._lock:
            for drafter in (self._mtp, self._head):  # they read the target's context: they go first
                if drafter:
                    drafter.close()
            if self._head:
                self._head.model.close()
            self._mtp = self._head = None
            for loaded in (self.draft, self.target):
                if loaded:
                    loaded.ctx.close()
                    loaded.model.close()
            self.draft = self.target = None
