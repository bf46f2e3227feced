"""llama.cpp's own ``llama-server``, built from the llama.cpp vendored in the pinned llama-cpp-python sdist (see
tests/support/llama_sdist.py), so the remote-server tests drive the real thing with the same llama.cpp SpecChat runs.

Built once per machine in a temporary folder (15-20 minutes on two cores); the binary alone is kept in the user's
cache (``$XDG_CACHE_HOME/specchat-tests/`` or ``~/.cache/specchat-tests/``; ``SPECCHAT_TEST_CACHE`` overrides),
named after the sdist's SHA-256 and the build flags, so a fresh clone reuses it and a different llama.cpp or flag
set builds anew. Delete the folder to force a rebuild. No network: the web UI is left out
(``LLAMA_USE_PREBUILT_UI=OFF``), so is HTTPS. ``GGML_LLAMAFILE=OFF`` as for SpecChat's own build: batch-invariant
kernels, so greedy output with and without a draft is identical. It runs as every llama.cpp tool the tests start
does (tests/support/llama_tools.py): no repacked weights, as SpecChat loads them.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from . import llama_sdist
from .announce import say
from .llama_tools import Tool, running
from .servers import free_port

CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_LLAMAFILE=OFF",
               "-DBUILD_SHARED_LIBS=OFF"]


def cache_dir() -> Path:
    root = os.environ.get("SPECCHAT_TEST_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specchat-tests"


def binary() -> Path:
    """The built llama-server, building it first if this sdist's build with these flags is not cached. Only the
    (statically linked) binary is kept: llama.cpp's sources and objects go with the temporary build folder."""
    sdist = llama_sdist.path()
    key = hashlib.sha256(sdist.read_bytes() + " ".join(CMAKE_FLAGS).encode()).hexdigest()[:16]
    home = cache_dir() / f"{sdist.name.removesuffix('.tar.gz').replace('llama_cpp_python', 'llama-server')}-{key}"
    exe = home / "llama-server"
    if exe.is_file():
        return exe
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "build.lock", "w") as lock:  # one build for test runs started side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.is_file():
            build_binary(sdist, home, exe)
    return exe


def build_binary(sdist: Path, home: Path, exe: Path) -> None:
    """Build llama-server from the sdist's llama.cpp in a temporary folder; keep the binary alone as ``exe``."""
    log = home / "build.log"
    say(f"building llama.cpp's llama-server from {sdist.name}, once per machine (15-20 minutes on 2 cores); "
        f"log: {log}")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as tmp, open(log, "w") as out:
        src, build = Path(tmp) / "llama.cpp", Path(tmp) / "build"
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                    ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise RuntimeError(f"building llama-server failed: see {log}")
        shutil.copy2(build / "bin" / "llama-server", exe.with_suffix(".part"))
        os.replace(exe.with_suffix(".part"), exe)  # a build killed half-way leaves no binary behind
    say(f"built llama-server in {time.monotonic() - began:.0f} s: {exe}")


@contextmanager
def llama_server(model: Path, draft: Path | None = None, *extra: str) -> Iterator[str]:
    """llama-server on 127.0.0.1 with ``model`` (and ``draft`` as -md, draft-simple speculation); yields its URL."""
    with llama_server_tool(model, draft, *extra) as (url, _):
        yield url


@contextmanager
def llama_server_tool(model: Path, draft: Path | None = None, *extra: str) -> Iterator[tuple[str, Tool]]:
    """As :func:`llama_server`, yielding the running tool beside its URL (what it has printed: ``tool.output()``)."""
    port = free_port()
    cmd = [str(binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
           "-t", str(os.cpu_count() or 2), "--no-webui", "-fa", "off", *extra]  # plain attention: batch-invariant
    if draft:
        cmd += ["-md", str(draft), "--spec-type", "draft-simple"]
    url = f"http://127.0.0.1:{port}"
    with running("llama-server", cmd) as server:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            server.check_alive()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        else:
            raise RuntimeError("llama-server did not become healthy in 120 s")
        yield url, server
