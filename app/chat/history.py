"""The saved conversation: messages with, for each answer, its text runs (draft vs target) and its stats."""
from __future__ import annotations

from ..paths import data_dir
from .store import load_json, save_json

FILE = "history.json"


def load_history() -> tuple[list[dict], str | None]:
    data, warning = load_json(data_dir() / FILE)
    messages = (data or {}).get("messages", [])
    valid = [m for m in messages if isinstance(m, dict) and m.get("role") in ("user", "assistant")
             and isinstance(m.get("content"), str)]
    if len(valid) != len(messages) and not warning:
        warning = f"{len(messages) - len(valid)} unreadable message(s) in {FILE} were skipped."
    return valid, warning


def save_history(messages: list[dict]) -> None:
    save_json(data_dir() / FILE, {"version": 1, "messages": messages})


def for_model(messages: list[dict], system_prompt: str = "") -> list[dict]:
    """What the chat template sees: the system prompt and each turn's text, nothing else."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return head + [{"role": m["role"], "content": m["content"]} for m in messages]
