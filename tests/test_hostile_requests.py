"""No request takes the app down (issue 41), through `specchat serve` on the tiny models over real HTTP: a body over
the limit is a 413 while other routes answer; NaN and Infinity, integers past int64, lone surrogates and JSON nested
100,000 deep are 400s in OpenAI's shape; a malformed Origin, Host, Referer or cookie is refused (403), never a 500;
a prompt too long for the context is refused before it is tokenized, and tokenizing runs off the event loop. Then a
fuzz pass (hypothesis) over the request schema and the access headers: no 5xx, OpenAI's error shape, the next
request answered, and no traceback in the server's log."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.servers import free_port, serve_in_thread

KEY = "k-hostile-" + "0123456789" * 2
HELLO = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 2}
MB = 1024 * 1024


class Served:
    """`specchat serve` on the tiny models (``args`` added), its output read as it comes: a traceback in it fails
    the module."""

    def __init__(self, models, home, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "SPECCHAT_API_KEY"}
        env.update(SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--target", str(models["target"]), "--draft", str(models["draft"]),
             "--ctx", "512", "--port", str(self.port), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        started = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                if "running at" in line:
                    started.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not started.wait(180):
            self.proc.kill()
            raise AssertionError(self.log)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        """Ctrl-C: a clean exit, and nothing in the log that says a request was not handled."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        self.reader.join(10)
        assert self.proc.returncode == 0, self.log
        assert "Traceback" not in self.log and "Exception in ASGI" not in self.log, self.log


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    s = Served(models, tmp_path_factory.mktemp("home-hostile"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def listening(models, tmp_path_factory):
    """Under --listen, where everything needs the key (and a cookie is read), with a 1 MB body limit."""
    s = Served(models, tmp_path_factory.mktemp("home-hostile-listen"), "--listen", "--api-key", KEY,
               "--max-body-mb", "1")
    yield s
    s.stop()


def post(url: str, body: str | bytes, path: str = "/v1/chat/completions", **headers) -> httpx.Response:
    return httpx.post(url + path, content=body, timeout=120,
                      headers={"Content-Type": "application/json", **headers})


def assert_openai_error(r: httpx.Response, status: int, words: str = "", param: str | None = "any") -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    if err.get("type") == "exceed_context_size_error":  # llama-server's type, with its two figures
        assert set(err) == {"message", "type", "param", "code", "n_prompt_tokens", "n_ctx"}, err
        assert err["code"] == "context_length_exceeded" and err["n_prompt_tokens"] >= err["n_ctx"] > 0, err
    else:
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["type"] == "invalid_request_error", err
    assert isinstance(err["message"], str), err
    assert words in err["message"], err
    if param != "any":
        assert err["param"] == param, err
    return err


def assert_answered(url: str, **headers) -> None:
    """The next ordinary request is answered."""
    r = httpx.post(url + "/v1/chat/completions", json=HELLO, headers=headers, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text


# --- a 50 MB body -------------------------------------------------------------------------------------------------
def test_a_50_mb_body_declared_up_front_is_a_413_before_it_is_sent_and_other_routes_answer(server):
    """The Content-Length says 50 MB: the answer comes after the first megabyte, the rest never sent; meanwhile (the
    request still open) another route answers."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {50 * MB}\r\n\r\n".encode()
                     + b'{"messages": [{"role": "user", "content": "' + b"a" * MB)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        err = json.loads(payload)["error"]
        assert err["code"] == "request_too_large" and err["type"] == "invalid_request_error", err
        assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 200  # the big request is still open
    assert_answered(server.url)


def test_a_50_mb_body_without_a_length_is_a_413_and_other_routes_answer_while_it_is_sent(server):
    """Chunked, no Content-Length: refused once the bytes pass the limit; while it is being sent, another route
    answers; the client reads the 413 (what it still sends is read and dropped)."""
    sending, answered = threading.Event(), threading.Event()

    def body():
        yield b'{"messages": [{"role": "user", "content": "'
        for i in range(50):
            if i == 4:
                sending.set()
                answered.wait(60)
            yield b"a" * MB
        yield b'"}]}'

    result = {}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(
        server.url + "/v1/chat/completions", content=body(), headers={"Content-Type": "application/json"},
        timeout=120)))
    t.start()
    assert sending.wait(60)
    try:
        assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 200
    finally:
        answered.set()
    t.join(120)
    assert_openai_error(result["r"], 413, "at most")
    assert_answered(server.url)


def test_max_body_mb_sets_the_limit(listening):
    auth = {"Authorization": f"Bearer {KEY}"}
    big = json.dumps({"messages": [{"role": "user", "content": "a" * (2 * MB)}]})
    err = assert_openai_error(post(listening.url, big, **auth), 413, "at most 1.0 MB")
    assert err["code"] == "request_too_large"
    small = json.dumps({"messages": [{"role": "user", "content": "a" * (MB // 2)}]})
    assert_openai_error(post(listening.url, small, **auth), 400, "context holds")  # read, then too long
    assert_answered(listening.url, **auth)


def test_a_bad_max_body_mb_is_one_clear_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "serve", "--max-body-mb", "0"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "SPECCHAT_HOME": str(tmp_path)})
    assert r.returncode == 1 and "Invalid --max-body-mb" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(server):
    """2 MB of text cannot fit 512 tokens whatever the tokenizer makes of it: refused from its size."""
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "the cat " * 250_000}]}),
                       ("/v1/completions", {"prompt": "the cat " * 250_000})):
        err = assert_openai_error(post(server.url, json.dumps(body), path), 400, "is at least")
        assert err["code"] == "context_length_exceeded", err
    assert_answered(server.url)


def test_tokenizing_a_prompt_runs_off_the_event_loop(models, monkeypatch):
    """While one request's prompt is being tokenized (held here), the other routes answer."""
    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server import prepare
    from app.server.app import ApiServer

    tokenizing, release = threading.Event(), threading.Event()
    real = prepare.plain_tokens

    def slow_tokens(model, text):
        tokenizing.set()
        release.wait(60)
        return real(model, text)

    monkeypatch.setattr(prepare, "plain_tokens", slow_tokens)
    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=256))
    try:
        with serve_in_thread(lambda port: ApiServer(rt).app()) as url:
            result = {}
            t = threading.Thread(target=lambda: result.update(r=httpx.post(
                url + "/completions", json={"prompt": "the cat", "max_tokens": 2}, timeout=120)))
            t.start()
            assert tokenizing.wait(60)
            try:
                assert httpx.get(url + "/models", timeout=60).status_code == 200  # while it tokenizes
            finally:
                release.set()
            t.join(120)
            assert result["r"].status_code == 200, result["r"].text
    finally:
        rt.close()


# --- numbers, strings and structures: 400s, never 500s ----------------------------------------------------------
@pytest.mark.parametrize("field, literal", [
    ("max_tokens", "NaN"), ("max_tokens", "Infinity"), ("max_tokens", "1e400"), ("seed", "-Infinity"),
    ("seed", "NaN"), ("speculative.n_max", "NaN"), ("speculative.n_max", "Infinity"), ("temperature", "NaN"),
    ("top_p", "-Infinity"), ("n", "Infinity"), ("max_completion_tokens", "NaN"), ("speculative.p_min", "NaN"),
])
def test_nan_and_infinity_are_400s_naming_the_field(server, field, literal):
    body = '{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, literal)
    assert_openai_error(post(server.url, body), 400, "finite", param=field)
    assert_answered(server.url)


def test_nan_nested_under_speculative_is_a_400(server):
    body = '{"messages": [{"role": "user", "content": "hi"}], "speculative": {"n_max": Infinity}}'
    assert_openai_error(post(server.url, body), 400, "speculative.n_max", param="speculative")


@pytest.mark.parametrize("field", ["max_tokens", "seed", "top_k", "speculative.n_max", "n"])
def test_integers_beyond_int64_are_400s(server, field):
    body = '{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, "9" * 30)
    assert_openai_error(post(server.url, body), 400, "2^63", param=field)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages"),
    ("/v1/completions", {"prompt": "hi \ud800"}, "prompt"),
    ("/v1/completions", {"prompt": ["\udc00 hi"]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud800"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"\ud800": True}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": "\ud800"}}]}, "tools"),
    ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "ok"}]}, "messages"),
])
def test_a_lone_surrogate_anywhere_is_a_400(server, path, body, param):
    assert_openai_error(post(server.url, json.dumps(body), path), 400, "surrogate", param=param)
    assert_answered(server.url)


