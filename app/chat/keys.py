"""API keys for remote servers, kept apart from settings.json: one file in the user's config dir that only its owner
may read (0600), keyed by server URL. Keys are never logged, shown back in the UI or written anywhere else."""
from __future__ import annotations

import json
import os

from ..paths import config_dir
from .store import load_json

FILE = "server-keys.json"


def _normal(url: str) -> str:  # the same key for http://host:port, …/ and …/v1
    return url.strip().rstrip("/").removesuffix("/v1")


def key_for(url: str | None) -> str | None:
    if not url:
        return None
    data, _ = load_json(config_dir() / FILE)
    return (data or {}).get(_normal(url)) or None


def save_key(url: str, key: str | None) -> None:
    """Remember (or, with an empty key, forget) the key for ``url``. Written owner-only from the first byte: the
    temporary file is created 0600 and renamed over the old one."""
    path = config_dir() / FILE
    data, _ = load_json(path)
    data = data or {}
    if key:
        data[_normal(url)] = key
    elif data.pop(_normal(url), None) is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # in case the file existed with wider rights
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
