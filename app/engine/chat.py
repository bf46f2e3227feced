"""Chat prompts from the model's own template (GGUF ``tokenizer.chat_template``), rendered like Hugging Face does."""
from __future__ import annotations

from datetime import datetime

from .errors import EngineError

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "") -> str:
    """Render ``messages`` (role/content dicts) ending with the assistant's turn opened (ChatML if none)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise EngineError(f"The model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(template or CHATML).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    except EngineError:
        raise
    except Exception as exc:  # a template using features jinja2 lacks: fall back to ChatML, which most use
        if template and template != CHATML:
            return render_chat(CHATML, messages, bos_token, eos_token)
        raise EngineError(f"Could not render the chat template: {exc}") from exc
