"""Tool calls below the API: the Hermes format's grammar on a real vocabulary (llguidance, the starter's tokens),
its parser, and conversations with tools rendered through real templates (llama.cpp's copies in the sdist)."""
from __future__ import annotations

import json
import re

import pytest
from support import llama_sdist

from app.engine.constraint import Constraint
from app.engine.errors import EngineError
from app.prompts import tool_prompt
from app.prompts.template import render_chat
from app.prompts.tools import (Gemma4, GptOss, Hermes, Lfm2, Llama3, Mistral, QwenXml, Tool, ToolChoice, Vocab,
                               prepare_messages, tool_format)

WEATHER = Tool("get_weather", "Current weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"],
    "additionalProperties": False})
TIME = Tool("get_time", "The time in a zone", {"type": "object", "properties": {"zone": {"type": "string"}},
                                                 "required": ["zone"], "additionalProperties": False})
TEXT_MARKERS = Vocab({}, (0, 2, 4))  # the starter's: <tool_call> is text there, and its end-of-generation tokens
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


@pytest.fixture(scope="module")
def vocab(starter_engine):
    return starter_engine.model


def accepts(model, grammar, text: str, special: tuple[str, ...] = ()) -> tuple[bool, bool]:
    """(every token of ``text`` allowed, the grammar satisfied after them). With ``special`` (a tiny model's
    SentencePiece vocabulary, which would put a space before the text after each special token): those markers
    are their tokens, and the rest is spelled in byte tokens, as the model may spell it."""
    c = Constraint(grammar, model)
    if special:
        ids = []
        for part in re.split("(" + "|".join(map(re.escape, special)) + ")", text):
            ids += [model.special_token(part)] if part in special else [3 + b for b in part.encode()]  # <0xNN>
    else:
        ids = model.tokenize(text, add_special=False, parse_special=False)
    n = c.valid_prefix(ids)
    for tok in ids[:n]:
        c.commit(tok)
    return n == len(ids), c.matcher.is_accepting()


def test_auto_allows_plain_text_or_text_then_valid_calls(vocab):
    g = Hermes().grammar([WEATHER, TIME], ToolChoice("auto"), TEXT_MARKERS)
    assert accepts(vocab, g, "It is sunny in Rome today.") == (True, True)
    assert accepts(vocab, g, "Let me check.\n" + CALL) == (True, True)
    assert accepts(vocab, g, CALL + "\n" + CALL.replace("Rome", "Oslo")) == (True, True)  # parallel
    assert accepts(vocab, g, "x <tool_call>\n{") == (True, False)  # unfinished: the call must be completed
    assert not accepts(vocab, g, '<tool_call>\n{"name": "get_wether"')[0]  # only declared functions
    assert not accepts(vocab, g, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Rome"}}')[0]
    assert not accepts(vocab, g, CALL + "\nAnd now some text.")[0]  # nothing after the calls


def test_required_named_and_single_calls(vocab):
    required = Hermes().grammar([WEATHER, TIME], ToolChoice("required"), TEXT_MARKERS)
    assert not accepts(vocab, required, "Sure!")[0] and accepts(vocab, required, CALL) == (True, True)
    named = Hermes().grammar([WEATHER, TIME], ToolChoice("required", name="get_time"), TEXT_MARKERS)
    assert not accepts(vocab, named, CALL)[0]
    time_call = CALL.replace('get_weather", "arguments": {"city"', 'get_time", "arguments": {"zone"')
    assert accepts(vocab, named, time_call)[0]
    single = Hermes().grammar([WEATHER], ToolChoice("required", parallel=False), TEXT_MARKERS)
    assert accepts(vocab, single, CALL) == (True, True)
    assert not accepts(vocab, single, CALL + "\n" + CALL)[0]


def test_the_parser_reads_calls_and_leaves_what_is_not_one():
    content, calls = Hermes().parse("Let me check.\n" + CALL + "\n" + CALL.replace("Rome", "Oslo"), [WEATHER])
    assert content == "Let me check.\n" and [c.name for c in calls] == ["get_weather"] * 2
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Rome"}, {"city": "Oslo"}]
    assert len({c.id for c in calls}) == 2 and all(len(c.id) == 9 and c.id.isalnum() for c in calls)
    assert Hermes().parse("No call here.", [WEATHER]) == ("No call here.", [])
    assert Hermes().parse("<tool_call>\nnot json\n</tool_call>", [WEATHER])[1] == []


HISTORY = [{"role": "user", "content": "Weather in Rome?"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "abcDEF123", "name": "get_weather",
                                                                "arguments": {"city": "Rome"}}]},
           {"role": "tool", "tool_call_id": "abcDEF123", "content": "22 C, sunny"}]


