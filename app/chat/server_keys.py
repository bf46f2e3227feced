"""API keys for remote servers, kept apart from settings.json: one file in the user's config dir that only its owner
may read (0600), keyed by server URL. Keys are never logged, shown back in the UI or written anywhere else."""
from __future__ import annotations

from ..paths import config_dir
from ..json_files import load_json, save_json
from .remote_server import base_url

FILE = "server-keys.json"


def key_for(url: str | None) -> str | None:
    if not url:
        return None
    data, _ = load_json(config_dir() / FILE)
    return (data or {}).get(base_url(url)) or None


def save_key(url: str, key: str | None) -> None:
    """Remember (or, with an empty key, forget) the key for ``url`` (with or without /v1: the same server)."""
    path = config_dir() / FILE
    data, _ = load_json(path)
    data = data or {}
    if key:
        data[base_url(url)] = key
    elif data.pop(base_url(url), None) is None:
        return
    save_json(path, data, mode=0o600)
