"""Nothing at start or on the wire keeps the app from running: a conversations file locked by another process or
replaced by a folder, frames from other pages, temporary folders left behind, a login cookie that never ends, and
clients that connect and never finish their request. The real app and `specchat serve`, started as a person would
(tests/support/servers.py), and the store, the guard and uvicorn's protocol in this process."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.servers import App, serve_in_thread, specchat_serve

from app.chat.conversations import Conversations
from app.paths import clear_stale_temp_folders

KEY = "k-" + "r3liable" * 3
FRAMING = {"x-frame-options": "DENY", "content-security-policy": "frame-ancestors 'none'"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Holder:
    """A second process holding ``path`` write-locked (``BEGIN EXCLUSIVE``), as a backup tool or another program
    would, until ``release``."""

    def __init__(self, path: Path, exclusive_mode: bool = False):
        pragma = "h.execute('PRAGMA locking_mode=EXCLUSIVE'); " if exclusive_mode else ""
        code = (f"import sqlite3, sys; h = sqlite3.connect({str(path)!r}, isolation_level=None); {pragma}"
                "h.execute('BEGIN EXCLUSIVE'); print('held', flush=True); sys.stdin.read()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def release(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def saved_store(path: Path, text: str = "kept") -> None:
    s = Conversations(path)
    s.add(s.create(), "user", text)
    s.close()


# --- the conversations file, in this process ------------------------------------------------------------------
@pytest.mark.parametrize("exclusive_mode", [False, True], ids=["begin-exclusive", "locking-mode-exclusive"])
def test_a_file_another_process_locks_is_left_untouched_and_merged_in_at_the_next_start(tmp_path, exclusive_mode):
    path = tmp_path / "conversations.sqlite3"
    saved_store(path, "from before")
    holder = Holder(path, exclusive_mode)
    try:
        before = digest(path)
        s = Conversations(path)
        assert s.warning and str(path) in s.warning and f"pid {holder.pid}" in s.warning, s.warning
        assert "\n" not in s.warning
        cid = s.create()
        s.add(cid, "user", "written while it was locked")
        assert [m["content"] for m in s.messages(cid)] == ["written while it was locked"]
        s.close()
        assert digest(path) == before  # not a byte changed, nothing moved
    finally:
        holder.release()
    s = Conversations(path)  # the lock is gone: this session's file joins the others, and is kept
    assert s.warning is None
    assert {c["title"] for c in s.list()} == {"from before", "written while it was locked"}
    assert [p.name for p in tmp_path.glob("*.merged")] and not list(tmp_path.glob("*.while-locked-*.sqlite3"))
    s.close()
    s = Conversations(path)  # merged once
    assert len(s.list()) == 2
    s.close()


def test_a_side_file_still_being_written_is_not_merged(tmp_path):
    """Two sessions at once: the first wrote beside a locked file and still runs; a later start leaves its file."""
    path = tmp_path / "conversations.sqlite3"
    saved_store(path)
    holder = Holder(path)
    code = textwrap.dedent(f"""
        import sys
        from app.chat.conversations import Conversations
        s = Conversations({str(path)!r})
        s.add(s.create(), "user", "the other session")
        print(s.warning, flush=True)
        sys.stdin.read()
    """)
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent)))
    try:
        assert "locked by" in other.stdout.readline()
        holder.release()
        s = Conversations(path)
        assert [c["title"] for c in s.list()] == ["kept"] and list(tmp_path.glob("*.while-locked-*.sqlite3"))
        s.close()
    finally:
        other.stdin.close()
        other.wait(30)
    s = Conversations(path)  # that session has ended: now it is added
    assert {c["title"] for c in s.list()} == {"kept", "the other session"}
    s.close()


def test_a_folder_where_the_file_should_be_is_set_aside_and_a_fresh_file_started(tmp_path):
    path = tmp_path / "conversations.sqlite3"
    path.mkdir()
    (path / "something.txt").write_text("not ours to delete")
    s = Conversations(path)
    assert s.warning and "set aside" in s.warning
    s.add(s.create(), "user", "works")
    s.close()
    [aside] = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert (aside / "something.txt").read_text() == "not ours to delete" and path.is_file()


def test_where_nothing_can_be_written_the_session_keeps_its_conversations_in_memory(tmp_path):
    (tmp_path / "data").write_text("a file where the data folder should be")
    s = Conversations(tmp_path / "data" / "conversations.sqlite3")
    assert s.warning and "memory only" in s.warning
    cid = s.create()
    s.add(cid, "user", "still answers")
    assert s.messages(cid)[0]["content"] == "still answers"
    s.close()


# --- temporary folders ------------------------------------------------------------------------------------------
def gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporary_folders_are_removed_only_when_ours_and_their_process_is_gone(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.1)
        stale = [tmp_path / f"specchat-gradio-{gone_pid()}-abc", tmp_path / f"specchat-compare-{gone_pid()}-x"]
        kept = [tmp_path / f"specchat-gradio-{live.pid}-abc",  # its process runs
                tmp_path / "specchat-gradio-abc123",  # no pid in its name: an earlier version's, owner unknown
                tmp_path / "specchat-perf-123-x",  # not a kind we make
                tmp_path / "other-gradio-123-x"]
        for folder in stale + kept:
            (folder / "sub").mkdir(parents=True)
            (folder / "sub" / "export.md").write_text("x")
        (tmp_path / f"specchat-gradio-{gone_pid()}-file").write_text("a file, not a folder")
        removed = clear_stale_temp_folders(tmp_path)
        assert sorted(removed) == sorted(stale)
        assert all(f.exists() for f in kept) and not any(f.exists() for f in stale)
    finally:
        live.stdin.close()
        live.wait(30)


def test_a_process_s_temporary_folders_are_removed_when_it_exits(tmp_path):
    code = textwrap.dedent("""
        import os
        from app.paths import clear_stale_temp_folders, temp_folder
        folder = temp_folder("compare")
        (folder / "chat.md").write_text("an export")
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        assert clear_stale_temp_folders() == []  # this process's own: never stale
        print(folder)
    """)
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(Path(__file__).parent.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("specchat-compare-") and not folder.exists()


# --- the guard: frames and the login cookie, in this process -----------------------------------------------------
@pytest.fixture
def listening_guard():
    from fastapi import FastAPI

    from app.server.guard import Access, Guard

    root = FastAPI()
    root.get("/")(lambda: {"page": "the app"})
    root.get("/v1/models")(lambda: {"data": []})
    made = {}

    def make(port):
        made["access"] = Access(port, listen=True, key=KEY)
        return Guard(root, made["access"])

    with serve_in_thread(make) as url:
        yield url, made["access"]


def test_every_answer_forbids_framing_refusals_and_logins_included(listening_guard):
    url, access = listening_guard
    bearer = {"Authorization": f"Bearer {KEY}"}
    answers = [httpx.get(url + "/", headers=bearer), httpx.get(url + "/v1/models", headers=bearer),
               httpx.get(url + "/", headers={"Accept": "text/html"}),  # the login page
               httpx.get(url + "/v1/models"),  # 401
               httpx.get(url + "/", headers={"Host": "evil.example"}),  # 403
               httpx.get(url + f"/?key={KEY}")]  # signed in: 303
    assert [r.status_code for r in answers] == [200, 200, 401, 401, 403, 303]
    for r in answers:
        assert {k: r.headers.get(k) for k in FRAMING} == FRAMING, (r.request.url, r.headers)


def test_the_login_cookie_lasts_a_week_is_renewed_on_use_and_refused_once_expired(listening_guard):
    from app.server.guard import RENEW_AFTER_SECONDS, SESSION_SECONDS

    url, access = listening_guard
    r = httpx.get(url + f"/?key={KEY}")
    cookie = r.headers["set-cookie"]
    assert f"Max-Age={SESSION_SECONDS}" in cookie and SESSION_SECONDS == 7 * 24 * 3600
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and KEY not in cookie
    token = cookie.split(";")[0].split("=", 1)[1]

    def get(token):
        cookie = f"{access.cookie_name}={token}".encode()  # as bytes: a forged one may not be ASCII
        return httpx.get(url + "/", headers={"Accept": "text/html", "Cookie": cookie})

    fresh = get(token)
    assert fresh.status_code == 200 and "set-cookie" not in fresh.headers  # not renewed on every answer
    day_old = get(access.session_token(int(time.time() - RENEW_AFTER_SECONDS - 60)))
    assert day_old.status_code == 200 and f"Max-Age={SESSION_SECONDS}" in day_old.headers["set-cookie"]
    renewed = day_old.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    assert access.session_age(renewed) < 60
    expired = get(access.session_token(int(time.time() - SESSION_SECONDS - 60)))
    assert expired.status_code == 401 and "set-cookie" not in expired.headers  # the login page again
    for forged in (token.split(".")[0] + ".0", "1." + token.split(".")[1], "", "é.x", "1" * 40 + "." + "0" * 64):
        assert get(forged).status_code == 401, forged


# --- slow clients, uvicorn in this process with short deadlines --------------------------------------------------
def test_idle_and_slow_clients_are_disconnected_while_others_are_answered(monkeypatch):
    import uvicorn

    from app.server import connections

    monkeypatch.setattr(connections.DeadlineProtocol, "header_seconds", 3.0)
    monkeypatch.setattr(connections.DeadlineProtocol, "body_idle_seconds", 4.0)

    async def echo(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            msg = await receive()
            body, more = body + msg.get("body", b""), msg.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length",
                                                                              str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    port = _free_port()
    config = connections.server_config(echo, "127.0.0.1", port)
    config.lifespan = "off"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        host = f"Host: 127.0.0.1:{port}\r\n".encode()
        clients = {"sends nothing": b"", "half a header": b"GET / HTTP/1.1\r\n" + host + b"X-Slow: ",
                   "stops mid-body": b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 100\r\n\r\nabc"}
        results = {name: [] for name in clients}
        threads = [threading.Thread(target=_hold, args=(port, first, name == "half a header", results[name]))
                   for name, first in clients.items()]
        for t in threads:
            t.start()
        # While they hang on, a normal request is answered, and a body that keeps coming, for longer than either
        # limit but never pausing long, is read whole
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
        with socket.create_connection(("127.0.0.1", port), timeout=30) as steady:
            steady.sendall(b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 12\r\n\r\n")
            for byte in b"twelve bytes":
                time.sleep(0.5)
                steady.sendall(bytes([byte]))
            answer = b""
            while not answer.endswith(b"twelve bytes") and (part := steady.recv(4096)):
                answer += part
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"twelve bytes"), answer
        for t in threads:
            t.join(90)
        for name, (closed_after,) in results.items():
            assert closed_after is not None and closed_after < 60, (name, closed_after)
    finally:
        server.should_exit = True
        thread.join(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hold(port: int, first: bytes, drip: bool, out: list, limit: float = 90) -> None:
    """Connect, send ``first`` (and, with ``drip``, a byte a second after it, as slowloris does); append how many
    seconds passed before the server closed the connection (None: still open after ``limit``)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        if first:
            s.sendall(first)
        while time.monotonic() - start < limit:
            try:
                if s.recv(4096) == b"":
                    break
            except socket.timeout:
                pass
            except OSError:
                break
            if drip:
                try:
                    s.sendall(b"x")
                except OSError:
                    break
        else:
            out.append(None)
            return
    out.append(time.monotonic() - start)


