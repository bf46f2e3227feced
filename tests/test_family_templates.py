"""Every model family in the catalog is prompted as its makers intend: its real chat template, rendered as Hugging
Face's ``apply_chat_template`` renders it, compared character for character with the expected text of a system
prompt and a three-turn conversation, and tokenized with exactly the BOS its tokenizer wants.

The templates are llama.cpp's copies of the ones shipped in each model's ``tokenizer.chat_template`` (the pinned
llama-cpp-python sdist's ``vendor/llama.cpp/models/templates/``, read at test time, see
tests/support/llama_sdist.py), put into tiny GGUF fixtures. Exceptions: Qwen2.5-Coder ships Qwen2.5-Instruct's
template; llama.cpp keeps no copy of Gemma 3's, so GEMMA3 below is ours, written from Gemma's documented turn format
(system text folded into the first user turn, roles user/model, trimmed turns) and checked against llama.cpp's own
Gemma formatter; and llama.cpp keeps one template per newer family (Qwen3.5-4B's for Qwen3.5 and Qwen3.6, Gemma 4
31B's for Gemma 4, gpt-oss-120b's for gpt-oss, Ministral 3 14B Reasoning's for Ministral 3 Reasoning), assumed to be
the one every size of the family ships (not compared file by file: the other sizes' templates are not in the sdist).
"""
from __future__ import annotations

import re
import time
from datetime import datetime

import pytest
from support import llama_sdist
from support.tiny_gguf import write_model

from app.engine import Engine, ModelSettings
from app.engine.llama import builtin_chat
from app.models.catalog import load_catalog
from app.prompts import chat_prompt, chat_tokens
from app.prompts.template import render_chat

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"}]

GEMMA3 = (
    "{{ bos_token }}{% set ns = namespace(prefix='') %}{% set turns = messages %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set ns.prefix = (messages[0]['content'] | trim) + '\n\n' %}{% set turns = messages[1:] %}{% endif %}"
    "{% for m in turns %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n'"
    " + (ns.prefix if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

CHATML_TURNS = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                "<|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")


def llama3(today: str) -> str:
    return ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            f"Today Date: {today}\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")


R1_BOS, R1_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

GEMMA4_TURNS = ("<bos><|turn>system\n<|think|>\nYou are terse.<turn|>\n<|turn>user\nHi!<turn|>\n"
                "<|turn>model\nHello.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n4.<turn|>\n"
                "<|turn>user\nAnd 3+3?<turn|>\n<|turn>model\n")

MISTRAL_TURNS = ("<s>[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]Hi![/INST]Hello.</s>"
                 "[INST]What is 2+2?[/INST]4.</s>[INST]And 3+3?[/INST]")

GRANITE_TURNS = ("<|start_of_role|>system<|end_of_role|>You are terse.<|end_of_text|>\n"
                 "<|start_of_role|>user<|end_of_role|>Hi!<|end_of_text|>\n"
                 "<|start_of_role|>assistant<|end_of_role|>Hello.<|end_of_text|>\n"
                 "<|start_of_role|>user<|end_of_role|>What is 2+2?<|end_of_text|>\n"
                 "<|start_of_role|>assistant<|end_of_role|>4.<|end_of_text|>\n"
                 "<|start_of_role|>user<|end_of_role|>And 3+3?<|end_of_text|>\n"
                 "<|start_of_role|>assistant<|end_of_role|>")


def gpt_oss(today: str, effort: str = "medium") -> str:
    date = datetime.strptime(today, "%d %b %Y").strftime("%Y-%m-%d")  # the template asks strftime_now("%Y-%m-%d")
    return ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: {effort}\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
            "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n<|end|>"
            "<|start|>user<|message|>Hi!<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
            "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4.<|end|>"
            "<|start|>user<|message|>And 3+3?<|end|><|start|>assistant")

