"""OpenAI's Responses API (`/v1/responses`): `specchat serve` on the starter pair driven by the official `openai`
client, whole and streamed (raw events and the client's own accumulating stream), with speculation and identical
with it off, function tools and their outputs, `text.format` JSON schema, and the errors of what is not supported."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from support.servers import specchat_serve

KEY = "sk-test-responses"
ASK = "Name three colours of the rainbow."
GREEDY = dict(temperature=0, max_output_tokens=40)
OFF = {"speculative.n_max": 0}


@pytest.fixture(scope="module")
def server(specchat_home):
    with specchat_serve(specchat_home, KEY) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=300)


def _timings(obj) -> dict:
    return obj.model_extra["timings"]


def test_a_response_with_usage_and_speculative_timings(client):
    r = client.responses.create(model="gpt-4.1", input=ASK, instructions="Answer in one line.", **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "gpt-4.1"
    assert r.status in ("completed", "incomplete") and r.instructions == "Answer in one line."
    [message] = r.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.content[0].type == "output_text" and r.output_text == message.content[0].text and r.output_text
    t = _timings(r)
    assert r.usage.output_tokens == t["predicted_n"] <= 40 and r.usage.input_tokens == t["prompt_n"] + t["cache_n"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens == t["cache_n"]
    assert 0 < t["draft_n_accepted"] <= t["draft_n"]


def test_input_items_and_instructions_render_as_the_chat_endpoint_does(client):
    items = [{"role": "system", "content": "Answer in one line."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}]
    r = client.responses.create(model="starter", input=items, **GREEDY)
    chat = client.chat.completions.create(model="starter", max_tokens=40, temperature=0, messages=[
        {"role": "system", "content": "Answer in one line."}, {"role": "user", "content": ASK}])
    assert r.output_text == chat.choices[0].message.content
    plain = client.responses.create(model="starter", input=ASK, instructions="Answer in one line.", **GREEDY)
    assert plain.output_text == r.output_text


def test_streamed_events_in_order_and_the_same_text_with_speculation_off(client):
    whole = client.responses.create(model="starter", input=ASK, **GREEDY)
    off = client.responses.create(model="starter", input=ASK, **GREEDY, extra_body=OFF)
    assert off.output_text == whole.output_text and _timings(off)["draft_n"] == 0 and _timings(whole)["draft_n"] > 0
    events = list(client.responses.create(model="starter", input=ASK, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(e.delta for e in deltas) == whole.output_text  # in pieces, as it is made
    item_id = events[2].item.id
    assert item_id.startswith("msg_") and all(e.item_id == item_id for e in deltas)
    done = events[-1].response
    assert events[0].response.id == done.id and done.output_text == whole.output_text
    assert done.usage.output_tokens == whole.usage.output_tokens and _timings(done)["draft_n"] > 0
    assert "timings" not in (deltas[0].model_extra or {})  # per delta only with timings_per_token
    with client.responses.stream(model="starter", input=ASK, **GREEDY, extra_body=OFF) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == whole.output_text and _timings(final)["draft_n"] == 0


def test_max_output_tokens_cuts_and_says_so(client):
    r = client.responses.create(model="starter", input=ASK, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = list(client.responses.create(model="starter", input=ASK, temperature=0, max_output_tokens=3,
                                          stream=True, extra_body={"timings_per_token": True}))
    assert events[-1].type == "response.completed" and events[-1].response.status == "incomplete"
    counts = [e.model_extra["timings"]["predicted_n"] for e in events if e.type == "response.output_text.delta"]
    assert counts and counts == sorted(counts) and counts[-1] <= 3


WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                          "required": ["city"], "additionalProperties": False}}
ASK_WEATHER = "What is the weather in Paris?"


def _calls(r) -> list[tuple[str, dict]]:
    return [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]


def test_function_tools_give_function_call_items_streamed_and_not_and_identical_with_speculation_off(client):
    kw = dict(model="starter", input=ASK_WEATHER, tools=[WEATHER], tool_choice="required", temperature=0,
              max_output_tokens=80, parallel_tool_calls=False)
    r = client.responses.create(**kw)
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.id == f"fc_{call.call_id}" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert 0 < _timings(r)["draft_n_forced"] <= _timings(r)["draft_n"]  # the call's syntax was drafted free
    off = client.responses.create(**kw, extra_body=OFF)
    assert _calls(off) == _calls(r) and _timings(off)["draft_n"] == 0
    events = list(client.responses.create(**kw, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(call.arguments)
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert added and added[0].name == "get_weather" and added[0].arguments == ""
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert _calls(final) == _calls(r)
    named = client.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert [n for n, _ in _calls(named)] == ["get_weather"]


def test_a_function_call_output_round_trip(client):
    kw = dict(model="starter", tools=[WEATHER], temperature=0, max_output_tokens=60)
    first = client.responses.create(input=ASK_WEATHER, tool_choice="required", parallel_tool_calls=False, **kw)
    call = next(o for o in first.output if o.type == "function_call")
    history = [{"role": "user", "content": ASK_WEATHER},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21, "sky": "clear"}'}]
    answer = client.responses.create(input=history, tool_choice="none", **kw)
    assert answer.output_text and not _calls(answer)
    chat = client.chat.completions.create(model="starter", temperature=0, max_tokens=60, tool_choice="none", tools=[
        {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}], messages=[
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp_c": 21, "sky": "clear"}'}])
    assert answer.output_text == chat.choices[0].message.content  # the same conversation, the same prompt


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}}}


def test_text_format_json_schema_validates_and_is_identical_with_speculation_off(client):
    kw = dict(model="starter", input="Describe a fictional person as JSON with a name and an age.", temperature=0,
              max_output_tokens=80, text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                     "strict": True}})
    on = client.responses.create(**kw)
    jsonschema.validate(json.loads(on.output_text), PERSON)
    assert on.text.format.type == "json_schema" and 0 < _timings(on)["draft_n_forced"]
    off = client.responses.create(**kw, extra_body=OFF)
    assert off.output_text == on.output_text


@pytest.mark.parametrize("body, param, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({}, "input", "'input' must be"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "not supported"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text", "json_schema"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"input": "hi", "max_output_tokens": "many"}, "max_tokens", "integer"),
])
def test_what_is_not_supported_or_malformed_is_a_400_naming_the_field(server, client, body, param, words):
    r = httpx.post(f"{server}/responses", json={"model": "starter", **body}, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["param"] == param
    assert client.responses.create(model="starter", input="hi", max_output_tokens=4).output_text


def test_non_function_tools_are_skipped_and_the_unprefixed_route_answers(server):
    base = server.rsplit("/v1", 1)[0]
    r = httpx.post(f"{base}/responses", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                   json={"input": ASK, "max_output_tokens": 8, "temperature": 0, "tools": [{"type": "web_search"}]})
    assert r.status_code == 200 and r.json()["output"][0]["type"] == "message" and r.json()["tools"] == []


def test_items_are_read_into_chat_messages():
    from app.server.requests.responses import chat_body

    body = chat_body({"instructions": "Be brief.", "max_output_tokens": 9, "tools": [WEATHER], "input": [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Rain"}]}]})
    assert body["max_tokens"] == 9 and body["tools"][0]["function"]["name"] == "get_weather"
    calls = [{"id": c, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
             for c, city in (("c1", "Paris"), ("c2", "Lyon"))]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}], "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "Rain"}]}]
