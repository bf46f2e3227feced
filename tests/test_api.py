"""The OpenAI-compatible API: `specchat serve` on the starter pair, driven by the official `openai` client (and raw
HTTP for what a broken client sends), plus the queue and the no-pair case in-process on tiny models."""
from __future__ import annotations

import json
import re
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from support.servers import serve_in_thread, specchat_serve

KEY = "sk-test-specchat"
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def server(specchat_home):
    with specchat_serve(specchat_home, KEY, "--metrics") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=300)


def _timings(obj) -> dict:
    return obj.model_extra["timings"]


def test_models_lists_the_loaded_pair(client):
    models = client.models.list().data
    assert models[0].id == "starter" and models[0].model_extra["loaded"] is True
    assert models[0].model_extra["speculation"].startswith("draft model SmolLM2")  # how it speculates by default


def test_chat_completion_with_usage_and_speculative_timings(client):
    r = client.chat.completions.create(model="starter", messages=PROMPT, max_tokens=32, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content) > 10 and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == _timings(r)["predicted_n"] <= 32
    assert r.usage.prompt_tokens > 5 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    t = _timings(r)
    assert set(t) >= {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                      "predicted_per_second", "draft_n", "draft_n_accepted"}
    assert 0 < t["draft_n_accepted"] <= t["draft_n"] and t["predicted_per_second"] > 0


def test_streamed_chat_matches_the_whole_answer_and_ends_with_timings_and_usage(client):
    whole = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=40, temperature=0)
    chunks = list(client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy: the same answer, streamed
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3  # in pieces, as it is made
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    t = _timings(last)
    assert 0 < t["draft_n_accepted"] <= t["draft_n"] and t["predicted_n"] == whole.usage.completion_tokens
    assert "timings" not in (chunks[1].model_extra or {})  # only the last, unless timings_per_token
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert _timings(chunks[-1])["predicted_n"] == whole.usage.completion_tokens  # the usage chunk has them too


def test_timings_per_token_puts_running_figures_on_every_chunk(client):
    chunks = list(client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=24, stream=True,
                                                 extra_body={"timings_per_token": True}))
    counts = [_timings(c)["predicted_n"] for c in chunks[1:]]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    assert "timings" not in (chunks[0].model_extra or {})  # the role's chunk, before any token (as llama-server)


def test_completion_streamed_and_not(client):
    r = client.completions.create(model="starter", prompt="The capital of France is", max_tokens=16, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 16
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="starter", prompt="The capital of France is", max_tokens=16, temperature=0, stream=True))
    assert streamed == r.choices[0].text and _timings(r)["predicted_n"] == r.usage.completion_tokens


def test_chat_logprobs_through_the_openai_client_are_the_same_with_speculation_off(client):
    kw = dict(model="starter", messages=PROMPT, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
    on = client.chat.completions.create(**kw)
    off = client.chat.completions.create(**kw, extra_body={"speculative.n_max": 0})
    content = on.choices[0].logprobs.content
    assert _timings(on)["draft_n_accepted"] > 0 and _timings(off)["draft_n"] == 0
    assert "".join(t.token for t in content) == on.choices[0].message.content and len(content) > 5
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob  # greedy: the top-1
    off_content = off.choices[0].logprobs.content
    assert [t.token for t in off_content] == [t.token for t in content]
    assert [t.logprob for t in off_content] == pytest.approx([t.logprob for t in content], abs=1e-3)
    streamed = [t for c in client.chat.completions.create(**kw, stream=True)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-3)


def test_stop_strings_end_the_answer_before_them(client):
    full = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=40,
                                          temperature=0).choices[0].message.content
    word = full.split()[3].strip(".,:;!")
    r = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=40, stop=[word], temperature=0)
    assert r.choices[0].finish_reason == "stop" and word not in r.choices[0].message.content
    assert full.startswith(r.choices[0].message.content)


def test_speculation_off_per_request_gives_the_same_greedy_output(client):
    on = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=48, temperature=0)
    off = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=48, temperature=0,
                                         extra_body={"speculative.n_max": 0})
    assert off.choices[0].message.content == on.choices[0].message.content
    assert _timings(off)["draft_n"] == 0 and _timings(on)["draft_n"] > 0
    ngram = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=48, temperature=0,
                                           extra_body={"drafter": "ngram", "speculative": {"n_max": 4}})
    assert ngram.choices[0].message.content == on.choices[0].message.content


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}}}
ASK_PERSON = [{"role": "user", "content": "Describe a fictional person as JSON with a name, an age and hobbies."}]


