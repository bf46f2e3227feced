"""Chat prompts from the model's own template (GGUF ``tokenizer.chat_template``), rendered as Hugging Face's
``apply_chat_template`` renders them; where jinja cannot, llama.cpp's own template matcher; else a clear error —
never another family's format in silence (a Gemma or Llama model fed ChatML answers badly)."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Callable

from ..engine.errors import EngineError
from .thinking import continued

# What llama.cpp (and llama-server) use for a model that ships no template at all.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """Hugging Face's tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(template: str):
    """The template in the environment Hugging Face renders chat templates in: a sandbox with trimmed blocks, loop
    controls ({% break %}, {% continue %}), {% generation %} blocks (rendered as their body), HF's tojson,
    raise_exception and strftime_now; and, as llama-server's renderer, text plus an undefined value is the text."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # HF marks assistant text with {% generation %}: it renders as its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    class Undefined(jinja2.Undefined):  # an undefined value added to text is no text, as in llama.cpp's jinja
        def __add__(self, other):  # (FireFunction v2's template adds its undefined ``functions``)
            return other if isinstance(other, str) else self._fail_with_undefined_error()

        def __radd__(self, other):
            return other if isinstance(other, str) else self._fail_with_undefined_error()

    def raise_exception(message):
        raise EngineError(f"The model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=Undefined,
                                       extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(template)


def today() -> dict:
    """The dates llama-server gives every template (``common_chat_extra_context``): Llama 3's ``date_string`` ("25 Nov
    2026") and FireFunction's ``datetime`` ("Nov 25 2026"). Llama 3.1's and 3.3's templates read ``date_string``
    and would otherwise write their release's date (as Hugging Face's ``apply_chat_template`` leaves them: "26 Jul
    2024"); 3.2's call ``strftime_now`` for the same date."""
    now = datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                builtin: Callable[[str, list[dict], bool], str | None] | None = None, model: str = "the model",
                add_generation_prompt: bool = True, continue_final_message: bool = False, **variables) -> str:
    """Render ``messages`` (role/content dicts) ending with the assistant's turn opened (``add_generation_prompt``
    False: ending with the last message). ``continue_final_message``: the last message is the assistant's and the
    answer goes on from its text, as llama-server continues it: the messages before it rendered with the turn
    opened, then its text (no end-of-turn). ``variables`` reach the template (e.g. Qwen3's ``enable_thinking``).
    ``builtin(template, messages, add_generation_prompt)`` is llama.cpp's matcher, tried when jinja cannot render
    the template, and its renderer for a template that is one of its names (``llama3``: llama-server's
    ``--chat-template NAME``)."""
    if continue_final_message:
        if not messages or messages[-1]["role"] != "assistant":
            raise EngineError("continue_final_message needs the last message to be the assistant's (its text is "
                              "what the answer continues).")
        *messages, last = messages
        add_generation_prompt, prefill = True, last.get("content") or ""
    else:
        prefill = ""
    head = _render(template or CHATML, messages, builtin, model, add_generation_prompt,
                   dict(today(), bos_token=bos_token, eos_token=eos_token, **variables))
    return head + continued(head, prefill)


def _render(template: str, messages: list[dict], builtin, model: str, add_generation_prompt: bool,
            variables: dict) -> str:
    if builtin and "{{" not in template and "{%" not in template:  # a name of llama.cpp's ("llama3"), not Jinja
        text = builtin(template, messages, add_generation_prompt)
        if text is None:
            raise EngineError(f"The chat template of {model} ({template[:40]!r}) is neither Jinja nor a format "
                              "llama.cpp knows.")
        return text
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except EngineError:
        raise
    except Exception as exc:  # a feature jinja2 lacks, or a broken template
        text = builtin(template, messages, add_generation_prompt) if builtin else None
        if text is None:
            raise EngineError(f"The chat template of {model} could not be rendered ({type(exc).__name__}: {exc}) "
                              "and llama.cpp does not recognise it; check it with `specchat prompt`.") from exc
        return text
