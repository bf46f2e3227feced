"""Servers the tests start as a person would: `specchat serve` on the starter pair (and llama.cpp's llama-server,
see tests/support/llama_server.py), each on a free 127.0.0.1 port, stopped with Ctrl-C."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def specchat_serve(home: Path, api_key: str | None = None, *args: str,
                   models: tuple[str, ...] = ("--pair", "starter"), env: dict | None = None,
                   with_process: bool = False, stopped_by_test: bool = False) -> Iterator[str]:
    """`specchat serve --pair starter` (or other ``models`` flags); yields its base URL (…/v1) and checks it stops
    cleanly. Drafts are fixed-length (``--no-adaptive``) unless ``args`` say ``--adaptive``: the tests assert that
    speculation drafted, and adaptive mode may measure, on a busy machine, that drafting does not pay and draft
    nothing (CI, 2026-11-27). ``with_process``: yield (URL, its Popen) instead; ``stopped_by_test``: the test ends it its own way (kill -9)."""
    if "--adaptive" not in args:
        args = ("--no-adaptive", *args)
    port = free_port()
    env = dict(os.environ, SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
    env.pop("SPECCHAT_API_KEY", None)
    if api_key:
        env["SPECCHAT_API_KEY"] = api_key
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", *models, "--port", str(port), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (line := proc.stdout.readline()):
        lines.append(line)
        if "running at" in line:
            break
    url = f"http://127.0.0.1:{port}/v1"
    if not any(url in ln for ln in lines):
        proc.kill()
        raise AssertionError("".join(lines))
    try:
        yield (url, proc) if with_process else url
    finally:
        if stopped_by_test:
            proc.kill()
            proc.communicate(timeout=30)
            return
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(lines) + out


class App:
    """`specchat` (the app) started as a person starts it, with ``args`` added to its command line
    (tests/support/net_guard.py logs any connection beyond loopback)."""

    def __init__(self, home: Path, *args: str, **env):
        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.net_log = home / "outside-connections.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "SPECCHAT_API_KEY"}
        environ.update(SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1", SPECCHAT_NET_LOG=str(self.net_log), **env)
        guard = Path(__file__).with_name("net_guard.py")
        self.proc = subprocess.Popen([sys.executable, str(guard), "--no-browser", "--port", str(self.port), *args],
                                     env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (line := self.proc.stdout.readline()):
            self.lines.append(line)
            if "running at" in line:
                break
        if not any(self.url in ln for ln in self.lines):
            self.proc.kill()
            raise AssertionError("".join(self.lines))

    def read_line(self, containing: str, timeout: float = 30) -> str:
        """The next line of its output that holds ``containing``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (line := self.proc.stdout.readline()):
            self.lines.append(line)
            if containing in line:
                return line
        raise AssertionError(f"no line with {containing!r} in:\n" + "".join(self.lines))

    def stop(self) -> None:
        """Ctrl-C: a clean shutdown, having reached nothing beyond 127.0.0.1."""
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, "".join(self.lines) + out
        assert self.net_log.read_text() == "", "the app reached beyond 127.0.0.1"

    def kill(self) -> None:
        """kill -9: no chance to save anything."""
        self.proc.kill()
        self.proc.communicate(timeout=30)


@contextmanager
def serve_in_thread(make_app, port: int | None = None) -> Iterator[str]:
    """An ASGI app (``make_app(port)``) served by uvicorn on a thread of this process; yields its base URL."""
    import threading

    import uvicorn

    port = port or free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app(port), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
