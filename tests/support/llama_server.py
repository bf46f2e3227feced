"""llama.cpp's own ``llama-server``, built from the llama.cpp vendored in the pinned llama-cpp-python sdist, so the
remote-server tests drive the real thing with the same llama.cpp SpecChat runs.

Built once per machine (15-20 minutes on two cores) and kept in the tests' build cache (tests/support/llama_build.py):
the binary alone. No network: the web UI is left out (``LLAMA_USE_PREBUILT_UI=OFF``), so is HTTPS.
``GGML_LLAMAFILE=OFF`` as for SpecChat's own build: batch-invariant kernels, so greedy output with and without a draft
is identical. It runs as every llama.cpp tool the tests start does (tests/support/llama_tools.py): no repacked
weights, as SpecChat loads them.
"""
from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from . import llama_build
from .llama_tools import Tool, running, threads
from .servers import free_port

CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_LLAMAFILE=OFF",
               "-DBUILD_SHARED_LIBS=OFF"]


def binary() -> Path:
    """The built (statically linked) llama-server, building it first if it is not cached."""
    home = llama_build.home("llama-server", CMAKE_FLAGS)
    exe = home / "llama-server"

    def make() -> None:
        with llama_build.built("llama.cpp's llama-server", CMAKE_FLAGS, ["llama-server"], home / "build.log",
                               "15-20 minutes") as bin_dir:
            shutil.copy2(bin_dir / "llama-server", exe.with_suffix(".part"))
            os.replace(exe.with_suffix(".part"), exe)

    return llama_build.once(home, exe, make)


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
           "-t", str(threads()), "--no-webui", "-fa", "off", *extra]  # plain attention: batch-invariant
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
