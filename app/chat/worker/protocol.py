"""What the app and its engine worker say to each other over their socket: typed messages, pickled whole by
``multiprocessing.connection.Connection`` (length-framed). Both ends are this same package, so a message is a
dataclass and an event is the engine's own (``app.engine.events``).

The parent asks (``Load`` first, then ``Generate``, ``Call``, ``Cancel``, ``Close``); the worker answers each request
id with ``Emitted`` events (a generation), then one ``Reply`` or ``Failed``. Request id 0 is the load.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

from ...engine import EngineError, GenerationParams
from ...engine.events import Event
from ...models.loader import LoadSpec, Resolved

LOAD = 0  # the request id of the load

# The engine's methods the parent may call by name (everything else it needs travels in ``Facts`` or is answered by
# its own vocabulary-only copy of the target).
CALLS = frozenset({
    "check_drafter", "check_logit_bias", "speculation", "reset", "alternatives", "ceiling", "measure_costs",
    "forget_costs", "forget_answers", "started_from_kept", "threads", "memory_bytes", "state_costs", "recurrent_states",
    "tokenize_images", "offload",
})


# --- parent → worker --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    spec: LoadSpec
    resolved: Resolved


@dataclass(frozen=True)
class Generate:
    rid: int
    ids: list[int]
    params: GenerationParams
    drafter: str


@dataclass(frozen=True)
class Call:
    rid: int
    method: str  # one of CALLS
    args: tuple = ()


@dataclass(frozen=True)
class Cancel:
    rid: int


@dataclass(frozen=True)
class Close:
    pass


# --- worker → parent --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileFacts:
    """A model file the worker loaded, as the parent shows it (its name, its weights' size)."""

    path: Path
    size_bytes: int = 0


@dataclass(frozen=True)
class Facts:
    """What the worker loaded, once, for the parent to answer from without asking."""

    pid: int
    target: FileFacts
    draft_model: FileFacts | None
    projector: FileFacts | None
    marker: str | None  # the projector's media marker
    n_ctx: int
    drafters: tuple[str, ...]
    cross_vocab: list[str]
    head: tuple[str, str] | None
    has_draft_context: bool
    model: dict = field(default_factory=dict)  # the target's figures a vocabulary-only load reads as 0


@dataclass(frozen=True)
class Loaded:
    facts: Facts


@dataclass(frozen=True)
class Emitted:
    rid: int
    event: Event


@dataclass(frozen=True)
class Reply:
    rid: int
    value: object = None


@dataclass(frozen=True)
class Failed:
    rid: int
    error: BaseException


def portable(exc: BaseException) -> BaseException:
    """``exc`` itself where it survives pickling (EngineError and its kind do), else an EngineError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
