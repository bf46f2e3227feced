"""The drafting methods, in one table: what each is called (by SpecChat, by llama.cpp's ``--spec-type``, in the UI),
what a pair needs for it, and how it is made. The CLI's choices, the API's ``drafter`` and ``speculative.type``, the
UI's list, the pair check and the names in Stats all read this table: a new method is a module and a row here.

A drafter's name is a method's (``ngram`` drafts with the default n-gram kind), an n-gram kind's (``ngram-mod``), or
several of those joined by commas: a chain, which drafts with all of them each round (``chain``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from ..errors import EngineError
from ..gguf_file import GgufInfo, read_info
from ..llama import Context, Model
from .base import Drafter, NoDrafter
from .chain import ChainDrafter
from .cross_vocab import TextDrafter
from .dflash import DFlashDrafter, DSparkDrafter
from .draft_model import ModelDrafter
from .eagle3 import Eagle3Drafter
from .gemma4_assistant import AssistantDrafter
from .mtp import MtpDrafter, MtpFileDrafter
from .ngram import Lookup, NgramLongest, NgramMod, NgramSimple
from .ngram_cache import NgramCache
from .suffix import AnswerMemory, SuffixDrafter
from .ngram_map import NgramMapK, NgramMapK4v

if TYPE_CHECKING:  # (draft_control imports the drafters: a name for the annotation only)
    from ..draft_control import DraftParams


class Pair(Protocol):
    """What a method is made from: the engine's loaded pair."""

    target_ctx: Context
    draft_ctx: Context | None  # a draft model's own context
    cross_vocab: bool  # the draft model's vocabulary is not the target's: it drafts as text
    head: Drafter | None  # a head given as the draft file (Gemma 4's assistant, EAGLE-3, a block draft)

    answers: AnswerMemory  # earlier generations, per scope (suffix drafts from them)

    def mtp(self) -> MtpDrafter:
        """The target's own MTP layers' drafter (made once, on first use)."""


@dataclass(frozen=True)
class Method:
    name: str  # --drafter, the API's "drafter", Stats
    choice: str  # its label in the UI's list
    spec_types: tuple[str, ...]  # llama.cpp's --spec-type names for it
    lacking: str  # why a pair without it cannot use it ({target}: the target's file name)
    needs: str  # what a pair needs to use it, in words free of flags (the app says it beside the Drafter choice)
    draft_file: str  # what it needs given as the draft file (-md), in words; "" if none
    usable: Callable[[Model, Drafter | None, bool], bool]  # (target, head, has a draft model) -> can this pair
    make: Callable[[Pair, DraftParams], Drafter]  # (pair, the draft settings) -> its drafter


def _head_for(name: str) -> Callable[[Model, Drafter | None, bool], bool]:
    return lambda target, head, draft: head is not None and head.METHOD == name


def _model(pair: Pair, dp) -> Drafter:
    if pair.head is not None:  # a head is the draft file for "model" as well as for its own method
        return pair.head
    if pair.cross_vocab:
        return TextDrafter(pair.draft_ctx, pair.target_ctx.model)
    return ModelDrafter(pair.draft_ctx)


def _own_layers(pair: Pair, dp) -> Drafter:
    head = pair.head
    return head if head is not None and head.METHOD == MtpDrafter.name else pair.mtp()


# llama.cpp's n-gram kinds, in its order of priority in a chain (common_speculative_init), and SpecChat's own,
# which "ngram" means
KINDS: dict[str, type[Lookup]] = {k.name: k for k in (NgramSimple, NgramMapK, NgramMapK4v, NgramMod, NgramCache,
                                                      NgramLongest)}
DEFAULT_KIND = NgramLongest.name

