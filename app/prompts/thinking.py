"""Reasoning models' thinking (``<think>…</think>``) told apart from the answer, while it streams and after.

Qwen3 writes the opening tag itself; DeepSeek-R1 distills get it from their chat template (the prompt ends with
``<think>``), so their answers carry only the closing tag. The stored text keeps the block: the models' own
templates drop earlier turns' thinking from the prompt, so it never reaches the model again.
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Parts:
    thinking: str | None  # None: the text has no thinking block
    thinking_done: bool  # the closing tag has arrived
    answer_start: int  # where the answer begins in the text


def split(text: str) -> Parts:
    stripped = text.lstrip()
    if stripped.startswith(OPEN):
        start = len(text) - len(stripped) + len(OPEN)
    elif CLOSE in text:  # opened by the template
        start = 0
    else:
        return Parts(None, False, 0)
    end = text.find(CLOSE, start)
    if end < 0:
        return Parts(text[start:].strip(), False, len(text))
    after = end + len(CLOSE)
    return Parts(text[start:end].strip(), True, after + len(text[after:]) - len(text[after:].lstrip()))


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt leaves the model inside a thinking block (as DeepSeek-R1's template does)."""
    return prompt.rstrip().endswith(OPEN)


def continued(prompt: str, answer: str) -> str:
    """What follows ``prompt`` when it continues ``answer`` (Continue, an assistant prefill): the answer's text,
    without the ``<think>`` it begins with where the prompt opened the thinking block itself (the stored answer of a
    DeepSeek-R1 distill keeps it; its template writes it again)."""
    stripped = answer.lstrip()
    if not (opens_thinking(prompt) and stripped.startswith(OPEN)):
        return answer
    rest = stripped[len(OPEN):]
    return rest[1:] if prompt.endswith("\n") and rest.startswith("\n") else rest