@pytest.mark.parametrize("family", ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "ibm-granite-granite-4.1"])
def test_hermes_families_render_tools_calls_and_results_with_their_own_template(family):
    """The golden strings: each template writes the tools, the earlier call (arguments as an object: a JSON string
    would be encoded twice) and its result; and what it writes for a call is what the parser reads back."""
    template = llama_sdist.templates()[family]
    assert isinstance(tool_format(template), Hermes)
    messages, variables = prepare_messages(HISTORY, [WEATHER], template)
    text = render_chat(template, messages, **variables)
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tool, described in the prompt
    assert CALL in text  # the earlier call, as the model writes one
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in text
    assert Hermes().parse(CALL, [WEATHER])[1][0].arguments == '{"city": "Rome"}'


def test_a_template_without_tools_is_taught_them_and_gets_calls_and_results_as_text(starter_engine):
    template = starter_engine.model.chat_template()
    messages, variables = prepare_messages(HISTORY, [WEATHER], template)
    assert variables == {} and messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert CALL in messages[2]["content"] and messages[3] == {
        "role": "user", "content": "<tool_response>\n22 C, sunny\n</tool_response>"}


@pytest.mark.parametrize("family, words", [("mistralai-Mistral-Nemo-Instruct-2407", "Mistral Nemo"),
                                           ("Mistral-Small-3.2-24B-Instruct-2506", "Mistral Small 3.2")])
def test_formats_not_read_yet_are_refused_by_name_not_answered_in_another(family, words):
    with pytest.raises(EngineError, match=words):
        tool_format(llama_sdist.templates()[family])


CITY = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                                "required": ["city"], "additionalProperties": False})


def tiny_pair(tmp_path_factory, family: str, **special):
    """A tiny target and a close draft whose vocabularies hold the given markers (``user_defined=``/``control=``)
    as special tokens, with ``family``'s template. (A space piece of its own, as real SentencePiece vocabularies
    have: without it a space is spelled in the bytes of "▁".)"""
    from support.tiny_gguf import write_model

    from app.engine import Engine, ModelSettings

    d = tmp_path_factory.mktemp("tool-vocab")
    kw = {**special, "extra_pieces": ("▁",), "chat_template": llama_sdist.templates()[family]}
    target = write_model(d / "t.gguf", seed=1, **kw)
    draft = write_model(d / "d.gguf", seed=3, base_seed=1, noise=0.02, **kw)
    return Engine(ModelSettings(target, n_ctx=2048), ModelSettings(draft, n_ctx=2048))


def greedy_off_and_on(engine, ids, grammar, shown):
    """The answer with speculation off, and with the draft model (6 tokens a round)."""
    from app.engine import Done, DraftParams, GenerationParams, SamplingParams

    runs = []
    for drafter, dp in (("none", DraftParams(draft_max=0)), ("model", DraftParams(draft_max=6, draft_p_min=0))):
        params = GenerationParams(max_tokens=80, sampling=SamplingParams(temperature=0.0), draft=dp, grammar=grammar,
                                  shown=shown)
        runs.append([ev for ev in engine.generate(ids, params, drafter) if isinstance(ev, Done)][0])
    return runs


