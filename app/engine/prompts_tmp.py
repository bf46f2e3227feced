"""Prompt rendering, on its way to app/prompts (merged there by hand)."""
from __future__ import annotations

from .chat import render_chat
from .grammar import Grammar
from .llama import Model, builtin_chat
from .tools import Format, Tool, ToolChoice, Vocab, prepare_messages, tool_format


def chat_prompt(model: Model, messages: list[dict], **variables) -> str:
    """The text ``model`` sees for a conversation: its own template (a vocab-only model is enough)."""
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    eos = model.piece_special(model.eos) if model.eos >= 0 else ""
    return render_chat(model.chat_template(), messages, bos_token=bos, eos_token=eos, builtin=builtin_chat,
                       model=model.path.name, **variables)


def prompt_tokens(model: Model, text: str) -> list[int]:
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    add_bos = model.add_bos and not (bos and text.startswith(bos))  # the template may already write BOS
    return model.tokenize(text, add_special=add_bos, parse_special=True)


