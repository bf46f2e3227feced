"""Chat templates rendered as Hugging Face renders them, llama.cpp's matcher where jinja cannot, a clear error
otherwise; template variables (Qwen3's enable_thinking); `specchat prompt` shows what the model sees."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.engine import EngineError
from app.engine.llama import builtin_chat
from app.prompts import chat_tokens
from app.prompts.template import render_chat

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<b>é</b>"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]

# Features Hugging Face's renderer has and templates of the catalog's families use: loop controls, namespace,
# {% generation %} blocks, tojson that leaves <, > and non-ASCII alone, string methods, raise_exception.
FEATURES = (
    "{% set ns = namespace(turns=0) %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% generation %}[{{ m['role'] | upper }}]{{ m['content'] | tojson }}{% endgeneration %}"
    "{% if m['content'].startswith('again') %}{% break %}{% endif %}"
    "{% endfor %}"
    "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}"
    "({{ ns.turns }} turns){% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)


def test_the_features_hugging_face_templates_use_render_exactly():
    assert render_chat(FEATURES, MSGS) == '[USER]"<b>é</b>"[ASSISTANT]"ok"[USER]"again"(3 turns)[ASSISTANT]'
    with pytest.raises(EngineError, match="refused the conversation: a system message comes first"):
        render_chat(FEATURES, MSGS[1:])


def test_template_variables_reach_the_template():
    template = ("{% for m in messages %}{{ m['content'] }}|{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}")
    assert render_chat(template, MSGS[1:2]) == "<b>é</b>|"
    assert render_chat(template, MSGS[1:2], enable_thinking=False) == "<b>é</b>|<think>\n\n</think>\n\n"


def test_a_template_jinja_cannot_render_falls_back_to_llama_cpps_matcher_not_to_chatml():
    gemma_like = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['content'] | no_such_filter }}{% endfor %}"
    text = render_chat(gemma_like, [{"role": "user", "content": "hi"}], builtin=builtin_chat)
    assert text == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"  # llama.cpp's Gemma format
    assert builtin_chat("{{ nothing llama.cpp knows }}", [{"role": "user", "content": "hi"}]) is None
    with pytest.raises(EngineError, match="chat template of odd.gguf could not be rendered .*specchat prompt"):
        render_chat("{% for %}", [{"role": "user", "content": "hi"}], builtin=builtin_chat, model="odd.gguf")


def _run(*args):
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ})


def test_specchat_prompt_prints_what_the_model_sees(tmp_path):
    from support.tiny_gguf import write_model

    from app.engine import Engine, ModelSettings

    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
                "<think></think>{% endif %}{% endif %}")
    model = write_model(tmp_path / "m.gguf", seed=1, chat_template=template)
    r = _run("prompt", "--target", model, "--system", "S", "--prompt", "hello")
    assert r.returncode == 0 and r.stdout == "<system>S\n<user>hello\n<assistant>", r.stderr
    assert _run("prompt", "--target", model, "--prompt", "hello", "--no-thinking").stdout.endswith(
        "<assistant><think></think>")

    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps(MSGS[1:]))
    r = _run("prompt", "--target", model, "--messages", messages, "--tokens")
    engine = Engine(ModelSettings(model, n_ctx=128))
    try:
        assert json.loads(r.stdout) == chat_tokens(engine.model, MSGS[1:])
    finally:
        engine.close()

    messages.write_text('[{"role": "user"}]')
    r = _run("prompt", "--target", model, "--messages", messages)
    assert r.returncode == 1 and "must hold a JSON list" in r.stderr and "Traceback" not in r.stderr


def test_the_api_passes_chat_template_kwargs():
    from app.chat.settings import Settings
    from app.server.request_body import ApiError, parse

    job = parse({"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}}, True, Settings(), ("model", "ngram", "none"))
    assert job.template_variables == {"enable_thinking": False}
    assert parse({"messages": MSGS}, True, Settings(), ("model", "ngram", "none")).template_variables == {"enable_thinking": True}
    with pytest.raises(ApiError, match="template variables"):
        parse({"messages": MSGS, "chat_template_kwargs": {"messages": []}}, True, Settings(), ("model", "ngram", "none"))