METHODS: tuple[Method, ...] = (
    Method(ModelDrafter.name, "Draft model", ("draft-simple",), "This pair has no draft model", "a draft model",
           "a draft model: add --draft PATH", lambda target, head, draft: draft or head is not None, _model),
    Method(MtpDrafter.name, "MTP layers", ("draft-mtp",),
           "{target} has no MTP (next-token-prediction) layers to draft with", "MTP layers in the target", "",
           lambda target, head, draft: target.n_nextn > 0 or _head_for(MtpDrafter.name)(target, head, draft),
           _own_layers),
    Method(Eagle3Drafter.name, "EAGLE-3 head", ("draft-eagle3",),
           "This pair has no EAGLE-3 head (give one as the draft: -md HEAD.gguf)", "an EAGLE-3 head as its draft",
           "an EAGLE-3 head: add --draft HEAD.gguf", _head_for(Eagle3Drafter.name), lambda pair, dp: pair.head),
    Method(DFlashDrafter.name, "DFlash block draft", ("draft-dflash",),
           "This pair has no DFlash block draft (give one as the draft: -md DFLASH.gguf)",
           "a DFlash block draft as its draft",
           "a DFlash block draft: add --draft DFLASH.gguf", _head_for(DFlashDrafter.name),
           lambda pair, dp: pair.head),
    Method(DSparkDrafter.name, "DSpark block draft", ("draft-dspark",),
           "This pair has no DSpark block draft (give one as the draft: -md DSPARK.gguf)",
           "a DSpark block draft as its draft",
           "a DSpark block draft: add --draft DSPARK.gguf", _head_for(DSparkDrafter.name),
           lambda pair, dp: pair.head),
    Method(Lookup.METHOD, "N-gram lookup", tuple(KINDS), "", "", "", lambda *_: True,
           lambda pair, dp: KINDS[DEFAULT_KIND](dp.ngram)),
    Method(SuffixDrafter.name, "Earlier answers", ("suffix",), "", "", "", lambda *_: True,
           lambda pair, dp: SuffixDrafter(pair.answers, dp.scope)),
    Method(NoDrafter.name, "Off", ("none",), "", "", "", lambda *_: True, lambda pair, dp: NoDrafter()),
)
BY_NAME = {m.name: m for m in METHODS}
DRAFTERS = tuple(BY_NAME)  # the names a person or a request may choose
OFF = NoDrafter.name
DRAFT_MODEL = ModelDrafter.name
SUFFIX = SuffixDrafter.name
SPEC_TYPES = {t: m.name for m in METHODS for t in m.spec_types}
# Draft files that are not models of their own but heads drafting from the target's state, by architecture
HEADS: dict[str, type[MtpDrafter] | type[DFlashDrafter]] = {
    cls.ARCH: cls for cls in (AssistantDrafter, Eagle3Drafter, DFlashDrafter)}
# How each drafter's name reads (Stats, Compare, the API's model list); a server's own method shows as it is
LABELS = {cls.name: cls.label for cls in (ModelDrafter, TextDrafter, MtpDrafter, AssistantDrafter, Eagle3Drafter,
                                          DFlashDrafter, DSparkDrafter, SuffixDrafter, NoDrafter)}
LABELS |= {Lookup.METHOD: f"{Lookup.label} ({DEFAULT_KIND})"} | {k: f"{Lookup.label} ({k})" for k in KINDS}


def label(drafter: str) -> str:
    if isinstance(drafter, str) and "," in drafter:
        return " + ".join(label(part) for part in drafter.split(","))
    return LABELS.get(drafter, drafter)


def method(name: str) -> Method:
    if name not in BY_NAME:
        raise EngineError(f"Unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)}.")
    return BY_NAME[name]


def parts(name: str) -> tuple[str, ...]:
    """The drafters a drafter name runs: one method or n-gram kind, or a chain of them ("mtp,ngram-mod")."""
    names = tuple(p.strip() for p in name.split(",")) if isinstance(name, str) else ()
    for p in names:
        if p not in BY_NAME and p not in KINDS:
            raise EngineError(f"Unknown drafter {p!r}: choose one of {', '.join([*DRAFTERS, *KINDS])}, or several "
                              "joined by commas.")
    if len(names) > 1 and OFF in names:
        raise EngineError(f"{OFF!r} (speculation off) cannot be part of a chain of drafters.")
    resolved = [DEFAULT_KIND if p == Lookup.METHOD else p for p in names]
    if len(set(resolved)) < len(resolved):
        raise EngineError(f"{name!r} names the same drafter twice ({Lookup.METHOD} is {DEFAULT_KIND}).")
    return names


def method_of(part: str) -> str:
    return Lookup.METHOD if part in KINDS else part


def is_drafter(name: str) -> bool:
    try:
        return bool(parts(name))
    except EngineError:
        return False


def runs_on(name: str, usable_names: tuple[str, ...]) -> bool:
    """Can a pair that can use ``usable_names`` draft with this drafter name?"""
    return is_drafter(name) and all(method_of(p) in usable_names for p in parts(name))


def with_lookup(usable_names: tuple[str, ...] | list[str]) -> list[str]:
    """Each method of these that drafts with a model, chained with prompt lookup (``model,ngram``): what ``check
    --measure`` times besides the methods themselves. On the starter's held-out chat prompts a chain with ``ngram-mod``
    replayed at 1.22x where the draft model alone made 1.14x, and at 1.65x against 1.28x on repeating answers."""
    if Lookup.METHOD not in usable_names:
        return []
    return [f"{m},{Lookup.METHOD}" for m in usable_names if m not in (Lookup.METHOD, OFF) and m in BY_NAME]


