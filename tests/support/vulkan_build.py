"""The pinned llama.cpp's libraries built for Vulkan, so the tests run the offload path on Mesa's lavapipe, a Vulkan
device that runs on the CPU: every CI run loads models with their layers on a GPU device, fits them to its memory
and verifies drafts with a GPU backend's kernels, which round a batch apart from one token as a real GPU's do.

Built once per machine (about 5 minutes on two cores) into the tests' build cache (tests/support/llama_build.py):
libllama, ggml's libraries and libmtmd, which llama-cpp-python loads in place of its own from
``LLAMA_CPP_LIB_PATH`` / ``MTMD_CPP_LIB`` (``environment()``; a process picks them at its first import of llama_cpp,
so what runs on them runs in a process of its own). What it needs, ``tests/support/vulkan_setup.sh`` installs:
Debian's Vulkan loader, glslc and lavapipe, and C++ headers new enough for ggml-vulkan (1.3.275+: Debian 12's
1.3.239 lack ``VK_EXT_layer_settings``), unpacked from Debian 13's libvulkan-dev into the build cache.
"""
from __future__ import annotations

import ctypes.util
import glob
import os
import shutil
from pathlib import Path

from . import llama_build

HEADERS_VERSION = "1.4.309"
LIBS = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so", "libggml-vulkan.so", "libmtmd.so")
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_VULKAN=ON", "-DGGML_LLAMAFILE=OFF",
               "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF",
               # the libraries find each other beside themselves once copied out of the build folder
               "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]


def headers() -> Path | None:
    """An include folder whose Vulkan headers have ``VK_EXT_layer_settings`` (the system's, else the one
    vulkan_setup.sh unpacked), or None."""
    for include in (Path("/usr/include"), llama_build.cache_dir() / f"vulkan-headers-{HEADERS_VERSION}/usr/include"):
        core = include / "vulkan" / "vulkan_core.h"
        if (include / "vulkan" / "vulkan.hpp").is_file() and "VK_EXT_layer_settings" in core.read_text("latin-1"):
            return include
    return None


def missing() -> list[str]:
    """What this machine lacks to build and run the Vulkan libraries on lavapipe (empty: nothing)."""
    lacks = [tool for tool in ("cmake", "glslc") if not shutil.which(tool)]
    if not ctypes.util.find_library("vulkan"):
        lacks.append("the Vulkan loader (libvulkan)")
    if not glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json"):
        lacks.append("Mesa's lavapipe (mesa-vulkan-drivers)")
    if not headers():
        lacks.append(f"Vulkan C++ headers {HEADERS_VERSION}")
    return lacks


def libs() -> Path:
    """The folder of the Vulkan build's libraries, building them first if they are not cached."""
    home = llama_build.home("llama-vulkan", CMAKE_FLAGS)
    lib = home / "lib"

    def make() -> None:
        flags = CMAKE_FLAGS + [f"-DVulkan_INCLUDE_DIR={headers()}"]  # (where, not what: left out of the cache key)
        with llama_build.built("llama.cpp's libraries for Vulkan", flags, ["llama", "mtmd"], home / "build.log",
                               "about 5 minutes") as bin_dir:
            part = home / "lib.part"
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir()
            for path in bin_dir.glob("lib*.so*"):  # the names and their versioned links, as linked
                shutil.copy2(path, part / path.name, follow_symlinks=False)
            absent = [name for name in LIBS if not (part / name).exists()]
            if absent:
                raise RuntimeError(f"the Vulkan build made no {', '.join(absent)}")
            os.replace(part, lib)

    return llama_build.once(home, lib, make)


def environment(lib: Path) -> dict[str, str]:
    """This process's environment with llama-cpp-python loading ``lib``'s libraries and ggml's Vulkan backend
    seeing the first device, lavapipe on these machines (ggml leaves out devices of type CPU unless they are named)."""
    return dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib), MTMD_CPP_LIB=str(lib), GGML_VK_VISIBLE_DEVICES="0")