def test_invalid_utf8_is_a_400(server):
    body = b'{"messages": [{"role": "user", "content": "%s"}]}'
    assert_openai_error(post(server.url, body % b"\xff\xfe"), 400, "not valid JSON")
    # a surrogate written as UTF-8 bytes (json's decoder lets them pass) is refused as the escaped one is
    assert_openai_error(post(server.url, body % b"\xed\xa0\x80"), 400, "surrogate", param="messages")


@pytest.mark.parametrize("body", [
    "[" * 100_000 + "]" * 100_000,
    '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": ' + "[" * 150 + "]" * 150 + "}}",
    '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
    '"parameters": ' + '{"a": ' * 150 + "{}" + "}" * 150 + "}}]}",
])
def test_json_nested_too_deep_is_a_400(server, body):
    assert_openai_error(post(server.url, body), 400, "nested too deeply")
    assert_answered(server.url)


def test_tool_call_arguments_nested_100k_deep_or_nan_are_400s(server):
    for arguments, words in (("[" * 100_000 + "]" * 100_000, "nested too deeply"), ('{"a": NaN}', "finite")):
        body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "1", "content": "ok"}]}
        assert_openai_error(post(server.url, json.dumps(body)), 400, words, param="messages")


@pytest.mark.parametrize("extra, param", [
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": 1}}, "include_usage"),
    ({"timings_per_token": []}, "timings_per_token"),
    ({"chat_template_kwargs": {"template": "x"}}, "chat_template_kwargs"),  # names the renderer's own arguments
    ({"chat_template_kwargs": {"choice": "x"}}, "chat_template_kwargs"),
    ({"tools": {"f": {}}}, "tools"),
    ({"n": 1.5}, "n"),
    ({"max_tokens": True}, "max_tokens"),
    ({"seed": "42"}, "seed"),
])
def test_fields_of_the_wrong_type_are_400s(server, extra, param):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], **extra})
    assert_openai_error(post(server.url, body), 400, param=param)


