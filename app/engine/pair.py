"""A loaded pair: the target's model and context, and what drafts for it (a draft model with a context of its own,
or a head drafting through the target's), loaded in the order llama.cpp needs and judged before weights are read."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .compat import compatibility_problems
from .draft_control import MAX_DRAFT
from .drafters import Drafter
from .drafters.mtp import MtpDrafter
from .drafters.registry import head_of
from .drafters.suffix import AnswerMemory
from .errors import EngineError
from .fit import Load, check_fits
from .gguf_file import not_a_model, read_info
from .llama import Context, Model, ModelSettings, Projector, default_threads, gpus

DEFAULT_CTX = 4096


@dataclass
class Loaded:
    model: Model
    ctx: Context


class LoadedPair:
    """The models and contexts of one pair (the drafter registry's ``Pair``). ``close`` frees them, heads first."""

    def __init__(self, target: ModelSettings, draft: ModelSettings | None = None, mmproj: Path | None = None,
                 mmproj_found: bool = False):
        settings = [s for s in (target, draft) if s is not None]
        for s in settings:
            for name, value in (("context size", s.n_ctx), ("threads", s.n_threads)):
                if value < 0:
                    raise EngineError(f"Invalid {name} {value}: use a positive number, or 0 for the default.")
            if s.n_checkpoints < 0:
                raise EngineError(f"Invalid --ctx-checkpoints {s.n_checkpoints}: use 0 (none) or more.")
            if kind := not_a_model(s.path):
                raise EngineError(f"{s.path.name} is {kind}")
        t_info, d_info = read_info(target.path), read_info(draft.path) if draft is not None else None
        if head := head_of(t_info):  # (llama.cpp crashes on some, others draft nonsense as a model)
            raise EngineError(f"{target.path.name} is {head.DESCRIBED}, not a model: give it as the draft (--draft) "
                              "of the model it was made for.")
        # Why the draft cannot share the target's token ids (llama.cpp's pair rule); then it drafts as text.
        self.cross_vocab: list[str] = []
        if draft is not None:  # judged from vocabularies alone, before spending time and memory on weights
            t_vocab, d_vocab = Model(target.path, vocab_only=True), Model(draft.path, vocab_only=True)
            try:
                self.cross_vocab = compatibility_problems(t_vocab, d_vocab)
            finally:
                t_vocab.close()
                d_vocab.close()
        head_class = head_of(d_info) if d_info is not None else None
        # A head drafts from the target's own state: one made for another model would crash llama.cpp or draft
        # garbage, so the two headers are checked before either is loaded (as the pair check and the Hub judge them)
        if head_class and (problems := self.cross_vocab or head_class.pair_problems(t_info, d_info)):
            raise EngineError(f"{draft.path.name} cannot draft for {target.path.name}: " + "; ".join(problems) + ".")
        self.head: Drafter | None = None
        self._mtp: MtpDrafter | None = None  # the target's own MTP layers' drafter, made on first use
        self.projector: Projector | None = None  # the target's vision projector (--mmproj)
        self.projector_problem = ""  # why a projector found beside the target (not asked for) was not loaded
        models: list[Model] = []
        contexts: list[Context] = []
        try:
            for s in settings:  # weights are memory-mapped: opening them is cheap
                models.append(Model(s.path, n_gpu_layers=s.n_gpu_layers))
            # The draft shares the target's context size: it must hold the same conversation.
            n_ctx = target.n_ctx or min(models[0].n_ctx_train or DEFAULT_CTX, DEFAULT_CTX)
            loads = [Load(m.path.name, m.size_bytes, m.kv_bytes_per_token, m.n_layer, n_ctx, s.n_gpu_layers,
                          m.recurrent_bytes, n_rs, s.n_checkpoints)
                     for m, s, n_rs in zip(models, settings, (target.n_rs_seq, 0))]
            if mmproj is not None and mmproj.is_file():  # the projector's weights, beside the target's
                loads.append(Load(mmproj.name, mmproj.stat().st_size, 0, 0, n_ctx, -1 if target.n_gpu_layers else 0))
            check_fits(loads, gpus())
            # The draft needs one output, and no recurrent-state snapshots: it drafts one token per decode, and
            # llama.cpp snapshots only the positions of the last decode (a rejected draft restores a saved state).
            with_context = models[:1] if head_class else models
            for m, s, n_out, n_rs in zip(with_context, settings, (MAX_DRAFT + 1, 1), (target.n_rs_seq, 0)):
                contexts.append(Context(m, n_ctx, s.n_threads or default_threads(), s.n_batch, n_out, n_rs,
                                        s.n_checkpoints))
            if head_class:  # before the target decodes anything (Gemma 4's assistant resets the target's cache)
                self.head = head_class(contexts[0], models[1])
            if mmproj is not None:
                try:
                    self.projector = Projector(mmproj, models[0], target.n_threads or default_threads(),
                                               use_gpu=target.n_gpu_layers != 0)
                    contexts[0].media = self.projector
                except EngineError as exc:
                    if not mmproj_found:
                        raise
                    self.projector_problem = str(exc)  # a folder's projector for another model: text only
        except Exception:
            if self.projector:
                self.projector.close()
            if self.head:  # it reads the target's context: it goes first
                self.head.close()
            for c in contexts:  # contexts before their models
                c.close()
            for m in models:
                m.close()
            raise
        loaded = [Loaded(m, c) for m, c in zip(models, contexts)]
        self.target = loaded[0]
        self.draft = loaded[1] if len(loaded) > 1 else None  # a draft model with a context of its own
        self.settings = settings
        self.answers = AnswerMemory()  # earlier generations, per scope, for drafting from earlier answers (suffix)

    @property
    def target_ctx(self) -> Context:
        return self.target.ctx

    @property
    def draft_ctx(self) -> Context | None:
        return self.draft.ctx if self.draft else None

    @property
    def draft_model(self) -> Model | None:
        """The pair's second model: a draft model, or a head (Gemma 4's assistant, EAGLE-3, a block draft)."""
        return self.draft.model if self.draft else self.head.model if self.head else None

    def mtp(self) -> MtpDrafter:
        if self._mtp is None:  # (its context and cache live as long as the target's)
            self._mtp = MtpDrafter(self.target.ctx)
        return self._mtp

    def heads(self) -> list[MtpDrafter]:
        """The drafters that read the target's context, made so far."""
        return [h for h in (self._mtp, self.head) if h]

    def clear(self, keep: list[int] = ()) -> None:
        """Forget the cached conversation in every cache, but the prefix ``keep`` in the target's: held afterwards
        (evaluated now where it was not), with a checkpoint there for recurrent memory."""
        if self.draft:
            self.draft.ctx.truncate(0)
        ctx = self.target.ctx
        ctx.reuse_prefix(keep)  # (none: all goes)
        held = ctx.n_held  # (recurrent memory may hold less, back at a checkpoint: the rest is evaluated now)
        if held < len(keep):
            ctx.truncate(held)
            ctx.decode(keep[held:], n_logits=0)
        if keep:
            ctx.checkpoint()
        if self._mtp:
            self._mtp.clear()

    def close(self) -> None:
        for head in self.heads():  # they read the target's context: they go first
            head.close()
        if self.head:
            self.head.model.close()
        self._mtp = self.head = None
        if self.projector:
            self.projector.close()
            self.projector = None
        for loaded in (self.draft, self.target):
            if loaded:
                loaded.ctx.close()
                loaded.model.close()
        self.draft = self.target = None
