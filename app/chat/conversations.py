"""Saved conversations in one SQLite file (WAL): a row per message with its text, who wrote it and its figures.

A sent message is stored before its answer starts, and the answer as it streams, so a crash loses at most the
last second of an answer; on the next start an answer that was still streaming is marked interrupted.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from ..engine import Stats
from ..paths import data_dir
from .json_files import load_json

FILE = "conversations.sqlite3"
LEGACY_HISTORY = "history.json"  # the single conversation of earlier versions, imported once
TITLE_WORDS = 8

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    renamed INTEGER NOT NULL DEFAULT 0,      -- 1 once the user named it: no longer follows the first message
    created REAL NOT NULL,
    updated REAL NOT NULL,
    deleted REAL                             -- set by delete, cleared by undo, purged on the next start
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    segments TEXT,                           -- JSON [[text, from_draft], ...]: which model wrote which text
    stats TEXT,                              -- JSON: the engine's measured Stats
    finish TEXT,                             -- stop | length | cancelled | interrupted
    state TEXT NOT NULL DEFAULT 'done',      -- streaming while the answer is written, then done
    pair TEXT,
    drafter TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def title_from(text: str) -> str:
    words = text.split()
    return " ".join(words[:TITLE_WORDS]) + ("…" if len(words) > TITLE_WORDS else "") or "New chat"


class Conversations:
    """All conversations. Thread-safe: Gradio calls in from its worker threads."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else data_dir() / FILE
        self.warning: str | None = None  # set when the file had to be set aside
        self._lock = threading.RLock()
        try:
            self._db = self._open()
        except sqlite3.Error as exc:
            self._db = self._set_aside_and_open(exc)
        self._recover()

    # --- opening --------------------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only from the first byte; SQLite gives its -wal and -shm files the database file's permissions.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(self.path, 0o600)  # a file from an earlier version may be wider
        db = sqlite3.connect(self.path, timeout=3, check_same_thread=False, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash of the app loses nothing committed
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("the integrity check failed")
            db.executescript(SCHEMA)
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _set_aside_and_open(self, exc: Exception) -> sqlite3.Connection:
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, f"{aside}{suffix}")
        self.warning = (f"The conversations file could not be opened ({exc}); it was set aside as {aside.name} "
                        "and a fresh one started.")
        return self._open()

    def _recover(self) -> None:
        """Purge what was deleted last time; an answer still streaming when the app died is interrupted."""
        with self._lock:
            self._db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL")
            self._db.execute("UPDATE messages SET state = 'done', finish = 'interrupted' WHERE state = 'streaming'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def import_legacy(self, folder: Path | None = None) -> int | None:
        """Import the single conversation of history.json once; returns the new conversation's id, if any."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM meta WHERE key = 'imported_history'").fetchone():
                return None
            self._db.execute("INSERT INTO meta VALUES ('imported_history', ?)", (str(time.time()),))
            data, _ = load_json((folder or data_dir()) / LEGACY_HISTORY)
            messages = [m for m in (data or {}).get("messages", []) if isinstance(m, dict)
                        and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)]
            if not messages:
                return None
            cid = self.create()
            for m in messages:
                self.add(cid, m["role"], m["content"], segments=m.get("segments"), stats=m.get("stats"),
                         finish=m.get("finish"))
            return cid

    # --- conversations --------------------------------------------------------------------------------------
    def create(self, title: str = "") -> int:
        now = time.time()
        with self._lock:
            cur = self._db.execute("INSERT INTO conversations (title, renamed, created, updated) VALUES (?,?,?,?)",
                                   (title, int(bool(title)), now, now))
            return cur.lastrowid

    def list(self, query: str = "") -> list[dict]:
        """Conversations newest first (by last activity); ``query`` matches titles and message text."""
        sql = "SELECT id, title, updated FROM conversations c WHERE deleted IS NULL"
        args: tuple = ()
        if query.strip():
            like = f"%{query.strip().replace('%', '').replace('_', '')}%"
            sql += (" AND (title LIKE ? OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id "
                    "AND m.content LIKE ?))")
            args = (like, like)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY updated DESC, id DESC", args).fetchall()
        return [{"id": r["id"], "title": r["title"] or "New chat", "updated": r["updated"]} for r in rows]

    def exists(self, cid: int | None) -> bool:
        with self._lock:
            return cid is not None and self._db.execute(
                "SELECT 1 FROM conversations WHERE id = ? AND deleted IS NULL", (cid,)).fetchone() is not None

    def title(self, cid: int) -> str:
        with self._lock:
            row = self._db.execute("SELECT title FROM conversations WHERE id = ?", (cid,)).fetchone()
        return (row["title"] if row else "") or "New chat"

    def rename(self, cid: int, title: str) -> None:
        title = " ".join(title.split())
        with self._lock:
            self._db.execute("UPDATE conversations SET title = ?, renamed = ? WHERE id = ?",
                             (title, int(bool(title)), cid))

    def delete(self, cid: int) -> None:
        """Hidden at once, purged on the next start: ``undelete`` brings it back until then."""
        with self._lock:
            self._db.execute("UPDATE conversations SET deleted = ? WHERE id = ?", (time.time(), cid))

    def undelete(self, cid: int) -> None:
        with self._lock:
            self._db.execute("UPDATE conversations SET deleted = NULL WHERE id = ?", (cid,))

    # --- messages -------------------------------------------------------------------------------------------
    def messages(self, cid: int) -> list[dict]:
        """The conversation as the UI keeps it: role, content and, for answers, segments, stats and finish."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM messages WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
        out = []
        for r in rows:
            m = {"id": r["id"], "role": r["role"], "content": r["content"]}
            for key in ("segments", "stats"):
                if r[key]:
                    m[key] = json.loads(r[key])
            for key in ("finish", "pair", "drafter"):
                if r[key]:
                    m[key] = r[key]
            out.append(m)
        return out

    def add(self, cid: int, role: str, content: str, *, segments=None, stats=None, finish=None,
            state: str = "done", pair: str | None = None, drafter: str | None = None) -> int:
        now = time.time()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(
                "INSERT INTO messages (conversation, role, content, segments, stats, finish, state, pair, drafter, "
                "created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (cid, role, content, _json(segments), _json(stats), finish, state, pair, drafter, now))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, cid))
            if role == "user":  # the first message names the conversation until the user renames it
                self._db.execute("UPDATE conversations SET title = ? WHERE id = ? AND renamed = 0 AND title = ''",
                                 (title_from(content), cid))
            return cur.lastrowid

    def update(self, mid: int, content: str, *, segments=None, stats=None, finish=None,
               state: str = "done") -> None:
        with self._lock:
            self._db.execute("UPDATE messages SET content = ?, segments = ?, stats = ?, finish = ?, state = ? "
                             "WHERE id = ?", (content, _json(segments), _json(stats), finish, state, mid))

    def remove_message(self, mid: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE id = ?", (mid,))

    # --- export ---------------------------------------------------------------------------------------------
    def export(self, cid: int) -> dict:
        return {"title": self.title(cid), "messages": [{k: v for k, v in m.items() if k != "id"}
                                                        for m in self.messages(cid)]}

    def export_markdown(self, cid: int) -> str:
        parts = [f"# {self.title(cid)}\n"]
        for m in self.messages(cid):
            parts.append(f"## {'You' if m['role'] == 'user' else 'Assistant'}\n\n{m['content'].strip()}\n")
            if m.get("stats"):
                s = Stats.from_dict(m["stats"])
                parts.append(f"*{s.n_tokens} tokens · {s.tokens_per_second:.1f} tok/s · {s.method} · "
                             f"acceptance {s.acceptance_rate:.1%}*\n")
        return "\n".join(parts)


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def for_model(messages: list[dict], system_prompt: str = "") -> list[dict]:
    """What the chat template sees: the system prompt and each turn's text (thinking included: the models' own
    templates decide whether earlier turns' thinking reaches the model), nothing else."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return head + [{"role": m["role"], "content": m["content"]} for m in messages]