@pytest.mark.parametrize("family, tokens, kind", [
    ("Qwen-Qwen2.5-7B-Instruct", ("<tool_call>", "</tool_call>"), "user_defined"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", ("[TOOL_CALLS]", "[ARGS]"), "control"),
    ("google-gemma-4-31B-it", ("<|tool_call>", "<tool_call|>", '<|"|>'), "control"),
    ("LFM2.5-8B-A1B", ("<|tool_call_start|>", "<|tool_call_end|>"), "control"),
])
def test_markers_held_as_one_special_token_call_exactly_under_speculation(tmp_path_factory, family, tokens, kind):
    """Qwen's vocabularies hold <tool_call> as one user-defined token, Mistral's [TOOL_CALLS] and [ARGS] as control
    tokens: llguidance reads them as tokens, never as text, so the grammar names them by id, and the answer's text
    writes them out to be read. Tiny models with such vocabularies and the family's template."""
    engine = tiny_pair(tmp_path_factory, family, **{kind: tokens})
    try:
        marker = engine.model.special_token(tokens[0])
        assert marker is not None and engine.model.special_token("get_weather") is None
        ids, grammar, fmt, shown = tool_prompt(engine.model, HISTORY[:1], [CITY],
                                               ToolChoice("required", parallel=False))
        assert shown == {engine.model.special_token(t) for t in tokens}
        plain, spec = greedy_off_and_on(engine, ids, grammar, shown)
    finally:
        engine.close()
    assert plain.finish_reason == "stop" and plain.token_ids[0] == marker  # the token, not its letters
    assert spec.token_ids == plain.token_ids and spec.stats.n_forced > 0
    content, calls = fmt.parse(plain.text, [CITY])
    assert content == "" and [c.name for c in calls] == ["get_weather"] and plain.text.startswith(tokens[0])
    assert isinstance(json.loads(calls[0].arguments)["city"], str)


XML_CALL = QwenXml().write("get_weather", {"city": "Rome", "days": 3})
XML_HISTORY = [HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "abcDEF123", "name": "get_weather",
                                                           "arguments": {"city": "Rome", "days": 3}}]}, HISTORY[2]]


@pytest.mark.parametrize("family", ["Qwen3.5-4B", "Qwen3-Coder"])
def test_qwen35_and_coder_write_calls_as_xml_and_they_are_read_back_typed(family):
    template = llama_sdist.templates()[family]
    assert isinstance(tool_format(template), QwenXml)
    messages, variables = prepare_messages(XML_HISTORY, [WEATHER], template)
    text = render_chat(template, messages, **variables)
    assert XML_CALL == ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
                        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    assert XML_CALL in text and "<tool_response>\n22 C, sunny\n</tool_response>" in text
    content, calls = QwenXml().parse("Checking.\n\n" + XML_CALL, [WEATHER])
    assert content == "Checking.\n\n" and json.loads(calls[0].arguments) == {"city": "Rome", "days": 3}


def test_the_xml_grammar_types_each_parameter(vocab):
    g = QwenXml().grammar([WEATHER, TIME], ToolChoice("required"), TEXT_MARKERS)
    assert accepts(vocab, g, XML_CALL) == (True, True)
    assert accepts(vocab, g, XML_CALL.replace("Rome", "Rome,\nItaly")) == (True, True)  # raw text, lines and all
    assert accepts(vocab, g, XML_CALL.replace("<parameter=days>\n3\n</parameter>\n", "")) == (True, True)
    assert not accepts(vocab, g, XML_CALL.replace("\n3\n", "\nthree\n"))[0]  # an integer must be one
    assert not accepts(vocab, g, XML_CALL.replace("<parameter=city>\nRome\n</parameter>\n", ""))[0]  # required
    auto = QwenXml().grammar([WEATHER], ToolChoice("auto"), TEXT_MARKERS)
    assert accepts(vocab, auto, "Plain answer.") == (True, True)
    assert accepts(vocab, auto, "Checking.\n\n" + XML_CALL) == (True, True)


