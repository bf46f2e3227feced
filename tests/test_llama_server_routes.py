"""llama-server's own routes (app/server/apis/llama_server.py) on tiny models, in this process, behind the guard as
`specchat serve` puts them: /health, /props, /tokenize, /detokenize, /apply-template, /slots, under /v1 and
without it, and the unprefixed /models, /completions, /chat/completions guarded exactly as /v1."""
from __future__ import annotations

import json
import threading
import time
from datetime import date

import httpx
import pytest
from support.servers import serve_in_thread

KEY = "sk-test-llama-routes"
PROMPT = [{"role": "user", "content": "the cat"}]


def _root(api):
    from fastapi import FastAPI

    root = FastAPI()
    root.mount("/v1", api.app())
    root.get("/")(lambda: {"page": "the app"})
    return root


@pytest.fixture
def tiny_server(models):
    """The API on tiny models behind the guard (loopback, no key) and llama-server's aliases, as serve wires them."""
    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.guard import Access, Guard
    from app.server.apis.llama_server import LlamaAliases
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=256))
    api = ApiServer(rt)
    with serve_in_thread(lambda port: LlamaAliases(Guard(_root(api), Access.serving(port, listen=False)))) as url:
        yield url, rt, api
    rt.close()


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_health_is_ok_with_a_pair_and_loading_without(tiny_server, prefix):
    url, rt, _ = tiny_server
    r = httpx.get(f"{url}{prefix}/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    rt.close()
    r = httpx.get(f"{url}{prefix}/health", timeout=30)
    assert r.status_code == 503
    assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    assert httpx.get(f"{url}{prefix}/props", timeout=30).status_code == 503
    assert httpx.post(f"{url}{prefix}/tokenize", json={"content": "x"}, timeout=30).status_code == 503


def test_unprefixed_aliases_answer_as_v1(tiny_server):
    url, _, _ = tiny_server
    models = httpx.get(f"{url}/models", timeout=30).json()
    v1_models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [m["id"] for m in v1_models["data"]]
    assert models["object"] == "list" and models["data"][0]["loaded"] is True
    body = {"prompt": "the cat", "max_tokens": 6, "temperature": 0}
    plain, v1 = (httpx.post(f"{url}{p}/completions", json=body, timeout=60).json() for p in ("", "/v1"))
    # llama-server's unprefixed /completions is its native completion, /v1/completions OpenAI's
    assert v1["object"] == "text_completion" and plain["content"] == v1["choices"][0]["text"] and plain["stop"]
    chat = httpx.post(f"{url}/chat/completions", json={"messages": PROMPT, "max_tokens": 6}, timeout=60).json()
    assert chat["object"] == "chat.completion" and "timings" in chat


def test_props_has_context_template_and_the_pair(tiny_server, models):
    url, rt, _ = tiny_server
    for prefix in ("", "/v1"):
        p = httpx.get(f"{url}{prefix}/props", timeout=30).json()
        settings = p["default_generation_settings"]
        assert settings["n_ctx"] == rt.engine.n_ctx == 256
        assert {"n_predict", "temperature", "top_k", "top_p", "min_p", "seed"} <= set(settings["params"])
        assert p["total_slots"] == 1 and p["model_path"] == str(models["target"])
        assert isinstance(p["chat_template"], str) and "llama-cpp-python" in p["build_info"]
        spec = p["speculative"]
        assert spec["target"] == "target.gguf" and spec["draft"] == "draft.gguf"
        assert spec["drafter"] in spec["drafters"] and spec["speculation"] and spec["draft_max"] >= 1


def test_tokenize_and_detokenize_round_trip_with_pieces(tiny_server):
    url, rt, _ = tiny_server
    ids = httpx.post(f"{url}/tokenize", json={"content": "the cat"}, timeout=30).json()["tokens"]
    assert ids == rt.engine.model.tokenize("the cat", add_special=False) and all(isinstance(t, int) for t in ids)
    with_bos = httpx.post(f"{url}/tokenize", json={"content": "the cat", "add_special": True}, timeout=30).json()
    assert with_bos["tokens"] == rt.engine.model.tokenize("the cat", add_special=True)
    pieces = httpx.post(f"{url}/v1/tokenize", json={"content": "the cat", "with_pieces": True}, timeout=30).json()
    assert [p["id"] for p in pieces["tokens"]] == ids
    # a piece that is not UTF-8 on its own comes as its bytes (the tiny vocabulary spells "▁" in three byte tokens)
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces["tokens"])
    assert any(isinstance(p["piece"], list) for p in pieces["tokens"]) and "t" in [p["piece"] for p in pieces["tokens"]]
    back = httpx.post(f"{url}/detokenize", json={"tokens": ids}, timeout=30).json()
    assert back["content"] == raw.decode() and back["content"].replace("\u2581", " ").strip() == "the cat"
    assert httpx.post(f"{url}/tokenize", json={}, timeout=30).json() == {"tokens": []}
    assert httpx.post(f"{url}/detokenize", json={}, timeout=30).json() == {"content": ""}
    bad = httpx.post(f"{url}/detokenize", json={"tokens": [10 ** 9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_apply_template_gives_the_prompt_the_chat_route_uses(tiny_server):
    from app.prompts import chat_prompt

    url, rt, _ = tiny_server
    r = httpx.post(f"{url}/apply-template", json={"messages": PROMPT}, timeout=30)
    assert r.status_code == 200 and r.json() == {"prompt": chat_prompt(rt.engine.model, PROMPT)}
    assert "the cat" in r.json()["prompt"]
    assert httpx.post(f"{url}/apply-template", json={"messages": "no"}, timeout=30).status_code == 400


def test_the_turn_left_closed_or_the_assistants_text_continued_as_llama_server_does(tiny_server):
    """``add_generation_prompt: false`` leaves the last turn closed; a last message that is the assistant's is
    continued (llama-server's prefill, or ``continue_final_message``), and the chat answer goes on from its text."""
    from app.prompts import chat_prompt

    url, rt, _ = tiny_server
    opened = chat_prompt(rt.engine.model, PROMPT)
    closed = httpx.post(f"{url}/apply-template", json={"messages": PROMPT, "add_generation_prompt": False}, timeout=30)
    assert closed.json()["prompt"] == chat_prompt(rt.engine.model, PROMPT, add_generation_prompt=False)
    assert opened.startswith(closed.json()["prompt"]) and opened != closed.json()["prompt"]
    prefilled = PROMPT + [{"role": "assistant", "content": " sat on"}]
    r = httpx.post(f"{url}/apply-template", json={"messages": prefilled}, timeout=30)
    assert r.json() == {"prompt": opened + " sat on"}
    parts = PROMPT + [{"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]}]
    r = httpx.post(f"{url}/apply-template", json={"messages": parts}, timeout=30)
    assert r.json() == {"prompt": opened + "Wh\n\nill"}  # (text parts of a continued message: llama.cpp's join)
    both = httpx.post(f"{url}/v1/chat/completions", json={"messages": prefilled, "continue_final_message": True},
                      timeout=30)
    assert both.status_code == 400
    assert both.json()["error"]["message"] == "Cannot set both add_generation_prompt and continue_final_message to true."
    user_last = httpx.post(f"{url}/apply-template", timeout=30,
                           json={"messages": PROMPT, "add_generation_prompt": False, "continue_final_message": True})
    assert user_last.status_code == 400 and "last message to be the assistant's" in user_last.json()["error"]["message"]
    greedy = {"max_tokens": 6, "temperature": 0}
    chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": prefilled, **greedy}, timeout=60).json()
    plain = httpx.post(f"{url}/v1/completions", json={"prompt": opened + " sat on", **greedy}, timeout=60).json()
    assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]  # the same prompt, the same answer
    assert chat["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_slots_lists_the_one_slot_busy_or_idle_and_501_with_no_slots(tiny_server, prefix):
    """llama-server's /slots (on unless --no-slots): SpecChat's one slot, busy while a request generates (or waits
    for its turn), idle with llama-server's idle budget after."""
    url, rt, api = tiny_server
    idle = httpx.get(f"{url}{prefix}/slots", timeout=30).json()
    assert idle == [{"id": 0, "n_ctx": rt.engine.n_ctx, "speculative": True, "is_processing": False,
                     "next_token": [{"has_next_token": False, "has_new_line": False, "n_remain": -1,
                                     "n_decoded": 0}]}]
    assert rt.engine._lock.acquire()  # the engine busy with another answer (the app's chat, say)
    answered = []
    try:
        asking = threading.Thread(target=lambda: answered.append(httpx.post(
            f"{url}/completion", json={"prompt": "the cat", "n_predict": 4}, timeout=120)))
        asking.start()
        deadline = time.monotonic() + 60
        while not (busy := httpx.get(f"{url}/slots", timeout=30).json()[0])["is_processing"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "next_token" not in busy  # the request holds the one slot, waiting for its turn
    finally:
        rt.engine._lock.release()
    asking.join()
    assert answered[0].status_code == 200
    assert httpx.get(f"{url}/slots", timeout=30).json() == idle  # answered: the slot is free again
    api.slots_enabled = False  # (what --no-slots sets)
    try:
        r = httpx.get(f"{url}{prefix}/slots", timeout=30)
    finally:
        api.slots_enabled = True
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert r.json()["error"]["code"] == 501 and "--no-slots" in r.json()["error"]["message"]


def test_a_foreign_origin_is_refused_on_the_unprefixed_routes(tiny_server):
    url, _, api = tiny_server
    foreign = {"Origin": "http://attacker.example"}
    for method, path in (("GET", "/health"), ("GET", "/models"), ("GET", "/props"), ("POST", "/tokenize"),
                         ("POST", "/completion"), ("POST", "/completions"), ("POST", "/chat/completions")):
        r = httpx.request(method, url + path, headers=foreign, json={"messages": PROMPT, "prompt": "x"}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin", (path, r.text)
    assert api.generations == 0


@pytest.fixture
def listening(models):
    """The same behind the guard as under --listen with a key."""
    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.guard import Access, Guard
    from app.server.apis.llama_server import LlamaAliases
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=256))
    api = ApiServer(rt)
    with serve_in_thread(lambda port: LlamaAliases(Guard(_root(api), Access.serving(port, True, KEY)))) as url:
        yield url, api
    rt.close()


def test_under_listen_a_missing_key_is_refused_on_the_unprefixed_routes(listening):
    url, api = listening
    paths = (("GET", "/health"), ("GET", "/models"), ("GET", "/props"), ("GET", "/slots"), ("POST", "/tokenize"),
             ("POST", "/detokenize"), ("POST", "/apply-template"), ("POST", "/completion"), ("POST", "/completions"),
             ("POST", "/chat/completions"))
    for method, path in paths:
        r = httpx.request(method, url + path, json={"messages": PROMPT, "prompt": "x"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (path, r.text)
    assert api.generations == 0
    signed = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{url}/health", headers=signed, timeout=30).json() == {"status": "ok"}
    r = httpx.post(f"{url}/completions", headers=signed, json={"prompt": "the cat", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["content"] is not None


def test_any_model_name_is_answered_by_the_loaded_pair(tiny_server):
    url, _, _ = tiny_server
    for path, body in (("/v1/chat/completions", {"messages": PROMPT}), ("/v1/completions", {"prompt": "the cat"})):
        r = httpx.post(url + path, json=body | {"model": "gpt-3.5-turbo", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 4


def test_n_predict_is_max_tokens_and_minus_one_runs_to_the_context(tiny_server):
    url, rt, _ = tiny_server
    for path, body in (("/chat/completions", {"messages": PROMPT}), ("/v1/completions", {"prompt": "the cat"})):
        r = httpx.post(url + path, json=body | {"n_predict": 3, "temperature": 0}, timeout=60).json()
        assert r["usage"]["completion_tokens"] == r["timings"]["predicted_n"] <= 3
        assert r["usage"]["completion_tokens"] == 3 or r["choices"][0]["finish_reason"] == "stop"
    both = {"prompt": "the cat", "n_predict": 3, "max_tokens": 5, "temperature": 0}  # max_tokens wins
    assert httpx.post(f"{url}/v1/completions", json=both, timeout=60).json()["usage"]["completion_tokens"] <= 5
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "the cat", "n_predict": -1}, timeout=120).json()
    # the context ends it (its last token is sampled, never decoded: it needs no room)
    assert r["usage"]["completion_tokens"] + r["usage"]["prompt_tokens"] <= rt.engine.n_ctx + 1
    assert r["choices"][0]["finish_reason"] in ("length", "stop")  # -1 is taken (not "at least 1")
    bad = httpx.post(f"{url}/v1/completions", json={"prompt": "the cat", "n_predict": "x"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_predict"


def test_native_completion_streamed_and_not(tiny_server):
    url, _, api = tiny_server
    body = {"prompt": "the cat", "n_predict": 8, "temperature": 0}
    whole = httpx.post(f"{url}/completion", json=body, timeout=60).json()
    assert whole["stop"] is True and whole["stop_type"] in ("eos", "limit") and whole["tokens_predicted"] <= 8
    assert whole["content"] and whole["tokens_evaluated"] > 0 and whole["timings"]["predicted_n"] == \
        whole["tokens_predicted"]
    v1 = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert whole["content"] == v1["choices"][0]["text"]  # the same generation as the OpenAI route
    with httpx.stream("POST", f"{url}/completion", json=body | {"stream": True}, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["timings"]["predicted_n"] == whole["tokens_predicted"] and api.served[0].endpoint


def test_native_completion_fields_as_llama_server_writes_them(tiny_server):
    url, rt, _ = tiny_server
    body = {"prompt": "the cat", "n_predict": 12, "temperature": 0}
    whole = httpx.post(f"{url}/completion", json=body | {"return_tokens": True}, timeout=60).json()
    assert rt.engine.detokenize(whole["tokens"]) == whole["content"] and len(whole["tokens"]) == 12
    assert whole["has_new_line"] == ("\n" in whole["content"]) and whole["truncated"] is False
    settings = whole["generation_settings"]
    assert settings["n_predict"] == 12 and settings["n_ctx"] == 256 and settings["logit_bias"] == [] \
        and settings["ignore_eos"] is False
    assert whole["prompt"].replace("\u2581", " ").strip().endswith("the cat")
    assert httpx.post(f"{url}/completion", json=body, timeout=60).json()["tokens"] == []
    with httpx.stream("POST", f"{url}/completion", json=body | {"stream": True}, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [t for e in events[:-1] for t in e["tokens"]] == whole["tokens"]  # streamed chunks carry their ids
    word = whole["content"][len(whole["content"]) // 2:][:2]
    cut = httpx.post(f"{url}/completion", json=body | {"stop": [word]}, timeout=60).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word and word not in cut["content"]
    only = httpx.post(f"{url}/completion", json=body | {"response_fields": ["content", "generation_settings/seed",
                                                                             "nowhere"]}, timeout=60).json()
    assert set(only) == {"content", "generation_settings/seed"} and only["content"] == whole["content"]


def test_native_completion_errors(tiny_server):
    url, rt, _ = tiny_server
    assert httpx.post(f"{url}/completion", json={"prompt": 5}, timeout=30).status_code == 400
    rt.close()
    r = httpx.post(f"{url}/completion", json={"prompt": "the cat"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"


def _prometheus(text: str) -> dict[str, tuple[str, float]]:
    """{name: (type, value)} of Prometheus text, each sample checked to have its TYPE and HELP lines."""
    types, out = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            name, value = line.split(" ", 1)
            assert name in types and f"# HELP {name} " in text, line
            out[name] = (types[name], float(value))
    return out


def test_metrics_are_501_unless_asked_for_then_count_every_endpoint_as_llama_server_names_them(tiny_server):
    url, _, api = tiny_server
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error" and "--metrics" in r.text
    api.metrics_enabled = True  # (what --metrics sets)
    timings = [httpx.post(f"{url}/completion", json={"prompt": "the cat sat", "n_predict": n, "temperature": 0},
                          timeout=60).json()["timings"] for n in (1, 4, 16)]  # the same prompt: reused after the first
    timings.append(httpx.post(f"{url}/chat/completions", json={"messages": PROMPT, "max_tokens": 8},
                              timeout=60).json()["timings"])
    with httpx.stream("POST", f"{url}/v1/responses", json={"input": "the dog", "max_output_tokens": 8,
                                                            "stream": True}, timeout=60) as r:
        completed = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")][-1]
    timings.append(completed["timings"])
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(r.headers["Process-Start-Time-Unix"]) > 0
    assert b"Process-Start-Time-Unix" in dict(r.headers.raw)  # sent in llama-server's case (the suite's lookup)
    m = _prometheus(r.text)
    total = {k: sum(t[k] for t in timings) for k in ("prompt_n", "cache_n", "predicted_n", "draft_n",
                                                       "draft_n_accepted")}
    assert total["cache_n"] > 0 and total["draft_n"] > 0
    assert m["llamacpp:prompt_tokens_total"] == ("counter", total["prompt_n"])
    assert m["llamacpp:prompt_tokens_cached_total"] == ("counter", total["cache_n"])
    assert m["llamacpp:tokens_predicted_total"] == ("counter", total["predicted_n"])
    assert m["llamacpp:spec_decode_num_draft_tokens_total"] == ("counter", total["draft_n"])
    assert m["llamacpp:spec_decode_num_accepted_tokens_total"] == ("counter", total["draft_n_accepted"])
    assert 0 < m["llamacpp:spec_decode_num_drafts_total"][1] <= total["draft_n"]
    assert m["llamacpp:n_decode_total"][1] >= total["predicted_n"] - total["draft_n_accepted"]
    assert m["llamacpp:requests_processing"] == ("gauge", 0) and m["llamacpp:requests_deferred"] == ("gauge", 0)
    assert m["llamacpp:predicted_tokens_seconds"][1] > 0 and m["llamacpp:prompt_seconds_total"][1] > 0
    again = _prometheus(httpx.get(f"{url}/v1/metrics", timeout=30).text)
    assert again["llamacpp:tokens_predicted_total"] == m["llamacpp:tokens_predicted_total"]  # counters stay
    assert again["llamacpp:predicted_tokens_seconds"][1] == 0  # the gauges' window restarted with the scrape


@pytest.mark.parametrize("method, path", [("POST", "/embeddings"), ("POST", "/v1/embeddings"), ("POST", "/embedding"),
                                          ("POST", "/rerank"), ("POST", "/v1/reranking"), ("POST", "/infill"),
                                          ("GET", "/lora-adapters"), ("POST", "/slots/0"),
                                          ("POST", "/v1/audio/transcriptions")])
def test_features_left_out_answer_501_not_supported_not_404(tiny_server, method, path):
    url, _, api = tiny_server
    r = httpx.request(method, url + path, json={"input": "x", "content": "x"}, timeout=30)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error", r.text
    assert api.generations == 0 and httpx.get(f"{url}/nowhere", timeout=30).status_code == 404


def test_token_id_prompts_are_the_same_prompt_as_their_text(tiny_server):
    url, rt, _ = tiny_server
    ids = rt.engine.model.tokenize("the cat", add_special=True)
    body = {"n_predict": 6, "temperature": 0}
    text = httpx.post(f"{url}/completion", json=body | {"prompt": "the cat"}, timeout=60).json()
    for prompt in (ids, [ids]):
        native = httpx.post(f"{url}/completion", json=body | {"prompt": prompt}, timeout=60).json()
        assert native["content"] == text["content"] and native["tokens_evaluated"] == len(ids)
        oai = httpx.post(f"{url}/v1/completions", json=body | {"prompt": prompt}, timeout=60).json()
        assert oai["choices"][0]["text"] == text["content"] and oai["usage"]["prompt_tokens"] == len(ids)
    for prompt in ([ids[0], "the cat"], {"prompt_string": "the cat"}):  # ids and text mixed; llama-server's object
        mixed = httpx.post(f"{url}/completion", json=body | {"prompt": prompt}, timeout=60).json()
        assert mixed["content"] == text["content"] or ids[0] != rt.engine.model.bos
    several = httpx.post(f"{url}/completion", json=body | {"prompt": [ids, "the cat", {"prompt_string": "the cat"}]},
                         timeout=60).json()
    assert [r["content"] for r in several] == [text["content"]] * 3  # a list of prompts: a list of answers
    for bad in ([10 ** 9], [], [1, None], {"prompt_string": 5}, {"prompt_string": "x", "multimodal_data": ["x"]}):
        r = httpx.post(f"{url}/completion", json=body | {"prompt": bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", (bad, r.text)
    r = httpx.post(f"{url}/v1/completions", json=body | {"prompt": [ids, ids]}, timeout=30)
    assert r.status_code == 400 and "one per request" in r.json()["error"]["message"]


def test_a_prompt_over_the_context_is_llama_servers_exceed_context_size_error(tiny_server):
    url, rt, _ = tiny_server
    long = "the cat sat " * 200
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}),
                       ("/completion", {"prompt": long}), ("/v1/completions", {"prompt": [5] * 300})):
        r = httpx.post(url + path, json=body, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["type"] == "exceed_context_size_error", r.text
        assert err["n_ctx"] == rt.engine.n_ctx == 256 and err["n_prompt_tokens"] > 256
        assert "exceeds the available context size" in err["message"]


def test_fingerprint_cached_tokens_and_bad_fields_refused(tiny_server):
    url, _, api = tiny_server
    body = {"messages": PROMPT, "max_tokens": 4, "temperature": 0}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    again = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert first["system_fingerprint"].startswith("specchat") and again["system_fingerprint"] == \
        first["system_fingerprint"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["timings"]["cache_n"] > 0
    t = again["timings"]  # llama-server's per-token figures beside its rates
    assert t["predicted_per_token_ms"] == pytest.approx(1000 / t["predicted_per_second"])
    assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"])
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all(c["system_fingerprint"] == first["system_fingerprint"] for c in chunks)
    before = api.generations
    for extra in ({"logprobs": "yes"}, {"top_logprobs": 2}, {"n_probs": 21}, {"logit_bias": {"5": "low"}},
                  {"logit_bias": [[5]]}, {"logit_bias": {"99999999": -1}}, {"ignore_eos": "yes"},
                  {"messages": PROMPT + [{"role": "assistant", "content": "a"}] * 2}):
        r = httpx.post(f"{url}/v1/chat/completions", json=body | extra, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(extra)), r.text
    assert api.generations == before
    assert httpx.post(f"{url}/v1/chat/completions", json=body | {"logprobs": False}, timeout=30).status_code == 200


def test_logit_bias_and_ignore_eos_steer_the_answer_and_speculation_stays_exact(tiny_server):
    url, rt, _ = tiny_server
    body = {"prompt": "the cat sat on", "n_predict": 16, "temperature": 0, "return_tokens": True}

    def complete(**extra) -> dict:
        r = httpx.post(f"{url}/completion", json=body | extra, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    plain = complete()
    for bias in ({str(plain["tokens"][0]): -100}, [[plain["tokens"][0], False]]):  # OpenAI's form, llama-server's
        off, on = complete(logit_bias=bias, **{"speculative.n_max": 0}), complete(logit_bias=bias)
        assert off["tokens"][0] != plain["tokens"][0]  # the bias took the plain answer's first token away
        assert on["tokens"] == off["tokens"] and on["timings"]["draft_n"] > 0  # drafts verified against the bias
    ends = {str(t): 100 for t in rt.engine.model.eog_tokens}  # end of text pushed to the top: the answer ends at once
    ended = complete(logit_bias=ends)
    assert ended["stop_type"] == "eos" and ended["tokens_predicted"] <= 1
    kept = complete(logit_bias=ends, ignore_eos=True)  # ...unless ends are banned: then it runs to n_predict
    assert kept["stop_type"] == "limit" and kept["tokens_predicted"] == 16
    assert kept["generation_settings"]["ignore_eos"] is True
    assert complete(logit_bias=ends, ignore_eos=True, **{"speculative.n_max": 0})["tokens"] == kept["tokens"]
    # llama-server's generation_settings.logit_bias: {bias, token}, a ban's bias null, ignore_eos's bans included
    shown = kept["generation_settings"]["logit_bias"]
    eog = rt.engine.model.eog_tokens
    assert {"bias": 100.0, "token": next(iter(eog))} in shown and {"bias": None, "token": next(iter(eog))} in shown
    assert complete(ignore_eos=True)["generation_settings"]["logit_bias"] == [{"bias": None, "token": t} for t in eog]
    # a text in a token's place stands for each of its tokens (no special tokens), in either form
    model = rt.engine.model
    word = model.piece(plain["tokens"][0]).decode("utf-8", "replace").strip() or "the"
    ids = model.tokenize(word, add_special=False, parse_special=False)  # (as llama.cpp's common_tokenize)
    by_id = complete(logit_bias=[[t, -100] for t in ids])
    for bias in ({word: -100}, [[word, -100]]):
        by_text = complete(logit_bias=bias)
        assert [e["token"] for e in by_text["generation_settings"]["logit_bias"]] == ids
        assert by_text["tokens"] == by_id["tokens"]


def test_input_tokens_count_the_prompt_each_api_renders_and_generate_nothing(tiny_server):
    from app.prompts import chat_tokens

    url, rt, api = tiny_server
    body = {"messages": PROMPT}
    n = len(chat_tokens(rt.engine.model, PROMPT))  # what a generation would evaluate
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        assert httpx.post(url + path, json=body, timeout=30).json() == {"input_tokens": n}
    r = httpx.post(f"{url}/v1/messages/count_tokens", json={"model": "x", "messages": PROMPT}, timeout=30)
    assert r.json() == {"input_tokens": n}  # (no max_tokens needed)
    r = httpx.post(f"{url}/responses/input_tokens", json={"input": PROMPT[0]["content"]}, timeout=30)
    assert r.json() == {"input_tokens": n}
    bad = httpx.post(f"{url}/v1/messages/count_tokens", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert api.generations == 0


def test_n_choices_are_answered_one_after_the_other(tiny_server):
    url, _, api = tiny_server
    for path, body in (("/v1/chat/completions", {"messages": PROMPT}), ("/v1/completions", {"prompt": "the cat"})):
        one = httpx.post(url + path, json=body | {"max_tokens": 6, "temperature": 0}, timeout=60).json()
        r = httpx.post(url + path, json=body | {"max_tokens": 6, "temperature": 0, "n": 3}, timeout=60).json()
        assert [c["index"] for c in r["choices"]] == [0, 1, 2]
        assert [c.get("text") or c.get("message") for c in r["choices"]] == [
            one["choices"][0].get("text") or one["choices"][0].get("message")] * 3  # greedy: the same each time
        assert r["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
        assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    before = api.generations
    assert httpx.post(f"{url}/v1/chat/completions", json={"messages": PROMPT, "n": 0}, timeout=30).status_code == 400
    assert api.generations == before


# ChatML with Llama 3's date and FireFunction's undefined ``functions`` (text plus it is the text in llama.cpp's jinja)
DATED_CHATML = ("{{ '<|im_start|>system\\nToday Date: ' + date_string + '\\n' + functions }}<|im_end|>\n"
                "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_apply_template_answers_as_the_real_llama_server_does(tiny_server, models, tmp_path):
    """The same bodies to llama-server (built from the same llama.cpp, on the same model and template) and to
    SpecChat: the same prompts (the date, the turn left closed, the assistant's text continued) or both a 400."""
    from support.llama_server import llama_server

    url, rt, _ = tiny_server
    template = tmp_path / "dated.jinja"
    template.write_text(DATED_CHATML, encoding="utf-8")
    rt.engine.model.template_override = DATED_CHATML
    prefilled = PROMPT + [{"role": "assistant", "content": " sat on"}]
    bodies = [{"messages": PROMPT}, {"messages": PROMPT, "add_generation_prompt": False}, {"messages": prefilled},
              {"messages": prefilled, "add_generation_prompt": False, "continue_final_message": True},
              {"messages": prefilled, "continue_final_message": True}]
    answers = []
    with llama_server(models["target"], None, "--jinja", "--chat-template-file", str(template)) as real:
        for body in bodies:
            theirs = httpx.post(f"{real}/apply-template", json=body, timeout=30)
            ours = httpx.post(f"{url}/apply-template", json=body, timeout=30)
            assert ours.status_code == theirs.status_code, body
            if theirs.status_code == 200:
                assert ours.json() == theirs.json(), body
            answers.append(ours.json())
    assert f"Today Date: {date.today():%d %b %Y}\n<|im_end|>" in answers[0]["prompt"]  # (unless run at midnight)
    assert answers[2]["prompt"].endswith("<|im_start|>assistant\n sat on") and answers[3] == answers[2]
    assert "add_generation_prompt" in answers[4]["error"]["message"]


def _sse(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url, json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _check_entries(entries: list[dict], n_top: int) -> None:
    """llama-server's probs_vector_to_json: each token's id, text, bytes, logprob and its top alternatives, sorted;
    the tokens' texts, and their bytes decoded, are the answer's text."""
    text = "".join(e["token"] for e in entries)
    assert b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace") == text
    for e in entries:
        assert e["logprob"] <= 0
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == n_top and tops == sorted(tops, reverse=True) and all(lp <= 0 for lp in tops)
        assert e["top_logprobs"][0]["id"] == e["id"] and tops[0] == e["logprob"]  # greedy: the top-1 was chosen


def test_chat_logprobs_streamed_and_not_are_the_same_with_speculation_on_and_off(tiny_server):
    url, _, _ = tiny_server
    body = {"messages": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    on = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    off = httpx.post(f"{url}/v1/chat/completions", json=body | {"speculative.n_max": 0}, timeout=60).json()
    assert on["timings"]["draft_n"] > 0 and off["timings"]["draft_n"] == 0
    content = on["choices"][0]["logprobs"]["content"]
    assert len(content) == on["usage"]["completion_tokens"] and _check_entries(content, 3) is None
    assert "".join(e["token"] for e in content) == on["choices"][0]["message"]["content"]
    assert [e["id"] for e in content] == [e["id"] for e in off["choices"][0]["logprobs"]["content"]]
    assert [e["logprob"] for e in content] == pytest.approx(
        [e["logprob"] for e in off["choices"][0]["logprobs"]["content"]], abs=1e-3)
    chunks = [c["choices"][0] for c in _sse(f"{url}/v1/chat/completions", body) if c["choices"]]
    streamed = [e for c in chunks for e in (c.get("logprobs") or {}).get("content", [])]
    assert [e["id"] for e in streamed] == [e["id"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-3)
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "".join(e["token"] for e in streamed)
    plain = httpx.post(f"{url}/v1/chat/completions", json={"messages": PROMPT, "max_tokens": 4}, timeout=60).json()
    assert "logprobs" not in plain["choices"][0]  # not asked: not computed
    only = httpx.post(f"{url}/v1/chat/completions", json=body | {"top_logprobs": None}, timeout=60).json()
    assert all(e["top_logprobs"] == [] for e in only["choices"][0]["logprobs"]["content"])  # OpenAI's default: 0


def test_completions_logprobs_in_openai_legacy_and_llama_server_native_shapes(tiny_server):
    url, _, _ = tiny_server
    body = {"prompt": "the cat sat on", "max_tokens": 12, "temperature": 0}
    legacy = httpx.post(f"{url}/v1/completions", json=body | {"logprobs": 2}, timeout=60).json()["choices"][0]
    lp = legacy["logprobs"]
    assert "".join(lp["tokens"]) == legacy["text"] and len(lp["token_logprobs"]) == len(lp["tokens"])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert all(1 <= len(top) <= 2 and max(top.values()) == p  # (two tokens may share a text: one key)
               for top, p in zip(lp["top_logprobs"], lp["token_logprobs"]))
    streamed = [c["choices"][0]["logprobs"] for c in _sse(f"{url}/v1/completions", body | {"logprobs": 2})
                if c["choices"][0]["logprobs"]]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]

    native = httpx.post(f"{url}/completion", json=body | {"n_probs": 4, "return_tokens": True}, timeout=60).json()
    probs = native["completion_probabilities"]
    assert [e["id"] for e in probs] == native["tokens"] and _check_entries(probs, 4) is None
    events = _sse(f"{url}/completion", body | {"n_probs": 4})
    partial = [e for e in events if not e["stop"]]
    assert all(len(e["completion_probabilities"]) == 1 for e in partial)  # one token per event, as llama-server
    assert [e["completion_probabilities"][0]["id"] for e in partial] == native["tokens"]
    assert [e["completion_probabilities"][0]["logprob"] for e in partial] == pytest.approx(
        [e["logprob"] for e in probs], abs=1e-3)
    assert "completion_probabilities" not in events[-1]
    assert "completion_probabilities" not in httpx.post(f"{url}/completion", json=body | {"n_probs": 0},
                                                        timeout=60).json()  # llama-server: 0 is off


def test_post_sampling_probs_are_the_sampling_chains(tiny_server):
    url, _, _ = tiny_server
    body = {"prompt": "the cat sat on", "n_predict": 8, "temperature": 1.0, "top_k": 5, "seed": 11, "n_probs": 10,
            "post_sampling_probs": True}
    r = httpx.post(f"{url}/completion", json=body, timeout=60).json()
    for e in r["completion_probabilities"]:
        assert 0 < e["prob"] <= 1 and "logprob" not in e
        top = [t["prob"] for t in e["top_probs"]]
        assert 0 < len(top) <= 5 and all(0 < p <= 1 for p in top) and sum(top) == pytest.approx(1.0)
        assert e["id"] in [t["id"] for t in e["top_probs"]]
    again = httpx.post(f"{url}/completion", json={k: v for k, v in body.items() if k not in ("n_probs",
                       "post_sampling_probs")}, timeout=60).json()
    assert again["content"] == r["content"]  # the same seed draws the same tokens, probabilities asked or not


@pytest.mark.parametrize("path,extra,param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/completion", {"n_probs": -2}, "n_probs"),
    ("/completion", {"n_probs": 2.5}, "n_probs"),
    ("/completion", {"n_probs": 2, "post_sampling_probs": "yes"}, "post_sampling_probs"),
])
def test_bad_logprobs_fields_are_400s_naming_the_field(tiny_server, path, extra, param):
    url, _, api = tiny_server
    body = {"messages": PROMPT} if "chat" in path else {"prompt": "the cat"}
    r = httpx.post(url + path, json=body | extra, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert api.generations == 0


def test_verbose_answers_carry_llama_servers_debug_object(tiny_server):
    """`"verbose": true` (or `serve --verbose`, unless a request says false) adds llama-server's `__verbose`: the
    native completion's fields, the prompt as the model read it among them; on a stream, on the last chunk."""
    url, rt, api = tiny_server
    body = {"messages": PROMPT, "max_tokens": 4, "temperature": 0}
    plain = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert "__verbose" not in plain
    asked = httpx.post(f"{url}/v1/chat/completions", json={**body, "verbose": True}, timeout=60).json()
    v = asked["__verbose"]
    assert v["content"] == asked["choices"][0]["message"]["content"] and v["tokens_predicted"] == 4
    assert "cat" in v["prompt"] and "<|im_start|>" in v["prompt"]  # (the tiny vocabulary writes spaces as ▁)
    assert v["tokens_evaluated"] == asked["usage"]["prompt_tokens"]
    assert v["generation_settings"]["n_predict"] == 4 and v["stop_type"] == "limit"
    completion = httpx.post(f"{url}/v1/completions", json={"prompt": "the cat sat", "max_tokens": 3,
                                                           "verbose": True}, timeout=60).json()
    assert completion["__verbose"]["prompt"].endswith("sat")
    api.verbose = True  # (what --verbose sets)
    try:
        assert "__verbose" in httpx.post(f"{url}/chat/completions", json=body, timeout=60).json()
        assert "__verbose" not in httpx.post(f"{url}/chat/completions", json={**body, "verbose": False},
                                             timeout=60).json()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert [("__verbose" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert chunks[-1]["__verbose"]["tokens_predicted"] == 4 and chunks[-1]["__verbose"]["content"] == ""
    finally:
        api.verbose = False
    r = httpx.post(f"{url}/v1/chat/completions", json={**body, "verbose": "yes"}, timeout=60)
    assert r.status_code == 400 and "'verbose' must be true or false" in r.json()["error"]["message"]