def _priority(part: str) -> int:
    """llama.cpp's order in a chain: the n-gram kinds, then the model drafters (common_speculative_init)."""
    kinds = list(KINDS)
    return kinds.index(part) if part in KINDS else kinds.index(DEFAULT_KIND) if part == Lookup.METHOD else \
        len(kinds) + list(BY_NAME).index(part)


def make(name: str, pair: Pair, dp) -> Drafter:
    """The drafter a drafter name runs, made for this pair and these draft settings (--draft-p-min set here, the
    one place it is: a head is the pair's, shared by every generation)."""
    names = sorted(parts(name), key=_priority)
    made = [(KINDS[p](dp.ngram) if p in KINDS else method(p).make(pair, dp)).with_p_min(dp.draft_p_min)
            for p in names]
    if len(made) == 1:
        return made[0]
    if len({id(d) for d in made}) < len(made):
        raise EngineError(f"{name!r}: with this pair, {' and '.join(names)} are the same drafter (its head).")
    return ChainDrafter([(d, not isinstance(d, Lookup)) for d in made])


def drafter_for(spec_type) -> str:
    """The drafter a llama.cpp speculative type names: a method's name, an n-gram kind's, or for several types (a
    comma-separated string, or a list as the API may send) a chain of them."""
    if isinstance(spec_type, (list, tuple)) and spec_type and all(isinstance(t, str) for t in spec_type):
        spec_type = ",".join(spec_type)
    if isinstance(spec_type, str) and "," in spec_type:
        return ",".join(drafter_for(t.strip()) for t in spec_type.split(","))
    if not isinstance(spec_type, str) or spec_type not in SPEC_TYPES:
        raise EngineError(f"Unknown speculative type {spec_type!r}: use one of {', '.join(SPEC_TYPES)}, "
                          "or several joined by commas.")
    return spec_type if spec_type in KINDS else SPEC_TYPES[spec_type]


def default_method(has_draft: bool, has_mtp_layers: bool) -> str:
    """The pair's draft model (or head), else the target's own MTP layers, else prompt lookup."""
    return ModelDrafter.name if has_draft else MtpDrafter.name if has_mtp_layers else Lookup.METHOD


def head_class(draft: Path) -> type[MtpDrafter] | type[DFlashDrafter] | None:
    """The head a draft file is (None: a draft model of its own): see ``head_of``."""
    return head_of(read_info(Path(draft)))


def head_of(info: GgufInfo) -> type[MtpDrafter] | type[DFlashDrafter] | None:
    """The head a GGUF's header says it is (None: a draft model of its own): by its architecture, for a block draft
    by the heads it carries (DFlash or DSpark), and for a model's MTP layers alone by its tensors (architecture: the
    model's)."""
    if info.only_mtp:
        return MtpFileDrafter
    cls = HEADS.get(info.architecture)
    return cls.kind(info) if cls else None


def needs_draft_file(name: str, draft: Path | None) -> bool:
    """Does this drafter load the pair's draft file (a draft model, a head that answers to it, or any file for a
    method that drafts with one: a file of another kind is then refused in words, naming what it is for)?"""
    head = head_class(draft) if draft else None
    return any(p == ModelDrafter.name or bool(method(method_of(p)).draft_file)
               or (head is not None and head.METHOD == p)
               for p in parts(name))


def usable(target: Model, head: Drafter | None, has_draft_model: bool) -> tuple[str, ...]:
    """The methods this pair can use, its default first (the table's order)."""
    return tuple(m.name for m in METHODS if m.usable(target, head, has_draft_model))


def refusal(name: str, target: Model, usable_names: tuple[str, ...]) -> str:
    """A clear refusal for a method this pair cannot use, naming those it can."""
    why = method(name).lacking.format(target=target.path.name)
    choices = [f"{label(d)} ({d})" for d in usable_names if d != OFF]
    return f"{why}: choose {' or '.join(choices)}, or turn speculation off ({OFF})."


def speculation(name: str, target: Model, head: Drafter | None, draft: Model | None) -> str:
    """How a pair speculates with this method, in words (the API's model list shows it)."""
    if head is not None and name in (ModelDrafter.name, head.METHOD):
        return f"{label(head.name)} {head.model.path.name}"
    if name == ModelDrafter.name and draft is not None:
        return f"{label(name)} {draft.path.name}"
    if name == MtpDrafter.name:
        n = target.n_nextn
        return f"{label(name)} ({n} layer{'s' * (n > 1)} of the model's own)"
    return label(name)
