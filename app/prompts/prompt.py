"""A target model's prompts, as the engine takes them (token ids, and a grammar for tools): a conversation rendered
with the model's own template, a plain text prompt, a conversation with tools. Each takes the ``Model`` first (a
vocab-only model is enough)."""
from __future__ import annotations

from ..engine.errors import EngineError
from ..engine.grammar import Grammar
from ..engine.images import prepare_image
from ..engine.llama import Model, Projector, builtin_chat
from .template import render_chat
from .tools import Format, Tool, ToolChoice, Vocab, prepare_messages, tool_format


def chat_prompt(model: Model, messages: list[dict], **variables) -> str:
    """The text ``model`` sees for a conversation: its own template, ready for the assistant's reply."""
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    eos = model.piece_special(model.eos) if model.eos >= 0 else ""
    return render_chat(model.chat_template(), messages, bos_token=bos, eos_token=eos, builtin=builtin_chat,
                       model=model.path.name, **variables)


def prompt_tokens(model: Model, text: str, projector: Projector | None = None, images: list[bytes] = ()) -> list[int]:
    """The tokens of a rendered chat prompt: BOS where the model uses one and the template did not write it. Each
    of ``images`` goes where the text holds the projector's media marker, as its placeholder positions."""
    bos = model.piece_special(model.bos) if model.bos >= 0 else ""
    add_bos = model.add_bos and not (bos and text.startswith(bos))  # the template may already write BOS
    if images:
        return projector.tokenize(text, [prepare_image(b, f"Image {i + 1}") for i, b in enumerate(images)], add_bos)
    return model.tokenize(text, add_special=add_bos, parse_special=True)


def chat_tokens(model: Model, messages: list[dict] | str, projector: Projector | None = None,
                **variables) -> list[int]:
    """The tokens of a conversation (or of its rendered prompt); a message's content may hold text and image parts
    (``image_messages``)."""
    if isinstance(messages, str):
        return prompt_tokens(model, messages)
    messages, images = image_messages(model, messages, projector)
    return prompt_tokens(model, chat_prompt(model, messages, **variables), projector, images)


def text_of(content: str | list[dict]) -> str:
    """A message content's text (its image parts left out)."""
    return content if isinstance(content, str) else "".join(p.get("text") or "" for p in content)


def image_messages(model: Model, messages: list[dict], projector: Projector | None) -> tuple[list[dict], list[bytes]]:
    """Messages as templates take them (text content) and the images of their content parts, in order. A content
    list holds ``{"type": "text", "text": str}`` and ``{"type": "image", "image": bytes}`` parts; each image part
    becomes the projector's media marker in the text (where libmtmd puts the image, as llama-server does)."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = []
            for part in content:
                if part.get("type") == "image":
                    if projector is None:
                        raise EngineError(f"{model.path.name} takes no images: load its vision projector "
                                          "(--mmproj), or send text only.")
                    images.append(part["image"])
                    text.append(projector.marker)
                else:
                    text.append(part.get("text") or "")
            m = {**m, "content": "".join(text)}
        out.append(m)
    return out, images


def plain_tokens(model: Model, text: str, projector: Projector | None = None, images: list[bytes] = ()) -> list[int]:
    """Plain text prompt: the model's BOS (if it uses one), special tokens written as text are parsed. Images go
    where the text holds the media marker, else before the text (as llama-mtmd-cli puts them)."""
    if not images:
        return model.tokenize(text, add_special=True, parse_special=True)
    if projector is None:
        raise EngineError(f"{model.path.name} takes no images: load its vision projector (--mmproj).")
    if projector.marker not in text:
        text = projector.marker * len(images) + "\n" + text
    return projector.tokenize(text, [prepare_image(b, f"Image {i + 1}") for i, b in enumerate(images)])


def tool_prompt(model: Model, messages: list[dict], tools: list[Tool], choice: ToolChoice,
                projector: Projector | None = None,
                **variables) -> tuple[list[int], Grammar | None, Format | None, frozenset[int]]:
    """A conversation with tools: its tokens, the grammar the answer must follow (None: unconstrained), the
    format to read calls back with (None: no call may be made; ``tool_choice: none`` leaves the tools out of
    the prompt) and the special tokens among its markers, which the answer's text must show to be read."""
    template = model.chat_template()
    messages, images = image_messages(model, messages, projector)
    offered = tools if choice.mode != "none" else []
    fmt = tool_format(template) if offered else None
    msgs, extra = prepare_messages(messages, offered, template)
    prompt = chat_prompt(model, msgs, **{**variables, **extra})
    ids = prompt_tokens(model, prompt, projector, images)
    if not offered:
        return ids, None, None, frozenset()
    vocab = Vocab({m: i for m in fmt.markers if (i := model.special_token(m)) is not None}, model.eog_tokens)
    thinking = prompt.rfind("<think>") > prompt.rfind("</think>")
    return ids, fmt.grammar(offered, choice, vocab, thinking), fmt, frozenset(vocab.specials.values())