def test_response_format_json_schema_validates_and_is_identical_with_speculation_off(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    on = client.chat.completions.create(model="starter", messages=ASK_PERSON, max_tokens=150, temperature=0,
                                        response_format=fmt)
    off = client.chat.completions.create(model="starter", messages=ASK_PERSON, max_tokens=150, temperature=0,
                                         response_format=fmt, extra_body={"speculative.n_max": 0})
    answer = on.choices[0].message.content
    jsonschema.validate(json.loads(answer), PERSON)
    assert on.choices[0].finish_reason == "stop" and off.choices[0].message.content == answer
    t = _timings(on)
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]  # drafted tokens were verified
    assert 0 < t["draft_n_forced"] <= t["draft_n"] and _timings(off)["draft_n"] == 0
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="starter", messages=ASK_PERSON, max_tokens=150, temperature=0, response_format=fmt, stream=True))
    assert streamed == answer


def test_json_object_and_llama_server_schema_and_grammar_fields(client):
    r = client.chat.completions.create(model="starter", messages=PROMPT, max_tokens=80, temperature=0,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still the start of an object
        assert r.choices[0].message.content.startswith("{")
    schema = {"type": "object", "properties": {"capital": {"type": "string", "enum": ["Paris", "Lyon"]}},
              "required": ["capital"], "additionalProperties": False}
    c = client.completions.create(model="starter", prompt="The capital of France, as JSON:", max_tokens=30,
                                  temperature=0, extra_body={"json_schema": schema})
    assert json.loads(c.choices[0].text)["capital"] in ("Paris", "Lyon")
    g = client.completions.create(model="starter", prompt="Is the sky blue? Answer:", max_tokens=10, temperature=0,
                                  extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert g.choices[0].text in (" yes", " no")


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "response_format", "strnig"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
    ({"json_schema": {"$ref": "#/nowhere"}}, "json_schema", "nowhere"),
    ({"grammar": 'root ::= "open'}, "grammar", "grammar"),
    ({"grammar": "root ::= x", "json_schema": {}}, "grammar", "not both"),
])
def test_a_schema_or_grammar_that_cannot_be_used_is_a_400_and_the_server_keeps_serving(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="starter", messages=PROMPT, max_tokens=8, extra_body=extra)
    body = err.value.body
    assert err.value.status_code == 400 and words in body["message"] and body["param"] == param
    assert client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=4).choices[0].message.content


