"""Where SpecChat keeps its files: platformdirs' per-user data and config dirs (``SPECCHAT_HOME`` overrides both,
e.g. in tests)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import platformdirs


def _dir(kind: str) -> Path:
    root = os.environ.get("SPECCHAT_HOME")
    if root:
        path = Path(root) / kind
    elif kind == "data":
        path = Path(platformdirs.user_data_dir("specchat", appauthor=False))
    else:
        path = Path(platformdirs.user_config_dir("specchat", appauthor=False))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:  # conversations, settings and keys: nobody else's business
        path.chmod(0o700)
    return path


def data_dir() -> Path:
    """Models made locally (the starter target) and chat history."""
    return _dir("data")


def config_dir() -> Path:
    """Settings."""
    return _dir("config")


# --- temporary folders ------------------------------------------------------------------------------------------
# Folders the UI hands files out of (exports, Gradio's copies) are named specchat-KIND-PID-RANDOM: removed when this
# process exits, and, left by one that crashed, at the next start once their process is gone.
TEMP_PREFIX = "specchat-"
TEMP_KINDS = ("gradio", "compare")
_ours: list[Path] = []


def temp_folder(kind: str) -> Path:
    """A new owner-only (0700) temporary folder for this process, removed at its exit."""
    import atexit
    import tempfile

    if not _ours:
        atexit.register(remove_temp_folders)
    folder = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{kind}-{os.getpid()}-"))
    _ours.append(folder)
    return folder


def remove_temp_folders() -> None:
    """Remove this process's temporary folders (at a clean stop; registered with atexit too)."""
    import shutil

    while _ours:
        shutil.rmtree(_ours.pop(), ignore_errors=True)


def owner_alive(pid: int, since: float) -> bool:
    """Whether process ``pid`` may own something last changed at ``since`` (a file's mtime): it runs and it started
    before then (a process started later reuses the number of one that is gone)."""
    import psutil

    try:
        return psutil.Process(pid).create_time() <= since + 1
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.Error:  # another user's process: it may be the owner
        return True


def clear_stale_temp_folders(root: Path | None = None) -> list[Path]:
    """Remove the temporary folders a crashed SpecChat left: only ours (by name and owner), only those whose
    process is gone. Returns what was removed."""
    import shutil
    import tempfile

    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        kind, _, rest = path.name.removeprefix(TEMP_PREFIX).partition("-")
        pid = rest.partition("-")[0]
        if not path.name.startswith(TEMP_PREFIX) or kind not in TEMP_KINDS or not pid.isdigit():
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
        if not stat.S_ISDIR(st.st_mode) or not mine or int(pid) == os.getpid() or owner_alive(int(pid), st.st_mtime):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
