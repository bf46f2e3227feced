"""Drafting methods: one module each behind the ``Drafter`` base, and ``registry``, the table that names them."""
from .base import Draft, Drafter, Gate, NoDrafter, Stop, Wrapper, stop_at
from .cross_vocab import TextDrafter
from .draft_model import ModelDrafter
from .ngram import Lookup, NgramParams
from .registry import DRAFT_MODEL, DRAFTERS, HEADS, METHODS, OFF, SPEC_TYPES, drafter_for, label

__all__ = [
    "DRAFT_MODEL", "DRAFTERS", "Draft", "Drafter", "Gate", "HEADS", "METHODS", "ModelDrafter", "Lookup",
    "NgramParams", "NoDrafter", "OFF", "SPEC_TYPES", "Stop", "TextDrafter", "Wrapper", "drafter_for", "label",
    "stop_at",
]