# family: (pattern over catalog repo ids, template, BOS text, EOS text, tokenizer adds BOS, expected text(today))
FAMILIES = {
    "qwen2.5": (r"Qwen2\.5-(Coder-)?\d", "Qwen-Qwen2.5-7B-Instruct", "<|endoftext|>", "<|im_end|>", False,
                lambda today: CHATML_TURNS),
    "llama-3.1": (r"Llama-3\.1-", "meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>", True,
                  llama3),  # 3.1's template has a fixed default date: llama-server's date_string replaces it
    "llama-3.2": (r"Llama-3\.2-", "meta-llama-Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>", True,
                  llama3),  # 3.2's asks strftime_now for today's
    "deepseek-r1-distill-qwen": (
        r"DeepSeek-R1-Distill-Qwen-", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", R1_BOS, R1_EOS, True,
        lambda today: (f"{R1_BOS}You are terse.<｜User｜>Hi!<｜Assistant｜>Hello.{R1_EOS}<｜User｜>What is 2+2?"
                       f"<｜Assistant｜>4.{R1_EOS}<｜User｜>And 3+3?<｜Assistant｜><think>\n")),
    "gemma-3": (r"gemma-3-", GEMMA3, "<bos>", "<eos>", True,
                lambda today: ("<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
                               "<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?"
                               "<end_of_turn>\n<start_of_turn>model\n4.<end_of_turn>\n<start_of_turn>user\n"
                               "And 3+3?<end_of_turn>\n<start_of_turn>model\n")),
    "qwen3": (r"Qwen3-\d", "Qwen-Qwen3-0.6B", "<|endoftext|>", "<|im_end|>", False, lambda today: CHATML_TURNS),
    # Qwen3.5 and Qwen3.6 (one tokenizer: 248,320 tokens, <|endoftext|> 248044, <|im_end|> 248046, no BOS added): the
    # template opens the thinking block itself when thinking is on, as DeepSeek-R1's does.
    "qwen3.5-3.6": (r"Qwen3\.[56]-\d", "Qwen3.5-4B", "<|endoftext|>", "<|im_end|>", False,
                    lambda today: CHATML_TURNS + "<think>\n"),
    # Gemma 4: <|turn>role ... <turn|>, roles system/user/model, thinking switched on by <|think|> at the top of the
    # system turn (ai.google.dev/gemma/docs/core/prompt-formatting-gemma4). BOS <bos> is always added (llama.cpp forces
    # it for Gemma 4); the template writes it too.
    "gemma-4": (r"gemma-4-", "google-gemma-4-31B-it", "<bos>", "<turn|>", True, lambda today: GEMMA4_TURNS),
    # gpt-oss (harmony): system message with identity, knowledge cutoff, today's date, reasoning effort and channels;
    # the system prompt goes to the developer message; earlier answers as final-channel messages; no BOS.
    "gpt-oss": (r"gpt-oss-", "openai-gpt-oss-120b", "<|startoftext|>", "<|return|>", False, gpt_oss),
    # LFM2.5 1.2B/350M: ChatML after an explicit <|startoftext|> (LFM2's BOS, added by llama.cpp's lfm2 tokenizer too).
    "lfm2.5": (r"LFM2\.5-", "LFM2.5-Instruct", "<|startoftext|>", "<|im_end|>", True,
               lambda today: "<|startoftext|>" + CHATML_TURNS),
    # Ministral 3 Reasoning (Tekken): <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]answer</s>...
    "ministral-3-reasoning": (r"Ministral-3-\d+B-Reasoning-", "mistralai-Ministral-3-14B-Reasoning-2512", "<s>", "</s>",
                              True, lambda today: MISTRAL_TURNS),
    # Granite 4.1: <|start_of_role|>role<|end_of_role|>text<|end_of_text|>; BOS and EOS are the same token,
    # <|end_of_text|>, and no BOS is added (Granite 4.0's tokenizer; 4.1 assumed the same).
    "granite-4.1": (r"granite-4\.1-", "ibm-granite-granite-4.1", "<|end_of_text|>", "<|end_of_text|>", False,
                    lambda today: GRANITE_TURNS),
}