def test_the_xml_grammar_keeps_raw_strings_to_their_schema(vocab):
    """String values are written raw, so the JSON schema's string rules are applied to the raw text: an enum's
    values only, and lengths counted in characters."""
    unit = Tool("convert", "", {"type": "object", "required": ["unit", "code"], "additionalProperties": False,
                                "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                               "code": {"type": "string", "minLength": 2, "maxLength": 3}}})
    g = QwenXml().grammar([unit], ToolChoice("required"), TEXT_MARKERS)
    call = lambda u, c: QwenXml().write("convert", {"unit": u, "code": c})  # noqa: E731
    assert accepts(vocab, g, call("celsius", "FR")) == (True, True)
    assert accepts(vocab, g, call("fahrenheit", "a\nb")) == (True, True)  # a newline is a character like any
    assert not accepts(vocab, g, call("Celsius", "FR"))[0]
    assert not accepts(vocab, g, call("celsius", "FRAN"))[0]
    assert not accepts(vocab, g, call("celsius", "F"))[0]


def test_llama3_writes_a_bare_json_call_read_back_and_constrained_only_when_required():
    template = llama_sdist.templates()["meta-llama-Llama-3.1-8B-Instruct"]
    fmt = tool_format(template)
    assert isinstance(fmt, Llama3)
    messages, variables = prepare_messages(HISTORY, [WEATHER], template)
    text = render_chat(template, messages, bos_token="<|begin_of_text|>", **variables)
    call = '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert fmt.write("get_weather", {"city": "Rome"}) == call
    assert f"<|start_header_id|>assistant<|end_header_id|>\n\n{call}<|eot_id|>" in text
    assert [(c.name, json.loads(c.arguments)) for c in fmt.parse(call, [WEATHER])[1]] == [("get_weather",
                                                                                             {"city": "Rome"})]
    assert fmt.parse('{"name": "unknown_fn", "parameters": {}}', [WEATHER])[1] == []  # not one of the tools
    assert fmt.grammar([WEATHER], ToolChoice("auto"), TEXT_MARKERS) is None  # (no marker: read afterwards)


def test_llama3_required_grammar(vocab):
    g = Llama3().grammar([WEATHER], ToolChoice("required"), TEXT_MARKERS)
    assert accepts(vocab, g, '{"name": "get_weather", "parameters": {"city": "Rome"}}') == (True, True)
    assert not accepts(vocab, g, "Sure")[0]


def test_ministral3_writes_tool_calls_name_args_and_they_are_read_back():
    template = llama_sdist.templates()["mistralai-Ministral-3-14B-Reasoning-2512"]
    fmt = tool_format(template)
    assert isinstance(fmt, Mistral)
    history = HISTORY + [{"role": "assistant", "content": "Sunny, 22 C."}, {"role": "user", "content": "Oslo?"}]
    messages, variables = prepare_messages(history, [WEATHER], template)
    text = render_chat(template, messages, bos_token="<s>", **variables)
    call = '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    assert fmt.write("get_weather", {"city": "Rome"}) == call and call in text
    assert "[AVAILABLE_TOOLS]" in text and "[TOOL_RESULTS]22 C, sunny[/TOOL_RESULTS]" in text
    content, calls = fmt.parse("Checking." + call + call.replace("Rome", "Oslo"), [WEATHER])
    assert content == "Checking." and [json.loads(c.arguments)["city"] for c in calls] == ["Rome", "Oslo"]


def test_the_mistral_grammar(vocab):
    g = Mistral().grammar([WEATHER, TIME], ToolChoice("required"), TEXT_MARKERS)
    call = '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    assert accepts(vocab, g, call) == (True, True) and accepts(vocab, g, call + call) == (True, True)
    assert not accepts(vocab, g, '[TOOL_CALLS]get_weather[ARGS]{"zone": "UTC"}')[0]
    auto = Mistral().grammar([WEATHER], ToolChoice("auto", parallel=False), TEXT_MARKERS)
    assert accepts(vocab, auto, "Hello there.") == (True, True) and accepts(vocab, auto, "Ok." + call) == (True, True)
    assert not accepts(vocab, auto, call + call)[0]


def test_gemma4_writes_calls_in_its_own_object_syntax_and_they_are_read_back():
    template = llama_sdist.templates()["google-gemma-4-31B-it"]
    fmt = tool_format(template)
    assert isinstance(fmt, Gemma4)
    args = {"city": "Rome", "days": 3, "flags": {"b": [1, "x, y"], "a": True}}
    history = [HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "abcDEF123", "name": "get_weather",
                                                          "arguments": args}]}, HISTORY[2]]
    messages, variables = prepare_messages(history, [WEATHER], template)
    text = render_chat(template, messages, bos_token="<bos>", **variables)
    call = '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:3,flags:{a:true,b:[1,<|"|>x, y<|"|>]}}<tool_call|>'
    assert fmt.write("get_weather", args) == call and call in text
    assert '<|tool_response>response:get_weather{value:<|"|>22 C, sunny<|"|>}<tool_response|>' in text
    content, calls = fmt.parse("Checking." + call, [WEATHER])
    assert content == "Checking." and json.loads(calls[0].arguments) == args


