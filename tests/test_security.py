"""Safe on a network and in the browser, over real HTTP on 127.0.0.1: foreign Host headers (DNS rebinding), cross-site
requests, one key for everything under --listen (login page by keyboard, Bearer for clients, the printed URL), files
owner-only, and requests whose client gave up never holding the engine."""
from __future__ import annotations

import re
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest
from support import ARTIFACTS
from support.servers import App, serve_in_thread

PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]
KEY = "k-" + "s3cret" * 4


# --- the guard, in-process on tiny models -----------------------------------------------------------------------
@pytest.fixture
def guarded(models):
    """The /v1 API on tiny models behind the guard (loopback rules), in this process: its counters can be read."""
    from fastapi import FastAPI

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.guard import Access, Guard
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=8192))  # room for long answers
    api = ApiServer(rt)
    root = FastAPI()
    root.mount("/v1", api.app())
    root.get("/")(lambda: {"page": "the app"})
    with serve_in_thread(lambda port: Guard(root, Access.serving(port, listen=False))) as url:
        yield url, rt, api
    rt.close()


@pytest.mark.parametrize("host", ["attacker.example:{port}", "attacker.example", "127.0.0.1:1", "localhost.evil:{port}",
                                  "", "127.0.0.1:{port}@evil", "[::1]x"])