@pytest.mark.parametrize("name", ["schema", "tools"])
def test_the_examples_of_the_api_docs_and_the_api_tab_work_as_written(server, capsys, monkeypatch, name):
    """docs/api.md's examples are the API tab's for `specchat serve --pair starter --port 8080`; run here against the
    test server (its own port, and a key: the tab's examples read it when one is set)."""
    from pathlib import Path

    from app.ui import render

    example = getattr(render, f"{name}_example")
    docs = (Path(__file__).parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    block = docs.split(f"<!-- {name}-example -->\n```python\n", 1)[1].split(f"```\n<!-- /{name}-example -->")[0]
    assert block.rstrip() == example("http://127.0.0.1:8080/v1", "starter", key=False)
    monkeypatch.setenv("SPECCHAT_API_KEY", KEY)
    code = compile(example(server, "starter", key=True), f"{name}_example", "exec")
    exec(code, {"__name__": "example"})  # noqa: S102 - our own example
    printed = capsys.readouterr().out.strip()
    assert printed
    if name == "schema":  # an object of the schema, and a count of forced tokens
        obj, forced = printed.rsplit(" ", 1)
        assert obj.startswith("{'city': ") and "'country': " in obj and int(forced) > 0
    else:  # a call per line: the function's name and its arguments
        for line in printed.splitlines():
            fn, args = line.split(" ", 1)
            assert fn == "get_weather" and isinstance(json.loads(args)["city"], str)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"],
        "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}, "required": ["zone"],
        "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _calls(r) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or []]


@pytest.mark.parametrize("choice, names", [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
])
def test_tool_choice_required_and_named_give_valid_calls(client, choice, names):
    r = client.chat.completions.create(model="starter", messages=ASK_WEATHER, tools=[WEATHER, CLOCK], max_tokens=120,
                                       temperature=0, tool_choice=choice)
    calls = _calls(r)
    assert r.choices[0].finish_reason == "tool_calls" and calls and {n for n, _ in calls} <= names
    for name, args in calls:
        jsonschema.validate(args, (WEATHER if name == "get_weather" else CLOCK)["function"]["parameters"])
    assert all(len(c.id) == 9 for c in r.choices[0].message.tool_calls)
    t = _timings(r)
    assert 0 < t["draft_n_forced"] <= t["draft_n"]  # the call's syntax and names were drafted free


def test_parallel_tool_calls_false_gives_one_call_and_none_gives_none(client):
    one = client.chat.completions.create(model="starter", messages=ASK_WEATHER, tools=[WEATHER], max_tokens=120,
                                         temperature=0, tool_choice="required", parallel_tool_calls=False)
    assert len(_calls(one)) == 1 and _calls(one)[0][0] == "get_weather"
    many = client.chat.completions.create(model="starter", messages=ASK_WEATHER, tools=[WEATHER], max_tokens=120,
                                          temperature=0, tool_choice="required")
    assert len(_calls(many)) >= 1
    none = client.chat.completions.create(model="starter", messages=ASK_WEATHER, tools=[WEATHER], max_tokens=24,
                                          temperature=0, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
    assert none.choices[0].finish_reason in ("stop", "length")
    auto = client.chat.completions.create(model="starter", messages=ASK_WEATHER, tools=[WEATHER], max_tokens=120,
                                          temperature=0)
    m = auto.choices[0]  # the 135M starter may answer or call: either way a well-formed answer
    assert (m.finish_reason == "tool_calls") == bool(m.message.tool_calls)
    assert m.message.tool_calls or "<tool_call>" not in (m.message.content or "")


def test_streamed_tool_call_deltas_concatenate_to_the_whole_answer(client):
    kw = dict(model="starter", messages=ASK_WEATHER, tools=[WEATHER, CLOCK], max_tokens=120, temperature=0,
              tool_choice="required")
    whole = client.chat.completions.create(**kw)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = d.id or c["id"]
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and [calls[i]["id"] for i in sorted(calls)][0]
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == _calls(whole)


def test_a_tool_result_round_trip_and_greedy_identical_with_speculation_off(client):
    kw = dict(model="starter", tools=[WEATHER], max_tokens=60, temperature=0)
    first = client.chat.completions.create(messages=ASK_WEATHER, tool_choice="required", parallel_tool_calls=False,
                                           **kw)
    off = client.chat.completions.create(messages=ASK_WEATHER, tool_choice="required", parallel_tool_calls=False,
                                         extra_body={"speculative.n_max": 0}, **kw)
    assert _calls(off) == _calls(first) and _timings(off)["draft_n"] == 0
    call = first.choices[0].message.tool_calls[0]
    history = ASK_WEATHER + [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21, "sky": "clear"}'}]
    answer = client.chat.completions.create(messages=history, tool_choice="none", **kw)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    kw.pop("tools")  # the history alone, no tools offered any more: the call and its result are still rendered
    again = client.chat.completions.create(messages=history, **kw)
    assert again.choices[0].message.content and again.choices[0].message.tool_calls is None


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "name of letters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "naming one of the tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tools", "not both"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="starter", messages=ASK_WEATHER, max_tokens=8, extra_body=extra)
    assert words in err.value.body["message"] and err.value.body["param"] == param


def test_the_api_key_is_required(server):
    for key in ("wrong", ""):
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=server, api_key=key or "x", max_retries=0,
                          default_headers={} if key else {"Authorization": ""}).models.list()
        assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"


@pytest.mark.parametrize("body, status, words", [
    ("{not json", 400, "not valid JSON"),
    (json.dumps({"messages": "hi"}), 400, "'messages' must be"),
    (json.dumps({"messages": PROMPT, "temperature": "hot"}), 400, "'temperature' must be a number"),
    (json.dumps({"messages": PROMPT, "top_k": -1}), 400, "top-k"),
    (json.dumps({"messages": PROMPT, "n": 9}), 400, "from 1 to 8"),
    (json.dumps({"messages": PROMPT, "n": 2, "stream": True}), 400, "answered whole"),
    (json.dumps({"messages": PROMPT, "speculative.n_max": 2, "speculative.n_min": 5}), 400, "draft-min"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400, "image_url part needs"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}), 400, "only text and image"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}), 400, "context holds"),
    (json.dumps([1, 2]), 400, "JSON object"),
])
def test_malformed_requests_get_openai_errors_and_the_server_keeps_serving(server, client, body, status, words):
    r = httpx.post(f"{server}/chat/completions", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and set(err) - {"n_prompt_tokens", "n_ctx"} == {"message", "type", "param", "code"}
    if err["type"] == "exceed_context_size_error":  # llama-server's, with its figures
        assert err["n_prompt_tokens"] >= err["n_ctx"] > 0
    assert client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=4).choices[0].message.content