# --- the real app -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def locked_start(tmp_path_factory):
    """The app started while another process holds its conversations file locked, with a crashed SpecChat's
    temporary folders (and a running one's) in its temporary folder."""
    home, tmp = tmp_path_factory.mktemp("home-locked"), tmp_path_factory.mktemp("tmp-locked")
    db = home / "data" / "conversations.sqlite3"
    db.parent.mkdir(mode=0o700)
    saved_store(db, "from an earlier session")
    holder = Holder(db)
    stale = tmp / f"specchat-gradio-{gone_pid()}-abc"
    live = tmp / f"specchat-compare-{holder.pid}-abc"  # the holder stands in for a SpecChat still running
    for folder in (stale, live):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "export.json").write_text("{}")
    before = digest(db)
    app = App(home, TMPDIR=str(tmp))
    yield {"app": app, "db": db, "before": before, "holder": holder, "tmp": tmp, "stale": stale, "live": live}
    if app.proc.poll() is None:
        app.kill()
    holder.release()


@pytest.mark.slow
def test_a_locked_conversations_file_at_start_is_one_clear_line_and_the_app_answers(locked_start):
    from gradio_client import Client

    app, db, holder = locked_start["app"], locked_start["db"], locked_start["holder"]
    line = app.read_line("locked by")
    assert str(db) in line and f"pid {holder.pid}" in line and line.startswith("specchat: note:"), line
    assert not any("Traceback" in ln for ln in app.lines), "".join(app.lines)
    assert httpx.get(app.url, timeout=30).status_code == 200
    assert httpx.get(app.url + "v1/models", timeout=30).status_code == 200
    Client(app.url, verbose=False).predict("earlier", api_name="/search")  # the conversations answer
    assert digest(db) == locked_start["before"]