def template(family: str) -> str:
    source = FAMILIES[family][1]
    return source if "{" in source else llama_sdist.templates()[source]


def family_of(repo: str) -> str | None:
    return next((f for f, spec in FAMILIES.items() if re.search(spec[0], repo)), None)


def render(family: str, messages=CHAT, **variables) -> str:
    _, _, bos, eos, _, _ = FAMILIES[family]
    variables = {"enable_thinking": True, **variables}  # the app's default, as Qwen ships it
    return render_chat(template(family), messages, bos_token=bos, eos_token=eos, **variables)


# Catalog families whose template the pinned sdist keeps no copy of, so nothing here can check it: SpecChat renders the
# template inside their GGUF, as for any model. Qwen3.8 (2026-08) has reasoning-effort levels, not Qwen3.5's template.
UNTESTED = {"qwen3.8": r"Qwen3\.8-\d"}


def test_every_catalog_model_belongs_to_a_family_tested_here():
    repos = {src.repo for pair in load_catalog().values() for src in pair.sources if src.repo}
    repos = {r for r in repos if not any(re.search(p, r) for p in UNTESTED.values())}
    assert repos and {repo: family_of(repo) for repo in repos if family_of(repo) is None} == {}
    assert {family_of(repo) for repo in repos} == set(FAMILIES)  # and no family here is left untested


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_template_renders_exactly(family):
    before = time.strftime("%d %b %Y")
    text = render(family)
    assert text in {FAMILIES[family][5](before), FAMILIES[family][5](time.strftime("%d %b %Y"))}  # across midnight


@pytest.mark.parametrize("family", FAMILIES)
def test_the_prompt_starts_with_exactly_the_bos_the_tokenizer_wants(family, tmp_path):
    """A GGUF carrying the family's template and special tokens: one BOS where the family has one (written by the
    template, not doubled by the tokenizer), none where it has none."""
    _, _, bos, eos, add_bos, expected = FAMILIES[family]
    specials = {1: bos}
    if eos not in (bos, "<|im_end|>"):  # the tiny vocabulary has <|im_end|> already; Granite's BOS is its EOS
        specials[2] = eos
    path = write_model(tmp_path / f"{family}.gguf", seed=1, rename=specials, add_bos=add_bos,
                       chat_template=template(family))
    engine = Engine(ModelSettings(path, n_ctx=512))
    try:
        text = chat_prompt(engine.model, CHAT, enable_thinking=True)
        assert text == render(family)
        tokens = chat_tokens(engine.model, CHAT, enable_thinking=True)
        # where BOS and EOS are one token, it appears exactly where the template ends a turn, never added in front
        assert tokens.count(1) == (text.count(eos) if bos == eos else 1 if add_bos else 0)
        assert (tokens[0] == 1) == add_bos
    finally:
        engine.close()


def test_gemma3_matches_llama_cpps_own_gemma_formatter():
    assert render("gemma-3") == "<bos>" + builtin_chat(GEMMA3, CHAT)  # llama.cpp's leaves BOS to the tokenizer
    with pytest.raises(Exception, match="roles must alternate"):
        render("gemma-3", CHAT[:2] + CHAT[1:2])


