"""A target model's prompts, as the engine takes them (token ids, and a grammar for tools): a conversation rendered
with the model's own template, a plain text prompt, a conversation with tools. Each takes the ``Model`` first (a
vocab-only model is enough)."""
from __future__ import annotations

from ..engine.grammar import Grammar
from ..engine.llama import Model, builtin_chat
from .template import render_chat
from .tools import Format, Tool, ToolChoice, Vocab, prepare_messages, tool_format


def chat_prompt(model: Model, messages: list[dict], **variables) -> str:
    """The text ``model`` sees for a conversation: its own template, ready for the assistant's reply."""
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    eos = model.piece_special(model.eos) if model.eos >= 0 else ""
    return render_chat(model.chat_template(), messages, bos_token=bos, eos_token=eos, builtin=builtin_chat,
                       model=model.path.name, **variables)


def prompt_tokens(model: Model, text: str) -> list[int]:
    """The tokens of a rendered chat prompt: BOS where the model uses one and the template did not write it."""
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    add_bos = model.add_bos and not (bos and text.startswith(bos))  # the template may already write BOS
    return model.tokenize(text, add_special=add_bos, parse_special=True)


def chat_tokens(model: Model, messages: list[dict] | str, **variables) -> list[int]:
    """The tokens of a conversation (or of its rendered prompt)."""
    return prompt_tokens(model, messages if isinstance(messages, str)
                         else chat_prompt(model, messages, **variables))


def plain_tokens(model: Model, text: str) -> list[int]:
    """Plain text prompt: the model's BOS (if it uses one), special tokens written as text are parsed."""
    return model.tokenize(text, add_special=True, parse_special=True)


def tool_prompt(model: Model, messages: list[dict], tools: list[Tool], choice: ToolChoice,
                **variables) -> tuple[list[int], Grammar | None, Format | None, frozenset[int]]:
    """A conversation with tools: its tokens, the grammar the answer must follow (None: unconstrained), the
    format to read calls back with (None: no call may be made; ``tool_choice: none`` leaves the tools out of
    the prompt) and the special tokens among its markers, which the answer's text must show to be read."""
    template = model.chat_template()
    offered = tools if choice.mode != "none" else []
    fmt = tool_format(template) if offered else None
    msgs, extra = prepare_messages(messages, offered, template)
    prompt = chat_prompt(model, msgs, **{**variables, **extra})
    ids = chat_tokens(model, prompt)
    if not offered:
        return ids, None, None, frozenset()
    vocab = Vocab({m: i for m in fmt.markers if (i := model.special_token(m)) is not None}, model.eog_tokens)
    thinking = prompt.rfind("<think>") > prompt.rfind("</think>")
    return ids, fmt.grammar(offered, choice, vocab, thinking), fmt, frozenset(vocab.specials.values())