@pytest.mark.slow
def test_the_app_s_pages_and_api_forbid_framing(locked_start):
    url = locked_start["app"].url
    for path in ("", "config", "gradio_api/info", "v1/models", "favicon.ico"):
        r = httpx.get(url + path, timeout=30)
        assert {k: r.headers.get(k) for k in FRAMING} == FRAMING, (path, r.status_code, r.headers)


@pytest.mark.slow
def test_the_app_disconnects_half_sent_requests_and_answers_others_meanwhile(locked_start):
    """Five slowloris sockets (a byte a second, headers never finished) against the app's 20 s header deadline."""
    app = locked_start["app"]
    host = f"Host: 127.0.0.1:{app.port}\r\n".encode()
    results: list = []
    threads = [threading.Thread(target=_hold, args=(app.port, b"GET / HTTP/1.1\r\n" + host + b"X-Slow: ", True,
                                                    results)) for _ in range(5)]
    for t in threads:
        t.start()
    time.sleep(1)
    assert httpx.get(app.url, timeout=30).status_code == 200
    assert httpx.get(app.url + "v1/models", timeout=30).status_code == 200
    for t in threads:
        t.join(120)
    assert len(results) == 5 and all(r is not None and r < 60 for r in results), results


@pytest.mark.slow
def test_a_clean_stop_removes_the_app_s_temporary_folders_and_a_start_removes_stale_ones(locked_start):
    app, tmp = locked_start["app"], locked_start["tmp"]
    ours = [p for p in tmp.iterdir() if p.name.startswith(("specchat-gradio-", "specchat-compare-"))
            and f"-{app.proc.pid}-" in p.name]
    assert len(ours) == 2, list(tmp.iterdir())  # Gradio's cache and the exports
    assert not locked_start["stale"].exists() and locked_start["live"].exists()
    app.stop()
    assert not any(p.exists() for p in ours), list(tmp.iterdir())
    assert locked_start["live"].exists()  # its process still runs
    assert digest(locked_start["db"]) == locked_start["before"]


