"""Anthropic's Messages API (``/v1/messages``) driven by the official ``anthropic`` client on tiny models, in this
process: whole and streamed answers with speculation, identical with it off, Anthropic's error shape, and the key as
``x-api-key`` under --listen."""
from __future__ import annotations

import anthropic
import httpx
import pytest
from support.servers import serve_in_thread

KEY = "sk-test-specchat"
ASK = [{"role": "user", "content": "the cat"}]
GREEDY = {"temperature": 0}  # (the client of 2026 names no sampling fields: they go as extra_body)


@pytest.fixture(scope="module")
def served(models):
    """The API on tiny models behind the guard, listening (so the key guards /v1): (url, the loaded pair's name)."""
    from fastapi import FastAPI

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.guard import Access, Guard
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=1024))
    root = FastAPI()
    root.mount("/v1", ApiServer(rt).app())
    with serve_in_thread(lambda port: Guard(root, Access.serving(port, listen=True, key=KEY))) as url:
        yield url.rstrip("/"), rt.spec.describe()
    rt.close()


@pytest.fixture(scope="module")
def client(served):
    return anthropic.Anthropic(base_url=served[0], api_key=KEY, max_retries=0, timeout=120)


def test_a_message_with_usage_and_speculative_timings(client, served):
    r = client.messages.create(model=served[1], max_tokens=24, messages=ASK, extra_body=GREEDY,
                               system=[{"type": "text", "text": "You are terse."}])
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == served[1]
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    t = r.model_extra["timings"]
    assert r.usage.output_tokens == t["predicted_n"] <= 24 and r.usage.input_tokens == t["prompt_n"] > 0
    assert r.usage.cache_read_input_tokens == t["cache_n"]
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]


def test_greedy_text_is_the_same_streamed_and_with_speculation_off(client, served):
    kw = dict(model=served[1], max_tokens=40,
              messages=[{"role": "user", "content": [{"type": "text", "text": "the cat"}]},
                        {"role": "assistant", "content": "sat"}, {"role": "user", "content": "on the"}])
    on = client.messages.create(**kw, extra_body=GREEDY)
    off = client.messages.create(**kw, extra_body={**GREEDY, "speculative.n_max": 0})
    assert off.content[0].text == on.content[0].text and off.model_extra["timings"]["draft_n"] == 0
    with client.messages.stream(**kw, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == on.content[0].text == final.content[0].text
    assert final.stop_reason == on.stop_reason and final.usage.output_tokens == on.usage.output_tokens
    events = [e.type for e in client.messages.create(**kw, stream=True, extra_body=GREEDY)]
    assert events[:2] == ["message_start", "content_block_start"] and "content_block_delta" in events
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    raw = httpx.post(f"{served[0]}/v1/messages", json={**kw, **GREEDY, "stream": True}, headers={"x-api-key": KEY},
                     timeout=120).text  # (the client keeps pings to itself)
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"] and names[-1] == "message_stop"
    assert raw.endswith("\n\n") and '"stop_reason": "' in raw and '"timings": {' in raw


def test_stop_reasons(client, served):
    full = client.messages.create(model=served[1], max_tokens=30, messages=ASK, extra_body=GREEDY).content[0].text
    cut = client.messages.create(model=served[1], max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    word = next(w for w in full.split() if len(w) > 2 and full.index(w) > 0)
    r = client.messages.create(model=served[1], max_tokens=30, messages=ASK, stop_sequences=[word], extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word and full.startswith(r.content[0].text)


def test_missing_max_tokens_and_bad_requests_are_anthropic_errors(served):
    url, name = served
    r = httpx.post(f"{url}/v1/messages", json={"model": name, "messages": ASK}, headers={"x-api-key": KEY})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": r.json()["error"]
                                                   ["message"]}} and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/messages", json={"model": name, "max_tokens": 8, "messages": []},
                   headers={"x-api-key": KEY})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0).messages.create(
            model=name, max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])


def test_the_key_is_taken_as_x_api_key_or_bearer_under_listen(served):
    url, name = served
    body = {"model": name, "max_tokens": 4, "messages": ASK}
    assert httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
    assert httpx.post(f"{url}/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}).status_code == 200
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": ""}):
        assert httpx.post(f"{url}/v1/messages", json=body, headers=headers).status_code == 401
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model=name, max_tokens=4, messages=ASK)


WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                            "required": ["city"], "additionalProperties": False}}


def test_tools_tool_use_and_tool_result_are_read_as_the_chat_endpoint_takes_them():
    from app.server.requests.anthropic import chat_body

    body = chat_body({"max_tokens": 9, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather",
                                                                          "disable_parallel_tool_use": True},
                      "messages": [{"role": "user", "content": "weather in Paris?"},
                                   {"role": "assistant", "content": [
                                       {"type": "text", "text": "Looking."},
                                       {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                        "input": {"city": "Paris"}}]},
                                   {"role": "user", "content": [
                                       {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                       {"type": "text", "text": "And tomorrow?"}]}]})
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "description":
                                                               WEATHER["description"],
                                                               "parameters": WEATHER["input_schema"]}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["messages"][1:] == [
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "And tomorrow?"}]
    assert chat_body({"max_tokens": 9, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}})[
        "tool_choice"] == "required"