@pytest.mark.parametrize("body", ["", "{", "nul", '{"messages": [}', "\ufeff{}", "{}" * 3])
def test_broken_json_is_a_400(server, body):
    assert_openai_error(post(server.url, body.encode()), 400)


# --- the access check never throws -------------------------------------------------------------------------------
@pytest.mark.parametrize("origin", [
    "http://127.0.0.1:{port}.evil.example", "http://127.0.0.1:99999", "http://127.0.0.1:65536", "http://127.0.0.1:-1",
    "http://[::1", "http://[::1]:{port}x", "http://127.0.0.1:\u00b2", "http://\u00e9.example:{port}",
    "http://127.0.0.1:0x50", "http://localhost:{port}@evil.example",
])
def test_a_malformed_origin_is_a_403(server, origin):
    value = origin.format(port=server.port).encode("latin-1")
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        r = httpx.request(method, server.url + path, json=HELLO, headers=[(b"Origin", value)], timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin", (origin, r.text)
    # without Origin, a write is judged by its Referer: as malformed, as refused
    r = httpx.post(server.url + "/v1/chat/completions", json=HELLO, timeout=60,
                   headers=[(b"Referer", value + b"/page.html")])
    assert r.status_code == 403, (origin, r.text)


@pytest.mark.parametrize("host", ["127.0.0.1:\u00b2", "127.0.0.1:99999", "127.0.0.1:{port}\u00e9", "[::1:{port}",
                                  "127.0.0.1:" + "9" * 40, "\u00e9:{port}"])
def test_a_malformed_host_is_a_403(server, host):
    value = host.format(port=server.port).encode("latin-1")
    r = httpx.get(server.url + "/v1/models", headers=[(b"Host", value)], timeout=60)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host", (host, r.text)


@pytest.mark.parametrize("cookie", ["specchat_{port}=\u00e9\u00e9", "\u00e9=\u00e9", "specchat_{port}=\u00ff" * 3])
def test_a_non_ascii_cookie_under_listen_is_a_403(listening, cookie):
    value = cookie.format(port=listening.port).encode("latin-1")
    r = httpx.get(listening.url + "/v1/models", headers=[(b"Cookie", value)], timeout=60)
    assert r.status_code == 403 and r.json()["error"]["code"] == "malformed_cookie", r.text
    r = httpx.get(listening.url + "/v1/models", timeout=60,  # the key still lets its holder in
                  headers=[(b"Cookie", value), (b"Authorization", f"Bearer {KEY}".encode())])
    assert r.status_code == 200, r.text
    r = httpx.get(listening.url + "/", timeout=60, headers=[(b"Cookie", value), (b"Accept", b"text/html")])
    assert r.status_code == 401 and "<form" in r.text  # a browser gets the login page, which sets a fresh cookie


def test_a_sign_in_link_to_a_non_latin1_path_redirects_not_500(listening):
    r = httpx.get(listening.url + "/caf%C3%A9/%E2%82%AC", params={"key": KEY}, timeout=60, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/caf%C3%A9/%E2%82%AC", r.headers


def test_the_parts_of_the_access_check_never_throw():
    """Every header value a client can send (bytes read as latin-1): a yes or a no, never an exception."""
    from app.server.guard import Access, Guard, _cookies, _origin_of, split_host

    access = Access(port=8080, key=KEY, cors=("https://ok.example",))
    guard = Guard(None, access)
    text = st.text(st.characters(min_codepoint=0, max_codepoint=0xFF), max_size=40)
    near = st.builds(lambda a, b: a + b, st.sampled_from(["http://", "https://", "http://[", "http://127.0.0.1:", "",
                                                          "http://localhost:8080", "specchat_8080="]), text)

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.one_of(text, near))
    def check(value):
        assert split_host(value) is None or isinstance(split_host(value), tuple)
        assert access.host_allowed(value) in (True, False)
        assert access.origin_allowed(value, "/v1/models") in (True, False)
        assert access.origin_allowed(value, "/") in (True, False)
        assert isinstance(_origin_of(value), str) and isinstance(_cookies(value), dict)
        assert guard._authorised({"cookie": value, "authorization": value}) in (True, False)

    check()


# --- fuzz: random and hostile bodies over the request schema --------------------------------------------------
TEXT = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates included
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(), TEXT)
ANY = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(TEXT, inner, max_size=3)), max_leaves=10)


