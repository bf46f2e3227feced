"""SpecChat's speculative decoding engine over llama.cpp. No UI code may be imported below this package."""
from .costs import Costs
from .draft_control import DraftParams
from .engine import DRAFTERS, SPEC_TYPES, Engine, drafter_for
from .errors import EngineError, ModelsUnloaded
from .events import Done, Event, Round, Stats, TextDelta, method_name
from .llama import Model, ModelSettings, batch_invariant, quantize, supports_gpu_offload, system_info
from .loop import GenerationParams
from .sampling import SamplingParams

__all__ = [
    "Costs", "DRAFTERS", "SPEC_TYPES", "Done", "DraftParams", "Engine", "EngineError", "Event", "GenerationParams",
    "Model", "ModelsUnloaded", "ModelSettings", "Round", "SamplingParams", "Stats", "TextDelta", "batch_invariant",
    "drafter_for", "method_name", "quantize", "supports_gpu_offload", "system_info",
]