def _answer(reader, first=(), rest=None):
    """An answer under way, as ``ApiServer.begin`` makes one, around hand-made events."""
    import asyncio

    from app.engine import GenerationParams
    from app.server.answer import Answer
    from app.server.requests.openai import Job

    async def nothing():
        return
        yield

    job = Job(model=None, messages=[], prompt=None, params=GenerationParams(), drafter="off", stream=True,
              include_usage=False, timings_per_token=False, template_variables={})
    watch = asyncio.ensure_future(asyncio.sleep(60))
    return Answer(job, [0] * 5, job.params, reader, None, "m", list(first), rest or nothing(), watch, True,
                  id="msg_1")


def test_a_call_in_the_answer_is_a_tool_use_block():
    import asyncio

    from app.engine import Done, Stats
    from app.prompts.tools.base import ToolCall
    from app.server.apis.anthropic import message

    class Reader:
        def parse(self, text, offered):
            return "", [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]

    async def run():
        return message(_answer(Reader()), Done("stop", "<tool_call>...", [1, 2], Stats()))

    m = asyncio.run(run())
    assert m["content"] == [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert m["stop_reason"] == "tool_use"


def test_a_tool_result_round_trip_on_the_server_is_the_same_with_speculation_off(client, served):
    history = [{"role": "user", "content": "weather in Paris?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                  "input": {"city": "Paris"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": "Sunny, 21C"}]}]}]
    kw = dict(model=served[1], max_tokens=20, messages=history, tools=[WEATHER], tool_choice={"type": "none"})
    on = client.messages.create(**kw, extra_body=GREEDY)
    off = client.messages.create(**kw, extra_body={**GREEDY, "speculative.n_max": 0})
    plain = client.messages.create(model=served[1], max_tokens=20, messages=ASK, extra_body=GREEDY)
    prompt = [r.usage.input_tokens + r.usage.cache_read_input_tokens for r in (on, off, plain)]
    assert on.content == off.content and prompt[0] == prompt[1] > prompt[2]
    assert off.usage.cache_read_input_tokens > 0  # the same prompt again: reused, as llama-server counts it


def test_a_streamed_call_is_a_tool_use_block_with_its_input_as_json_delta():
    import asyncio
    import json

    from app.engine import Done, Stats, TextDelta
    from app.prompts.tools.base import ToolCall
    from app.server.answer import stream
    from app.server.apis.anthropic import Events

    class Reader:
        def visible(self, text):
            return text.split("<tool_call>")[0]

        def parse(self, text, offered):
            return self.visible(text), [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]

    logged = []

    async def rest():
        yield [TextDelta("{...}</tool_call>", [3], False), Done("stop", "Hi<tool_call>{...}</tool_call>", [1], Stats())]

    async def run():
        answer = _answer(Reader(), [TextDelta("Hi<tool_call>", [1], False)], rest())
        return [e async for e in stream(answer, Events(), logged.append)]

    events = [(e.split("\n")[0][7:], json.loads(e.split("\n")[1][6:])) for e in asyncio.run(run())]
    assert [name for name, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Hi"}
    assert events[5][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    assert events[6][1] == {"type": "content_block_delta", "index": 1,
                            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}}
    assert events[8][1]["delta"]["stop_reason"] == "tool_use" and logged


@pytest.fixture(scope="module")
def starter(specchat_home):
    """`specchat serve --pair starter` (SmolLM2, which writes calls), driven by the anthropic client."""
    from support.servers import specchat_serve

    with specchat_serve(specchat_home, KEY) as url:
        yield anthropic.Anthropic(base_url=url.rstrip("/").removesuffix("/v1"), api_key=KEY, max_retries=0,
                                  timeout=300)


def test_starter_calls_a_tool_streamed_and_not_identically_with_speculation_off(starter):
    kw = dict(model="starter", max_tokens=80, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=[WEATHER], tool_choice={"type": "any"})
    on = starter.messages.create(**kw, extra_body=GREEDY)
    uses = [b for b in on.content if b.type == "tool_use"]
    assert on.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert isinstance(uses[0].input["city"], str) and on.model_extra["timings"]["draft_n"] > 0
    off = starter.messages.create(**kw, extra_body={**GREEDY, "speculative.n_max": 0})
    with starter.messages.stream(**kw, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    for other in (off, streamed):
        assert [(b.type, b.model_dump().get("input"), b.model_dump().get("text")) for b in other.content] == [
            (b.type, b.model_dump().get("input"), b.model_dump().get("text")) for b in on.content]
        assert other.stop_reason == "tool_use"


def test_starter_text_is_the_same_streamed_and_with_speculation_off(starter):
    kw = dict(model="starter", max_tokens=48, system="You are helpful.",
              messages=[{"role": "user", "content": "Name three colours of the rainbow."}])
    on = starter.messages.create(**kw, extra_body=GREEDY)
    off = starter.messages.create(**kw, extra_body={**GREEDY, "speculative.n_max": 0})
    with starter.messages.stream(**kw, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
    assert len(on.content[0].text) > 10 and off.content[0].text == on.content[0].text == streamed
    t = on.model_extra["timings"]
    assert 0 < t["draft_n_accepted"] <= t["draft_n"] and off.model_extra["timings"]["draft_n"] == 0