def bodies(hostile: bool):
    """Chat and completion bodies over every field the API reads. Not ``hostile``: each field of a valid type and
    range (the text any Unicode but surrogates), to reach the answering paths (tools, streams, grammars, drafters);
    ``hostile``: any field may be anything at all, lone surrogates, NaN and all."""
    text = TEXT if hostile else st.text(max_size=12)

    def field(valid):
        return st.one_of(valid, valid, valid, valid, ANY) if hostile else valid

    tool = st.fixed_dictionaries({"type": field(st.just("function")), "function": field(st.fixed_dictionaries(
        {"name": field(st.sampled_from(["f", "g"])),
         "parameters": field(st.just({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}}))},
        optional={"description": field(text)}))})
    call = st.fixed_dictionaries({"id": field(text), "type": st.just("function"), "function": field(
        st.fixed_dictionaries({"name": field(st.sampled_from(["f", "g"])), "arguments": field(
            st.one_of(st.just("{}"), st.just('{"a": "x"}'), ANY.map(json.dumps) if hostile else st.just("{}")))}))})
    message = st.fixed_dictionaries(
        {"role": field(st.sampled_from(["system", "developer", "user", "assistant"])),
         "content": field(st.one_of(text, st.lists(st.fixed_dictionaries(
             {"type": field(st.just("text")), "text": field(text)}), max_size=2)))},
        optional={"name": field(text)})
    with_calls = st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                                        "tool_calls": field(st.lists(call, min_size=1, max_size=2))})
    result = st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": field(text), "content": field(text)})
    common = {
        "max_tokens": field(st.integers(1, 6)), "max_completion_tokens": field(st.integers(1, 6)),
        "temperature": field(st.floats(0, 2)), "top_p": field(st.floats(0.1, 1)), "top_k": field(st.integers(0, 50)),
        "min_p": field(st.floats(0, 0.5)), "seed": field(st.integers(-1, 2 ** 32)), "n": field(st.just(1)),
        "stop": field(st.one_of(text, st.lists(text, max_size=2))), "stream": field(st.booleans()),
        "stream_options": field(st.fixed_dictionaries({"include_usage": field(st.booleans())})),
        "timings_per_token": field(st.booleans()), "model": field(st.just("target.gguf")),
        "speculative.n_max": field(st.integers(0, 8)), "speculative.p_min": field(st.floats(0, 0.9)),
        "speculative": field(st.fixed_dictionaries({}, optional={"n_max": field(st.integers(0, 8)),
                                                                 "type": field(st.just("ngram-simple"))})),
        "speculative.type": field(st.sampled_from(["draft-simple", "ngram-simple", "none"])),
        "drafter": field(st.sampled_from(["model", "ngram", "none"])),
        "chat_template_kwargs": field(st.dictionaries(st.one_of(st.sampled_from(
            ["enable_thinking", "template", "choice", "raise_exception"]), text), ANY, max_size=2)
            if hostile else st.fixed_dictionaries({"enable_thinking": st.booleans()})),
        "response_format": field(st.sampled_from([
            {"type": "text"}, {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}])),
    }
    chat = st.fixed_dictionaries({"messages": field(st.one_of(
        st.lists(message, min_size=1, max_size=3),
        st.tuples(message, with_calls, result).map(list)))}, optional={
        **common, "tools": field(st.lists(tool, max_size=2)), "parallel_tool_calls": field(st.booleans()),
        "tool_choice": field(st.one_of(st.sampled_from(["auto", "none", "required"]), st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"])})})))})
    completion = st.fixed_dictionaries({"prompt": field(st.one_of(text, st.lists(text, min_size=1, max_size=1)))},
                                       optional=common)
    return chat, completion


CHAT, COMPLETION = bodies(hostile=True)
RAW = st.one_of(
    st.binary(max_size=40),
    st.integers(50, 5000).map(lambda n: '{"messages": ' + "[" * n + "]" * n + "}"),
    st.one_of(CHAT, COMPLETION).map(lambda b: json.dumps(b)[:-1]),  # cut short
)
CASES = st.one_of(
    *[st.tuples(st.just(path), bodies.map(json.dumps)) for path, bodies in
      zip(["/v1/chat/completions", "/v1/completions"] * 2, [*bodies(hostile=False), CHAT, COMPLETION])],
    st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), RAW))


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(CASES)
def test_fuzzed_bodies_get_no_5xx_and_the_next_request_is_answered(server, case):
    path, body = case
    r = post(server.url, body if isinstance(body, bytes) else body.encode(), path)
    assert r.status_code < 500, (body[:300], r.text[:500])
    if r.status_code >= 400:
        assert_openai_error(r, r.status_code)
    else:
        assert "server_error" not in r.text, r.text[:500]  # (a stream's error comes as its last event)
    assert_answered(server.url)


HEADER = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["Origin", "Referer", "Cookie", "Authorization", "Host"]), HEADER,
                       max_size=4), st.sampled_from(["GET /v1/models", "POST /v1/chat/completions", "GET /"]))
def test_fuzzed_access_headers_get_no_5xx(listening, headers, route):
    method, path = route.split()
    r = httpx.request(method, listening.url + path, json=HELLO, timeout=60,
                      headers=[(k.encode(), v.strip().encode("latin-1")) for k, v in headers.items()])
    assert r.status_code < 500, (headers, r.status_code, r.text[:300])
    assert r.status_code in (200, 400, 401, 403, 404), (headers, r.status_code, r.text[:300])
    assert_answered(listening.url, Authorization=f"Bearer {KEY}")