def _tokens_predicted(server: str) -> int:
    """llama-server's counter of generated tokens (``--metrics``): what every generation so far has made."""
    text = httpx.get(server.rsplit("/v1", 1)[0] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=60).text
    return int(float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M).group(1)))


def test_a_client_that_goes_away_mid_stream_cancels_its_generation(server, client):
    before = _tokens_predicted(server)
    with httpx.stream("POST", f"{server}/chat/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                      json={"messages": [{"role": "user", "content": "Write a very long story."}],
                            "max_tokens": 1500, "ignore_eos": True, "stream": True}) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break  # and hang up: ignore_eos holds it to all 1500 tokens unless the hang-up stops it
    r = client.chat.completions.create(messages=PROMPT, model="starter", max_tokens=8)
    abandoned = _tokens_predicted(server) - before - r.usage.completion_tokens
    # The next request waits for the one before it: counted in tokens, not seconds (a busy host is slow, not wrong)
    assert 5 <= abandoned < 500, abandoned


def test_twenty_concurrent_streams_are_queued_and_all_correct(client):
    ask = dict(messages=PROMPT, model="starter", max_tokens=16, temperature=0)
    reference = client.chat.completions.create(**ask).choices[0].message.content
    results, errors = [None] * 20, []

    def one(i):
        try:
            results[i] = "".join(c.choices[0].delta.content or "" for c in
                                 client.chat.completions.create(**ask, stream=True) if c.choices)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and results == [reference] * 20


def test_ctrl_c_with_requests_queued_and_streaming_exits_cleanly(specchat_home):
    """Clients still reading long answers, more waiting their turn: Ctrl-C cancels them all and the server exits 0
    (specchat_serve asserts it, within its 30 s), not stuck behind the queue until a watchdog kills it."""
    errors, started = [], threading.Event()

    def long_answer(url):
        body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 3000,
                "stream": True}
        try:
            with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    started.set()
        except httpx.HTTPError as exc:  # the server going away mid-answer is expected here
            errors.append(exc)

    with specchat_serve(specchat_home) as url:
        threads = [threading.Thread(target=long_answer, args=(url,), daemon=True) for _ in range(6)]
        for t in threads:
            t.start()
        assert started.wait(120)  # one is streaming, five are queued behind it
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


# --- in-process: the queue bound, no pair --------------------------------------------------------------------
@pytest.fixture
def tiny_server(models):
    """The API on tiny models in this process, allowing one request at a time in the queue."""
    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=256))
    api = ApiServer(rt, max_waiting=1)
    with serve_in_thread(lambda port: api.app()) as url:
        yield url, rt, api
    rt.close()


def test_a_full_queue_answers_503_with_retry_after(tiny_server):
    url, rt, api = tiny_server
    body = {"prompt": "the cat", "max_tokens": 8}
    first = {}
    with rt.engine._lock:  # the engine is busy (as with a chat in the browser): the first request waits its turn
        t = threading.Thread(target=lambda: first.update(r=httpx.post(f"{url}/completions", json=body, timeout=60)))
        t.start()
        while api.waiting < 1:
            time.sleep(0.01)
        r = httpx.post(f"{url}/completions", json=body, timeout=60)
        assert r.status_code == 503 and r.headers["Retry-After"] and r.json()["error"]["code"] == "queue_full"
    t.join(60)
    assert first["r"].status_code == 200 and first["r"].json()["choices"][0]["text"]
    assert httpx.post(f"{url}/completions", json=body, timeout=60).status_code == 200  # served again


