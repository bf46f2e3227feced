"""Chat templates rendered as Hugging Face renders them, llama.cpp's matcher where jinja cannot, a clear error
otherwise; template variables (Qwen3's enable_thinking), today's date, the turn left closed or the last one continued;
`specchat prompt` shows what the model sees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date

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
    from app.server.requests.openai import ApiError, parse

    job = parse({"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}}, True, Settings(), ("model", "ngram", "none"))
    opened = {"add_generation_prompt": True, "continue_final_message": False}
    assert job.template_variables == {"enable_thinking": False, **opened}
    assert parse({"messages": MSGS}, True, Settings(), ("model", "ngram", "none")).template_variables == {
        "enable_thinking": True, **opened}
    with pytest.raises(ApiError, match="template variables"):
        parse({"messages": MSGS, "chat_template_kwargs": {"messages": []}}, True, Settings(), ("model", "ngram", "none"))


# As llama.cpp's copies of Llama 3's and FireFunction's templates read the date (models/templates/*.jinja).
DATED = ("{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% endif %}"
         "Today Date: {{ date_string }}|{{ datetime }}|{{ strftime_now('%Y') }}")


def test_templates_get_todays_date_as_llama_server_gives_it():
    today = date.today()  # (a render at midnight could see tomorrow: then the date is checked again)
    text = render_chat(DATED, MSGS)
    if today != date.today():
        text = render_chat(DATED, MSGS)
    assert text == f"Today Date: {date.today():%d %b %Y}|{date.today():%b %d %Y}|{date.today():%Y}"
    assert render_chat(DATED, MSGS, date_string="1 Jan 2000").startswith("Today Date: 1 Jan 2000|")  # kwargs win


def test_text_plus_an_undefined_value_is_the_text_as_llama_servers_jinja_has_it():
    # FireFunction v2's template writes its system prompt as suffix + "\n" + functions, which nobody defines
    template = "{% set s = 'Today is ' + datetime + '.' + functions %}{{ s }}{{ undefined_thing ~ '!' }}"
    assert render_chat(template, MSGS) == f"Today is {date.today():%b %d %Y}.!"
    with pytest.raises(EngineError, match="could not be rendered"):
        render_chat("{{ 1 + functions }}", MSGS)  # (numbers: an error, as in Hugging Face's)


def test_the_turn_is_left_closed_or_the_assistants_last_message_continued():
    pair = MSGS[1:3]  # user, then the assistant's "ok"
    opened = render_chat(None, pair[:1])
    assert opened == "<|im_start|>user\n<b>é</b><|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(None, pair[:1], add_generation_prompt=False) == "<|im_start|>user\n<b>é</b><|im_end|>\n"
    # continued: the turns before it, the assistant's turn opened, its text and no end of turn (as llama-server)
    assert render_chat(None, pair, continue_final_message=True) == opened + "ok"
    assert render_chat(None, pair, add_generation_prompt=False, continue_final_message=True) == opened + "ok"
    with pytest.raises(EngineError, match="last message to be the assistant's"):
        render_chat(None, MSGS, continue_final_message=True)
    # llama.cpp's matcher takes the flag too (a template jinja cannot render)
    gemma_like = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['content'] | no_such_filter }}{% endfor %}"
    assert render_chat(gemma_like, pair[:1], builtin=builtin_chat, add_generation_prompt=False) == (
        "<start_of_turn>user\n<b>é</b><end_of_turn>\n")
    assert render_chat(gemma_like, pair, builtin=builtin_chat, continue_final_message=True) == (
        "<start_of_turn>user\n<b>é</b><end_of_turn>\n<start_of_turn>model\nok")


def test_the_api_reads_the_turn_options_as_llama_server_does():
    from app.chat.settings import Settings
    from app.server.requests.openai import ApiError, parse

    def options(messages, **body):
        v = parse({"messages": messages, **body}, True, Settings(), ("model", "ngram", "none")).template_variables
        return v["add_generation_prompt"], v["continue_final_message"]

    prefilled = MSGS[:3]  # ends with the assistant's "ok"
    assert options(MSGS) == (True, False)
    assert options(MSGS, add_generation_prompt=False) == (False, False)
    assert options(prefilled) == (False, True)  # llama-server's assistant prefill
    assert options(prefilled, add_generation_prompt=False, continue_final_message=True) == (False, True)
    assert options(prefilled, add_generation_prompt=False, continue_final_message="content") == (False, True)
    assert options(prefilled, continue_final_message=False) == (True, False)  # a new turn after it, when asked
    bad = [(dict(continue_final_message=True), "Cannot set both add_generation_prompt and continue_final_message"),
           (dict(add_generation_prompt=True, continue_final_message=True), "Cannot set both"),
           (dict(add_generation_prompt="no"), "'add_generation_prompt' must be true or false"),
           (dict(add_generation_prompt=False, continue_final_message="reasoning_content"), "no 'reasoning_content'")]
    for body, error in bad:
        with pytest.raises(ApiError, match=error):
            options(prefilled, **body)
    with pytest.raises(ApiError, match="'continue_final_message' must be true or false"):
        options(prefilled, add_generation_prompt=False, continue_final_message=1)
    called = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(ApiError, match="Cannot continue an assistant message that contains tool calls"):
        options(MSGS[:2] + [called])
    with pytest.raises(ApiError, match="template variables"):
        options(MSGS, chat_template_kwargs={"continue_final_message": True})


def test_a_name_of_llama_cpps_formats_is_rendered_by_llama_cpp_as_llama_server_takes_it():
    from app.cli.serve import chat_template_flag

    assert chat_template_flag("llama3", None) == "llama3"  # --chat-template llama3
    with pytest.raises(EngineError, match="neither a Jinja template nor one of llama.cpp's formats"):
        chat_template_flag("llama-nine", None)
    turn = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    opened = turn + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    hi = [{"role": "user", "content": "Hi"}]
    assert render_chat("llama3", hi, builtin=builtin_chat) == opened
    assert render_chat("llama3", hi, builtin=builtin_chat, add_generation_prompt=False) == turn
    assert render_chat("llama3", hi + [{"role": "assistant", "content": "Hel"}], builtin=builtin_chat,
                       continue_final_message=True) == opened + "Hel"
    with pytest.raises(EngineError, match="neither Jinja nor a format llama.cpp knows"):
        render_chat("llama-nine", hi, builtin=builtin_chat)
