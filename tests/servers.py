"""Servers the tests start as a person would: `specchat serve` on the starter pair (and llama.cpp's llama-server,
see tests/llama_server.py), each on a free 127.0.0.1 port, stopped with Ctrl-C."""
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
def specchat_serve(home: Path, api_key: str | None = None, *args: str) -> Iterator[str]:
    """`specchat serve --pair starter`; yields its base URL (…/v1) and checks it stops cleanly."""
    port = free_port()
    env = dict(os.environ, SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("SPECCHAT_API_KEY", None)
    if api_key:
        env["SPECCHAT_API_KEY"] = api_key
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--pair", "starter", "--port", str(port), *args],
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
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(lines) + out