def test_qwen_gives_its_default_system_prompt_when_there_is_none():
    assert render("qwen2.5", CHAT[1:]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>")
    assert render("qwen3", CHAT[1:]).startswith("<|im_start|>user\nHi!<|im_end|>")  # Qwen3 has none


THOUGHTFUL = [CHAT[0], CHAT[1], {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello."},
              CHAT[3], {"role": "assistant", "content": "<think>\nSum.\n</think>\n\n4."}, CHAT[5]]


def test_thinking_models_drop_earlier_reasoning_and_honour_enable_thinking():
    # Qwen3: earlier turns keep their answers only; enable_thinking=False pre-fills an empty thinking block.
    assert render("qwen3", THOUGHTFUL) == CHATML_TURNS
    assert render("qwen3", THOUGHTFUL, enable_thinking=False) == CHATML_TURNS + "<think>\n\n</think>\n\n"
    # DeepSeek-R1: the answer after </think> is kept as written (its template does not strip the blank lines),
    # and the reply opens inside the thinking block.
    r1 = render("deepseek-r1-distill-qwen", THOUGHTFUL)
    assert "A greeting" not in r1 and "Sum." not in r1
    assert r1 == (f"{R1_BOS}You are terse.<｜User｜>Hi!<｜Assistant｜>\n\nHello.{R1_EOS}<｜User｜>What is 2+2?"
                  f"<｜Assistant｜>\n\n4.{R1_EOS}<｜User｜>And 3+3?<｜Assistant｜><think>\n")


def test_newer_thinking_models_drop_earlier_reasoning_and_honour_their_switches():
    # Qwen3.5/3.6: earlier thinking dropped; the reply opens inside <think> (on) or after an empty block (off); no
    # default system prompt.
    assert render("qwen3.5-3.6", THOUGHTFUL) == CHATML_TURNS + "<think>\n"
    assert render("qwen3.5-3.6", THOUGHTFUL, enable_thinking=False) == CHATML_TURNS + "<think>\n\n</think>\n\n"
    assert render("qwen3.5-3.6", CHAT[1:]).startswith("<|im_start|>user\nHi!<|im_end|>")
    # Gemma 4: <|think|> only when thinking is on; off pre-fills an empty thought channel; earlier thought channels
    # (<|channel>thought ... <channel|>) are stripped from the model's turns.
    assert render("gemma-4", enable_thinking=False) == (GEMMA4_TURNS.replace("<|think|>\n", "")
                                                        + "<|channel>thought\n<channel|>")
    gemma_thoughts = [CHAT[0], CHAT[1],
                      {"role": "assistant", "content": "<|channel>thought\nA greeting.<channel|>Hello."},
                      CHAT[3], {"role": "assistant", "content": "<|channel>thought\nSum.<channel|>4."}, CHAT[5]]
    assert render("gemma-4", gemma_thoughts) == GEMMA4_TURNS
    # gpt-oss: earlier analysis (the "thinking" field) is dropped, reasoning_effort sets the system message, and the
    # template refuses channel markup inside a message's content.
    today = time.strftime("%d %b %Y")
    oss_thoughts = [CHAT[0], CHAT[1], {"role": "assistant", "content": "Hello.", "thinking": "A greeting."},
                    CHAT[3], {"role": "assistant", "content": "4.", "thinking": "Sum."}, CHAT[5]]
    assert render("gpt-oss", oss_thoughts) in {gpt_oss(today), gpt_oss(time.strftime("%d %b %Y"))}
    assert "Reasoning: high\n" in render("gpt-oss", reasoning_effort="high")
    with pytest.raises(Exception, match="channel"):
        render("gpt-oss", CHAT[:2] + [{"role": "assistant", "content": "<|channel|>analysis<|message|>Hm."}] + CHAT[3:])
    # Ministral 3 Reasoning: without a system prompt the template supplies its own, which asks for [THINK] blocks;
    # roles must alternate.
    assert render("ministral-3-reasoning", CHAT[1:]).startswith("<s>[SYSTEM_PROMPT]# HOW YOU SHOULD THINK AND ANSWER")
    with pytest.raises(Exception, match="must alternate"):
        render("ministral-3-reasoning", CHAT[:2] + CHAT[1:2])
    # LFM2.5-Instruct keeps only the last answer's thinking (keep_past_thinking defaults to false).
    lfm = render("lfm2.5", THOUGHTFUL)
    assert "A greeting" not in lfm and "<think>\nSum.\n</think>\n\n4.<|im_end|>" in lfm
    # Granite 4.1, unlike 4.0, adds no default system prompt.
    assert render("granite-4.1", CHAT[1:]) == GRANITE_TURNS.split("\n", 1)[1]
