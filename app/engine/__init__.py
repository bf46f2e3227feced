"""SpecChat's speculative decoding engine over llama.cpp. No UI code may be imported below this package."""
from .costs import Costs
from .draft_control import DraftParams
from .drafters import DRAFT_MODEL, DRAFTERS, METHODS, OFF, SPEC_TYPES, drafter_for
from .drafters import label as method_name
from .engine import Engine
from .errors import EngineError, ModelsUnloaded
from .events import Done, Event, PromptProgress, Round, Stats, TextDelta
from .llama import Model, ModelSettings, batch_invariant, inexact_note, quantize, supports_gpu_offload, system_info
from .loop import GenerationParams
from .sampling import SamplingParams

__all__ = [
    "Costs", "DRAFT_MODEL", "DRAFTERS", "METHODS", "OFF", "SPEC_TYPES", "Done", "DraftParams", "Engine",
    "EngineError", "Event", "GenerationParams", "Model", "ModelsUnloaded", "ModelSettings", "PromptProgress",
    "Round", "SamplingParams", "Stats", "TextDelta", "batch_invariant", "drafter_for", "inexact_note", "method_name",
    "quantize", "supports_gpu_offload", "system_info",
]