@pytest.mark.slow
def test_a_folder_in_the_conversations_file_s_place_is_set_aside_and_the_app_starts(tmp_path):
    home = tmp_path / "home"
    db = home / "data" / "conversations.sqlite3"
    (db / "inside").mkdir(parents=True)
    app = App(home, "--listen", "--api-key", KEY, TMPDIR=str(tmp_path))
    try:
        line = app.read_line("set aside")
        assert "conversations.sqlite3.unreadable-" in line, line
        [aside] = [p for p in db.parent.iterdir() if ".unreadable-" in p.name]
        assert (aside / "inside").is_dir() and db.is_file()
        r = httpx.get(app.url + f"?key={KEY}", timeout=30, follow_redirects=False)
        assert r.status_code == 303 and "Max-Age=604800" in r.headers["set-cookie"]
        assert httpx.get(app.url, cookies=r.cookies, timeout=30).status_code == 200
    finally:
        app.stop()


@pytest.mark.slow
def test_specchat_serve_forbids_framing_too(tmp_path):
    with specchat_serve(tmp_path / "home") as url:
        r = httpx.get(url + "/models", timeout=30)
        assert r.status_code == 200 and {k: r.headers.get(k) for k in FRAMING} == FRAMING
        r = httpx.get(url + "/models", headers={"Host": "evil.example"}, timeout=30)
        assert r.status_code == 403 and {k: r.headers.get(k) for k in FRAMING} == FRAMING