def test_the_gemma4_grammar_follows_the_schema_in_gemma_syntax(vocab):
    tool = Tool("get_weather", "", {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string", "enum": ["c", "f"]}}})
    g = Gemma4().grammar([tool, TIME], ToolChoice("required"), TEXT_MARKERS)
    q = '<|"|>'
    ok = f"<|tool_call>call:get_weather{{city:{q}Rome{q},days:3,units:{q}c{q}}}<tool_call|>"
    assert accepts(vocab, g, ok) == (True, True)
    assert accepts(vocab, g, ok.replace(",days:3", "")) == (True, True)  # optional keys left out, commas right
    assert accepts(vocab, g, f"<|tool_call>call:get_weather{{city:{q}Rome{q}}}<tool_call|>") == (True, True)
    assert not accepts(vocab, g, ok.replace("days:3", "days:three"))[0]
    assert not accepts(vocab, g, ok.replace(f"units:{q}c{q}", f"units:{q}k{q}"))[0]  # the enum
    assert not accepts(vocab, g, "<|tool_call>call:get_weather{days:3}<tool_call|>")[0]  # city is required
    assert not accepts(vocab, g, f"<|tool_call>call:get_weather{{,city:{q}Rome{q}}}")[0]


@pytest.mark.parametrize("family", ["LFM2.5-8B-A1B", "LFM2.5-Instruct"])
def test_lfm2_writes_python_calls_and_they_are_read_back(family):
    """LFM2.5-8B-A1B's template writes earlier calls itself; LFM2.5-Instruct's lists the tools but writes no calls,
    so they are written into the assistant's text, the same way."""
    template = llama_sdist.templates()[family]
    fmt = tool_format(template)
    assert isinstance(fmt, Lfm2)
    args = {"city": "Rome", "days": 3}
    history = [HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "abcDEF123", "name": "get_weather",
                                                          "arguments": args}]}, HISTORY[2]]
    messages, variables = prepare_messages(history, [WEATHER], template)
    text = render_chat(template, messages, bos_token="<|startoftext|>", **variables)
    call = "<|tool_call_start|>[get_weather(city='Rome', days=3)]<|tool_call_end|>"
    assert fmt.write("get_weather", args) == call and call in text and "List of tools: [" in text
    content, calls = fmt.parse("Sure." + call.replace(")]", "), get_time(zone='UTC')]"), [WEATHER, TIME])
    assert content == "Sure." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", args), ("get_time", {"zone": "UTC"})]
    assert fmt.parse('<|tool_call_start|>[get_weather(city="Rome", ok=true)]<|tool_call_end|>', [WEATHER])[1]


