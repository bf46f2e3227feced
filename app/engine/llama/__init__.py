"""llama.cpp, wrapped: the only package of SpecChat that imports ``llama_cpp``. ``model`` holds weights and
vocabulary, ``context`` one KV cache and its rollback, ``heads`` the small contexts heads draft in and what they
read of the target, ``vision`` a target's image projector (libmtmd), ``backend`` the process-wide set-up and the calls
that stand alone."""
from .backend import (Cancelled, batch_invariant, builtin_chat, builtin_template_names, default_threads, devices, gpus,
                      inexact_note, quantize, supports_gpu_offload, system_info)
from .context import Context, common_prefix
from .rollback import StateCosts
from .model import Model, ModelSettings
from .vision import Projector

__all__ = [
    "Cancelled", "Context", "Model", "ModelSettings", "Projector", "StateCosts", "batch_invariant", "builtin_chat",
    "builtin_template_names", "common_prefix", "default_threads", "devices", "gpus", "inexact_note", "quantize",
    "supports_gpu_offload", "system_info",
]
