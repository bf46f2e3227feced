"""Tool calls (OpenAI's ``tools``): how a model family writes a call, the grammar that keeps every call it writes
valid, and the parser that reads the calls back out of the answer.

The grammar constrains the whole answer, so it is exact under speculation like any other (see
``app.engine.constraint``): with ``tool_choice: auto`` it allows free text that never contains the call marker, or
free text ending in the marker followed by calls (the lazy grammar llama-server builds: nothing is constrained until
the marker); with ``required`` or a named function the answer is calls from its first token. After the marker the
keys, quotes and function names are forced, so they are drafted free.

Formats are told apart by the markers in the chat template, as llama.cpp does. A template that knows no tools
(SmolLM2, Gemma 3, plain ChatML) gets them described in a system message and answers in the Hermes format.

``base`` holds what every format shares, one module per family writes and reads its calls (``hermes`` also Qwen's
XML inside the same tags), ``formats`` picks the format from a template and prepares the messages for it.
"""
from .base import Format, Tool, ToolCall, ToolChoice, Vocab, call_id
from .formats import FORMATS, knows_tools, prepare_messages, tool_format
from .gemma4 import Gemma4
from .gpt_oss import GptOss
from .hermes import Hermes, QwenXml
from .lfm2 import Lfm2
from .llama3 import Llama3
from .mistral import Mistral

__all__ = [
    "FORMATS", "Format", "Gemma4", "GptOss", "Hermes", "Lfm2", "Llama3", "Mistral", "QwenXml", "Tool", "ToolCall",
    "ToolChoice", "Vocab", "call_id", "knows_tools", "prepare_messages", "tool_format",
]