def test_a_foreign_or_empty_host_is_refused_on_every_route(guarded, host):
    url, _, api = guarded
    port = url.rsplit(":", 1)[1]
    for method, path in (("GET", "/"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, url + path, headers={"Host": host.format(port=port)}, json={"messages": PROMPT},
                          timeout=30)
        assert r.status_code == 403, (host, path, r.text)
        assert "is not served here" in r.text
    assert api.generations == 0


def test_loopback_names_with_the_bound_port_are_served(guarded):
    url, _, _ = guarded
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert httpx.get(url + "/v1/models", headers={"Host": host}, timeout=30).status_code == 200, host


def test_a_cross_site_text_plain_post_starts_no_generation(guarded):
    url, _, api = guarded
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    # What any web page can send without a preflight: a "simple" request, from its own origin...
    r = httpx.post(url + "/v1/chat/completions", content=body, timeout=30,
                   headers={"Content-Type": "text/plain", "Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
    # ...or with its origin hidden (a Referer of the page, or neither): still no JSON, so no generation
    r = httpx.post(url + "/v1/chat/completions", content=body, timeout=30,
                   headers={"Content-Type": "text/plain", "Referer": "https://evil.example/page.html"})
    assert r.status_code == 403
    r = httpx.post(url + "/v1/chat/completions", content=body, timeout=30, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(url + "/v1/completions", data={"prompt": "hi"}, timeout=30)  # an HTML form's body
    assert r.status_code == 415
    assert r.headers["content-type"].startswith("application/json") and api.generations == 0
    # A sandboxed frame or a file:// page says "null": not an origin of this app either
    r = httpx.post(url + "/v1/chat/completions", json={"messages": PROMPT}, headers={"Origin": "null"}, timeout=30)
    assert r.status_code == 403 and api.generations == 0
    # The app's own page, and a tool that sends JSON, are answered
    own = httpx.post(url + "/v1/chat/completions", json={"messages": PROMPT, "max_tokens": 4}, timeout=60,
                     headers={"Origin": url})
    assert own.status_code == 200 and api.generations == 1


def test_a_queued_request_whose_client_gives_up_leaves_the_queue_at_once(guarded):
    url, rt, api = guarded
    body = {"prompt": "the cat", "max_tokens": 200, "stream": True}
    with rt.engine._lock:  # the engine is busy (a chat in the browser, say): requests queue behind it
        for stream in (True, False):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/completions", json=dict(body, stream=stream), timeout=1.5)
            deadline = time.monotonic() + 30
            while api.waiting and time.monotonic() < deadline:  # still holding the engine's lock here
                time.sleep(0.05)
            assert api.waiting == 0, f"stream={stream}: a request nobody waits for is still queued"
    r = httpx.post(url + "/v1/completions", json=dict(body, stream=False), timeout=60)
    assert r.status_code == 200 and r.json()["timings"]["predicted_n"] > 0


def test_a_client_that_hangs_up_before_a_whole_answer_stops_its_generation(guarded):
    url, rt, api = guarded
    long = {"messages": [{"role": "user", "content": "the cat " * 20}], "max_tokens": 100_000}
    results = []

    def ask():
        try:
            httpx.post(url + "/v1/chat/completions", json=long, timeout=0.3)
        except httpx.TimeoutException:
            results.append("gave up")

    # Several clients give up on whole (unstreamed) answers; each generation ends when its client goes. (On a busy
    # machine a client may give up while the one before is still winding down: its request leaves the queue
    # without ever running, which is as good.)
    for _ in range(3):
        t = threading.Thread(target=ask)
        t.start()
        t.join(30)
    deadline = time.monotonic() + 60
    while api.waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert results == ["gave up"] * 3 and api.waiting == 0
    done = [s for s in api.served if s.endpoint == "chat"]
    assert 1 <= len(done) <= 3 and all(s.finish == "cancelled" for s in done)  # none ran on to its context's end
    r = httpx.post(url + "/v1/chat/completions", json={"messages": PROMPT, "max_tokens": 8}, timeout=120)
    assert r.status_code == 200 and r.json()["timings"]["predicted_n"] > 0  # and the engine is free again


def test_turns_on_the_engine_are_first_come_first_served_and_a_cancelled_waiter_leaves_the_line():
    from app.engine.fair_lock import FairLock

    turns, order, cancels = FairLock(), [], [threading.Event() for _ in range(5)]

    def wait(i):
        if turns.acquire(cancels[i]):
            order.append(i)
            turns.release()
        else:
            order.append(f"{i} left")

    threads = []
    with turns:  # busy: five callers line up, in this order
        for i in range(5):
            threads.append(threading.Thread(target=wait, args=(i,)))
            threads[-1].start()
            while turns.waiting < i + 1:
                time.sleep(0.005)
        cancels[2].set()
        threads[2].join(10)
        assert order == ["2 left"] and turns.waiting == 4  # gone before the engine was free
    for t in threads:
        t.join(10)
    assert order == ["2 left", 0, 1, 3, 4]


# --- the real app ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loopback_app(tmp_path_factory):
    app = App(tmp_path_factory.mktemp("home-loopback"))
    yield app
    app.stop()


@pytest.mark.slow
def test_the_loopback_app_refuses_a_rebound_host_on_every_kind_of_route(loopback_app):
    url, port = loopback_app.url.rstrip("/"), loopback_app.port
    routes = ["/", "/gradio_api/info", "/config", "/v1/models", "/gradio_api/queue/data?session_hash=x",
              "/gradio_api/file=/etc/passwd", "/favicon.ico"]
    for path in routes:
        with httpx.stream("GET", url + path, timeout=30) as ok:  # passes the guard when asked properly
            assert ok.status_code == 200 or b"not served here" not in ok.read(), path
        r = httpx.get(url + path, headers={"Host": f"attacker.example:{port}"}, timeout=30)
        assert r.status_code == 403 and "not served here" in r.text, (path, r.status_code)
    r = httpx.post(url + "/gradio_api/queue/join", json={"fn_index": 0, "data": [], "session_hash": "x"},
                   headers={"Host": f"attacker.example:{port}"}, timeout=30)
    assert r.status_code == 403
    r = httpx.post(url + "/gradio_api/queue/join", json={"fn_index": 0, "data": [], "session_hash": "x"},
                   headers={"Origin": "https://evil.example"}, timeout=30)
    assert r.status_code == 403


@pytest.mark.slow
def test_the_loopback_app_answers_no_cross_site_chat_request(loopback_app):
    url = loopback_app.url + "v1/chat/completions"
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    for headers in ({"Content-Type": "text/plain", "Origin": "https://evil.example"}, {"Content-Type": "text/plain"}):
        assert httpx.post(url, content=body, headers=headers, timeout=60).status_code in (403, 415)
    assert httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=120).status_code == 200


@pytest.mark.slow
def test_files_the_app_writes_are_owner_only(loopback_app):
    home = loopback_app.home
    for folder in (home / "data", home / "config"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    written = [p for p in (home / "config").iterdir()] + list((home / "data").glob("conversations.sqlite3*"))
    assert any(p.name == "conversations.sqlite3" for p in written) and any(p.name == "settings.json" for p in written)
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p


@pytest.fixture(scope="module")
def listening_app(tmp_path_factory):
    app = App(tmp_path_factory.mktemp("home-listen"), "--listen", "--api-key", KEY)
    yield app
    app.stop()


@pytest.mark.slow
def test_listen_with_a_key_guards_the_gradio_api_and_v1(listening_app):
    from gradio_client import Client

    url = listening_app.url
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, it gets nothing
        Client(url, verbose=False).predict("rainbow", api_name="/search")
    for path in ("gradio_api/info", "config", "v1/models"):
        r = httpx.get(url + path, timeout=30)
        assert r.status_code == 401, path
    assert httpx.get(url + "v1/models", headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    client = Client(url, verbose=False, headers={"Authorization": f"Bearer {KEY}"})
    client.predict("rainbow", api_name="/search")  # answered
    # what "Use via API" lists: the four endpoints docs/api.md names (the page's other events stay callable)
    listed = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert set(listed) == {"/submit", "/chat", "/compare", "/new_chat"}, listed
    assert httpx.get(url + "v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200


@pytest.mark.slow
@pytest.mark.browser
def test_listen_shows_only_a_login_form_and_the_key_typed_with_enter_opens_the_app(listening_app, browser):
    page = browser.new_page()
    try:
        page.goto(listening_app.url, wait_until="domcontentloaded")
        page.locator("input#key").wait_for(state="visible", timeout=30_000)
        assert page.locator("#msg").count() == 0 and "sign in" in page.title().lower()
        page.keyboard.type("not the key")
        page.keyboard.press("Enter")
        page.get_by_text("That key is not right").wait_for(timeout=30_000)
        page.locator("input#key").fill("")
        page.locator("input#key").click()
        page.keyboard.type(KEY)
        page.keyboard.press("Enter")
        box = page.locator("#msg textarea")
        box.wait_for(state="visible", timeout=60_000)
        cookie = next(c for c in page.context.cookies() if c["name"] == f"specchat_{listening_app.port}")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and KEY not in cookie["value"]
        box.click()
        page.keyboard.type("Say hello.")
        page.keyboard.press("Enter")
        page.locator("#live-stats .spec-live[data-state='done']").wait_for(timeout=180_000)
        page.screenshot(path=str(_artifacts() / "listen-signed-in.png"), full_page=True)
    finally:
        page.close()


@pytest.fixture(scope="module")
def keyless_listening_app(tmp_path_factory):
    app = App(tmp_path_factory.mktemp("home-listen-keyless"), "--listen")
    yield app
    app.stop()


@pytest.mark.slow
@pytest.mark.browser
def test_listen_without_a_key_makes_one_and_the_printed_url_signs_in(keyless_listening_app, browser):
    line = keyless_listening_app.read_line("the key for this session is")
    url = re.search(r"(http://127\.0\.0\.1:\d+/\?key=\S+)", line).group(1)
    key = re.search(r"session is (\S+)", line).group(1)
    assert len(key) >= 24 and httpx.get(keyless_listening_app.url + "v1/models", timeout=30).status_code == 401
    page = browser.new_page()
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.locator("#msg textarea").wait_for(state="visible", timeout=60_000)
        assert "key=" not in page.url  # it left the address bar
    finally:
        page.close()
    ok = httpx.get(keyless_listening_app.url + "v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert ok.status_code == 200


def _artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