def test_no_pair_loaded_is_503(tiny_server):
    url, rt, _ = tiny_server
    rt.close()
    r = httpx.post(f"{url}/chat/completions", json={"messages": PROMPT}, timeout=30)
    assert r.status_code == 503 and "No model pair is loaded" in r.json()["error"]["message"]


def test_a_request_queued_while_another_pair_loads_is_told_to_retry_not_a_500(tiny_server):
    """The pair is replaced while a request waits for the engine: it gets 503 model_unloaded (Retry-After), and the
    next request is answered by the new pair."""
    from app.models.loader import LoadSpec

    url, rt, api = tiny_server
    body = {"prompt": "the cat", "max_tokens": 8}
    queued = {}
    engine = rt.engine
    with engine._lock:  # busy: the request queues behind this
        t = threading.Thread(target=lambda: queued.update(r=httpx.post(f"{url}/completions", json=body, timeout=60)))
        t.start()
        while api.waiting < 1:
            time.sleep(0.01)
        engine._pair.close()  # what Engine.close does once the engine is free
        engine._pair = None
    t.join(60)
    r = queued["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unloaded" and r.headers["Retry-After"]
    assert "send it again" in r.json()["error"]["message"]
    rt.engine = None
    rt.load(LoadSpec(target=rt.spec.target, draft=rt.spec.draft, ctx=256))
    assert httpx.post(f"{url}/completions", json=body, timeout=60).status_code == 200


# --- llama-server's serve flags -----------------------------------------------------------------------------------
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} says\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_llama_server_flags_set_names_request_defaults_the_template_and_metrics(specchat_home, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    flags = ("--alias", "local, gpt-4o-mini", "--tags", "chat,small", "--temp", "0", "-n", "5", "--seed", "7", "--top-k", "20",
             "--chat-template-file", str(template), "--jinja", "--reasoning", "off", "--metrics")
    with specchat_serve(specchat_home, None, *flags) as url:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        [model] = [m for m in c.models.list().data if m.model_extra["loaded"]]
        assert model.id == "gpt-4o-mini" and model.model_extra["aliases"] == ["gpt-4o-mini", "local"]
        assert model.model_extra["pair"] == "starter" and model.model_extra["tags"] == ["chat", "small"]
        r = c.chat.completions.create(model="anything", messages=PROMPT)  # no max_tokens, no temperature
        again = c.chat.completions.create(model="anything", messages=PROMPT)
        assert r.model == "gpt-4o-mini" and r.usage.completion_tokens <= 5
        assert r.usage.completion_tokens == 5 or r.choices[0].finish_reason == "stop"
        assert again.choices[0].message.content == r.choices[0].message.content  # --temp 0: greedy by default
        base = url.rsplit("/v1", 1)[0]
        props = httpx.get(f"{base}/props", timeout=30).json()
        params = props["default_generation_settings"]["params"]
        assert (params["n_predict"], params["temperature"], params["seed"], params["top_k"]) == (5, 0, 7, 20)
        assert props["chat_template"] == TEMPLATE and props["model_alias"] == "gpt-4o-mini"
        assert props["endpoint_metrics"] is True
        prompt = httpx.post(f"{base}/apply-template", json={"messages": PROMPT}, timeout=30).json()["prompt"]
        assert prompt.startswith(f"<|im_start|>user says\n{PROMPT[0]['content']}")  # the flag's template, rendered
        metrics = httpx.get(f"{base}/metrics", timeout=30)
        assert metrics.status_code == 200 and "llamacpp:spec_decode_num_accepted_tokens_total" in metrics.text


@pytest.mark.parametrize("flags, words", [
    (["--chat-template", "no-such-format"], "neither a Jinja template nor one of llama.cpp's formats"),
    (["--chat-template", "{{ x }}", "--chat-template-file", "t.jinja"], "not both"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "Cannot read"),
    (["--reasoning-format", "deepseek"], "not supported"),
    (["-n", "0"], "at least 1"),
])
def test_bad_llama_server_flags_are_one_clear_line_before_anything_loads(capsys, flags, words):
    from app.cli.main import main

    assert main(["serve", "--pair", "starter", *flags]) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_alias_flags_are_split_and_sorted():
    from app.cli.serve import aliases_flag

    assert aliases_flag(["c, b", "a,c", " "]) == ("a", "b", "c")  # sorted, as llama-server's std::set