def test_the_lfm2_grammar(vocab):
    g = Lfm2().grammar([WEATHER, TIME], ToolChoice("required"), TEXT_MARKERS)
    call = "<|tool_call_start|>[get_weather(city='Rome', days=3)]<|tool_call_end|>"
    assert accepts(vocab, g, call) == (True, True)
    assert accepts(vocab, g, call.replace(", days=3", "")) == (True, True)
    assert accepts(vocab, g, call.replace(")]", "), get_time(zone='UTC')]")) == (True, True)
    assert not accepts(vocab, g, call.replace("days=3", "days='3'"))[0]
    assert not accepts(vocab, g, call.replace("city='Rome', ", ""))[0]  # city is required


HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")


def test_gpt_oss_writes_calls_as_harmony_messages_and_they_are_read_back():
    template = llama_sdist.templates()["openai-gpt-oss-120b"]
    fmt = tool_format(template)
    assert isinstance(fmt, GptOss)
    messages, variables = prepare_messages(HISTORY, [WEATHER], template)
    text = render_chat(template, messages, **variables)
    call = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>'
    assert fmt.write("get_weather", {"city": "Rome"}) == call and call in text
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"22 C, sunny"<|end|>' in text
    said = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}')
    content, calls = fmt.parse(said, [WEATHER])
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Rome"})]
    other = 'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'  # its other spelling
    assert json.loads(fmt.parse("<|start|>assistant " + other, [WEATHER])[1][0].arguments) == {"city": "Oslo"}
    answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    assert fmt.parse(answer, [WEATHER]) == ("It is sunny.", [])
    assert fmt.visible(answer[:-3]) == "It is sun"  # what a stream shows so far: the final channel only


def test_gpt_oss_replays_several_calls_as_one_call_each_with_its_result():
    template = llama_sdist.templates()["openai-gpt-oss-120b"]
    two = [HISTORY[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "aaaaaaaa1", "name": "get_weather", "arguments": {"city": "Rome"}},
        {"id": "bbbbbbbb2", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "tool_call_id": "bbbbbbbb2", "content": "5 C"},
        {"role": "tool", "tool_call_id": "aaaaaaaa1", "content": "22 C"}]
    messages, variables = prepare_messages(two, [WEATHER], template)
    assert [(m["role"], m.get("content")) for m in messages[1:]] == [
        ("assistant", ""), ("tool", "22 C"), ("assistant", ""), ("tool", "5 C")]
    text = render_chat(template, messages, **variables)
    assert text.index('"Rome"') < text.index('"22 C"') < text.index('"Oslo"') < text.index('"5 C"')


def test_gpt_oss_grammar_and_a_call_exact_under_speculation(tmp_path_factory):
    engine = tiny_pair(tmp_path_factory, "openai-gpt-oss-120b", control=HARMONY)
    try:
        model = engine.model
        _, auto, fmt, shown = tool_prompt(engine.model, HISTORY[:1], [CITY], ToolChoice("auto"))
        assert shown == {model.special_token(t) for t in HARMONY[:5]}

        def allowed(text):
            return accepts(model, auto, text, special=HARMONY)

        answer = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi"
        assert allowed(answer) == (True, True)
        call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'
        assert allowed(call) == (True, True) and allowed(call[:-2]) == (True, False)
        assert not allowed("<|channel|>commentary to=functions.get_time")[0]  # not one of the tools
        ids, grammar, fmt, shown = tool_prompt(engine.model, HISTORY[:1], [CITY], ToolChoice("required"))
        plain, spec = greedy_off_and_on(engine, ids, grammar, shown)
    finally:
        engine.close()
    assert plain.finish_reason == "stop" and spec.token_ids == plain.token_ids and spec.stats.n_forced > 0
    content, calls = fmt.parse(plain.text, [CITY])
    assert [c.name for c in calls] == ["get_weather"] and isinstance(json.loads(calls[0].arguments)["city"], str)
