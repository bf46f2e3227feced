"""Builds of the llama.cpp vendored in the pinned llama-cpp-python sdist (tests/support/llama_sdist.py), made once per
machine and kept in the user's cache (``$XDG_CACHE_HOME/specchat-tests/`` or ``~/.cache/specchat-tests/``;
``SPECCHAT_TEST_CACHE`` overrides): llama.cpp's own llama-server (llama_server.py) and the libraries built for Vulkan
(vulkan_build.py). Each is named after the sdist's SHA-256 and the build flags, so a fresh clone reuses it and a
different llama.cpp or flag set builds anew; delete the folder to force a rebuild. Only what is kept survives: the
sources and objects go with a temporary folder.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from . import llama_sdist
from .announce import say


def cache_dir() -> Path:
    root = os.environ.get("SPECCHAT_TEST_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specchat-tests"


def home(name: str, flags: list[str]) -> Path:
    """The cache folder of the sdist's llama.cpp built as ``name`` with ``flags``: ``name-VERSION-KEY``."""
    sdist = llama_sdist.path()
    key = hashlib.sha256(sdist.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    return cache_dir() / f"{sdist.name.removesuffix('.tar.gz').replace('llama_cpp_python', name)}-{key}"


def once(folder: Path, ready: Path, make: Callable[[], None]) -> Path:
    """``ready`` (a path in ``folder``), made by ``make`` unless it is there; test runs started side by side wait
    for one build. ``make`` puts ``ready`` in place last (a rename), so a build killed half-way leaves none."""
    if ready.exists():
        return ready
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            make()
    return ready


@contextmanager
def built(what: str, flags: list[str], targets: list[str], log: Path, minutes: str) -> Iterator[Path]:
    """Build ``targets`` of the sdist's llama.cpp with ``flags`` in a temporary folder; yields its ``bin`` folder
    (executables and shared libraries), gone once the block ends."""
    sdist = llama_sdist.path()
    say(f"building {what} from {sdist.name}, once per machine ({minutes} on 2 cores); log: {log}")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-build-") as tmp, open(log, "w") as out:
        src, build = Path(tmp) / "llama.cpp", Path(tmp) / "build"
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *flags],
                    ["cmake", "--build", str(build), "--target", *targets, "-j", str(os.cpu_count() or 2)]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise RuntimeError(f"building {what} failed: see {log}")
        yield build / "bin"
    say(f"built {what} in {time.monotonic() - began:.0f} s")
