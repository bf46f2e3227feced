"""Loads that killed the engine worker, kept across launches: a pair whose load killed it twice is not loaded again
at the next start (``cli.serve.startup_pair``), so a crash at load never becomes a crash loop."""
from __future__ import annotations

import json

from ...models.loader import LoadSpec
from ...paths import data_dir
from ...json_files import load_json, save_json

LIMIT = 2  # loads of one pair that killed the worker, in a row, before the app stops loading it by itself


def _path():
    return data_dir() / "engine-load-crashes.json"


def _key(spec: LoadSpec) -> str:
    """The pair and how it was loaded (-ngl among it): the same pair loaded another way is another load."""
    return json.dumps(spec.as_dict(), sort_keys=True)


def _read() -> dict:
    return load_json(_path())[0] or {}


def record(spec: LoadSpec, message: str) -> None:
    crashes = _read()
    seen = crashes.get(_key(spec), {})
    crashes[_key(spec)] = {"count": int(seen.get("count", 0)) + 1, "last": message}
    save_json(_path(), crashes)


def clear(spec: LoadSpec) -> None:
    """It loaded: whatever crashed before is forgiven."""
    crashes = _read()
    if crashes.pop(_key(spec), None) is not None:
        save_json(_path(), crashes)


def refusal(spec: LoadSpec) -> str | None:
    """Why the app does not load ``spec`` by itself at start (None: nothing stops it)."""
    seen = _read().get(_key(spec), {})
    if int(seen.get("count", 0)) < LIMIT:
        return None
    return (f"{spec.describe()} was not loaded at start: loading it killed the engine {seen['count']} times in a row "
            f"(last: {seen.get('last', '?')}). Load it under Settings → Models to try again.")
