"""Saved conversations in one SQLite file (WAL): a row per message with its text, who wrote it and its figures,
and the images a message holds as blobs in the same file (one file to back up; committed with their message, so
they survive a crash as it does).

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
from ..paths import data_dir, owner_alive
from ..json_files import load_json

FILE = "conversations.sqlite3"
LEGACY_HISTORY = "history.json"  # the single conversation of earlier versions, imported once
TITLE_WORDS = 8
SIDE = "while-locked-"  # conversations.while-locked-PID-TIME.sqlite3: a session's file beside a locked one
_sides_open: set[Path] = set()  # such files this process has open

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
    segments TEXT,                           -- JSON [[text, origin], ...]: which drafter (or the target) wrote what
    stats TEXT,                              -- JSON: the engine's measured Stats
    finish TEXT,                             -- stop | length | cancelled | interrupted
    state TEXT NOT NULL DEFAULT 'done',      -- streaming while the answer is written, then done
    pair TEXT,
    drafter TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY,
    message INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    data BLOB NOT NULL                       -- the image file's bytes, in the message's order (by id)
);
CREATE INDEX IF NOT EXISTS images_by_message ON images(message, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def title_from(text: str) -> str:
    words = text.split()
    return " ".join(words[:TITLE_WORDS]) + ("…" if len(words) > TITLE_WORDS else "") or "New chat"


class Conversations:
    """All conversations. Thread-safe: Gradio calls in from its worker threads.

    Whatever the file's state, it opens and says what happened in ``warning``: a file another program holds (a
    second SpecChat, a backup tool) is left as it is and this session writes beside it, merged in at the next start
    once that session has ended; a file that cannot be opened (corrupt, a folder in its place) is set aside, never
    deleted; and where nothing can be written at all, the session keeps its conversations in memory only."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else data_dir() / FILE
        self.warning: str | None = None  # set when the file could not be used as it is
        self._lock = threading.RLock()
        self._side: Path | None = None  # the file this session writes beside a locked one
        self._db = self._start()

    # --- opening --------------------------------------------------------------------------------------------
    def _start(self) -> sqlite3.Connection:
        try:
            db = self._open(self.path)
        except (sqlite3.Error, OSError) as exc:
            if _locked(exc):
                return self._beside_locked()
            return self._set_aside(exc)
        self._merge_side_files(db)
        return db

    def _open(self, path: Path) -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only from the first byte; SQLite gives its -wal and -shm files the database file's permissions.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)  # a file from an earlier version may be wider
        db = sqlite3.connect(path, timeout=3, check_same_thread=False, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash of the app loses nothing committed
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("the integrity check failed")
            db.executescript(SCHEMA)
            _recover(db)  # the first write: where another program holds the file, it fails here (after 3 s)
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _beside_locked(self) -> sqlite3.Connection:
        """Another program holds the file: leave it untouched and start a fresh file beside it for this session."""
        holder = holder_of(self.path) or "another program"
        side = self.path.with_name(f"{self.path.stem}.{SIDE}{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}"
                                   f"{self.path.suffix}")
        self.warning = (f"The conversations file {self.path} is locked by {holder}, so it was left as it is: this "
                        f"session saves its conversations in {side.name}, added to the others at the next start.")
        try:
            db = self._open(side)
        except (sqlite3.Error, OSError) as exc:
            return self._in_memory(exc)
        self._side = side
        _sides_open.add(side)
        return db

    def _set_aside(self, exc: Exception) -> sqlite3.Connection:
        """The file cannot be opened (corrupt, a folder in its place): moved aside with a timestamp, a fresh one
        started."""
        stamp = time.strftime('%Y%m%d-%H%M%S')
        aside = self.path.with_name(f"{self.path.name}.unreadable-{stamp}")
        n = 1
        while any(Path(f"{aside}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
            aside, n = self.path.with_name(f"{self.path.name}.unreadable-{stamp}-{n}"), n + 1
        try:
            for suffix in ("", "-wal", "-shm"):
                src = Path(f"{self.path}{suffix}")
                if src.exists() or src.is_symlink():
                    os.replace(src, f"{aside}{suffix}")
            db = self._open(self.path)
        except (sqlite3.Error, OSError) as again:
            return self._in_memory(again)
        self.warning = (f"The conversations file could not be opened ({exc}); it was set aside as {aside.name} "
                        "and a fresh one started.")
        return db

    def _in_memory(self, exc: Exception) -> sqlite3.Connection:
        """Nothing can be written where conversations live: keep them in memory, and say so."""
        self.warning = (f"Conversations cannot be saved in {self.path.parent} ({exc}): this session keeps them in "
                        "memory only, until the app stops.")
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(SCHEMA)
        return db

    def _merge_side_files(self, db: sqlite3.Connection) -> None:
        """Add what sessions wrote beside a locked file (once each has ended), then rename their files
        ``….merged`` (kept, never deleted)."""
        for side in sorted(self.path.parent.glob(f"{self.path.stem}.{SIDE}*{self.path.suffix}")):
            pid = side.name.partition(SIDE)[2].partition("-")[0]
            try:
                if side in _sides_open or pid.isdigit() and int(pid) != os.getpid() \
                        and owner_alive(int(pid), side.stat().st_mtime):
                    continue  # still being written
                _merge(db, side)
                for suffix in ("", "-wal", "-shm"):
                    if Path(f"{side}{suffix}").exists():
                        os.replace(f"{side}{suffix}", f"{side}.merged{suffix}")
            except (sqlite3.Error, OSError) as exc:
                self.warning = f"The conversations in {side.name} could not be added ({exc}); the file is kept."

    def close(self) -> None:
        with self._lock:
            self._db.close()
            _sides_open.discard(self._side)

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
        """The conversation as the UI keeps it: role, content, a message's images (bytes) and, for answers,
        segments, stats and finish."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM messages WHERE conversation = ? ORDER BY id", (cid,)).fetchall()
            pictures: dict[int, list[bytes]] = {}
            for r in self._db.execute("SELECT i.message, i.data FROM images i JOIN messages m ON m.id = i.message "
                                      "WHERE m.conversation = ? ORDER BY i.id", (cid,)):
                pictures.setdefault(r["message"], []).append(bytes(r["data"]))
        out = []
        for r in rows:
            m = {"id": r["id"], "role": r["role"], "content": r["content"]}
            if r["id"] in pictures:
                m["images"] = pictures[r["id"]]
            for key in ("segments", "stats"):
                if r[key]:
                    m[key] = json.loads(r[key])
            for key in ("finish", "pair", "drafter"):
                if r[key]:
                    m[key] = r[key]
            out.append(m)
        return out

    def add(self, cid: int, role: str, content: str, *, segments=None, stats=None, finish=None,
            state: str = "done", pair: str | None = None, drafter: str | None = None, images=()) -> int:
        """A message and its ``images`` (bytes), in one transaction."""
        now = time.time()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(
                "INSERT INTO messages (conversation, role, content, segments, stats, finish, state, pair, drafter, "
                "created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (cid, role, content, _json(segments), _json(stats), finish, state, pair, drafter, now))
            self._db.executemany("INSERT INTO images (message, data) VALUES (?, ?)",
                                 [(cur.lastrowid, sqlite3.Binary(b)) for b in images])
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

    def edit(self, mid: int, content: str) -> None:
        """A sent message's text changed; when it is the first, the title follows it (as ``add`` named it), unless
        the user renamed the conversation."""
        with self._lock, self._db:
            self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, mid))
            self._db.execute(
                "UPDATE conversations SET title = :title WHERE renamed = 0 "
                "AND id = (SELECT conversation FROM messages WHERE id = :mid) "
                "AND :mid = (SELECT min(id) FROM messages WHERE conversation = conversations.id AND role = 'user')",
                {"title": title_from(content), "mid": mid})

    def branch(self, cid: int, before: int, title: str) -> int:
        """A new conversation, ``title``, holding a copy of ``cid``'s messages that came before message ``before``
        (an edited message then continues it, and ``cid`` keeps every turn it had)."""
        new = self.create(title)
        for m in self.messages(cid):
            if m["id"] >= before:
                break
            self.add(new, m["role"], m["content"], segments=m.get("segments"), stats=m.get("stats"),
                     finish=m.get("finish"), pair=m.get("pair"), drafter=m.get("drafter"), images=m.get("images", ()))
        return new

    def remove_message(self, mid: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE id = ?", (mid,))  # (its images go with it: cascade)

    # --- export ---------------------------------------------------------------------------------------------
    def export(self, cid: int) -> dict:
        """The conversation as JSON takes it: images as data URLs."""
        return {"title": self.title(cid), "messages": [
            {k: [data_url(b) for b in v] if k == "images" else v for k, v in m.items() if k != "id"}
            for m in self.messages(cid)]}

    def export_markdown(self, cid: int) -> str:
        """Markdown with the images inline (data URLs), so the file stands alone."""
        parts = [f"# {self.title(cid)}\n"]
        for m in self.messages(cid):
            pictures = "".join(f"![image {i + 1}]({data_url(b)})\n\n" for i, b in enumerate(m.get("images", ())))
            parts.append(f"## {'You' if m['role'] == 'user' else 'Assistant'}\n\n{pictures}{m['content'].strip()}\n")
            if m.get("stats"):
                s = Stats.from_dict(m["stats"])
                parts.append(f"*{s.n_tokens} tokens · {s.tokens_per_second:.1f} tok/s · {s.method} · "
                             f"acceptance {s.acceptance_rate:.1%}*\n")
        return "\n".join(parts)


def _recover(db: sqlite3.Connection) -> None:
    """Purge what was deleted last time; an answer still streaming when the app died is interrupted."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL")
        db.execute("UPDATE messages SET state = 'done', finish = 'interrupted' WHERE state = 'streaming'")


def _merge(db: sqlite3.Connection, side: Path) -> None:
    """Copy the conversations of ``side`` (a session's file beside a locked one) into ``db``, in one transaction,
    once: the file's name is remembered in ``meta``."""
    db.execute("ATTACH DATABASE ? AS side", (str(side),))
    try:
        with db:
            db.execute("BEGIN IMMEDIATE")
            if db.execute("SELECT 1 FROM meta WHERE key = ?", (f"merged {side.name}",)).fetchone():
                return
            # (a file from before images has no images table)
            pictures = db.execute("SELECT 1 FROM side.sqlite_master WHERE name = 'images'").fetchone()
            for conv in db.execute("SELECT * FROM side.conversations WHERE deleted IS NULL ORDER BY id").fetchall():
                cid = db.execute("INSERT INTO conversations (title, renamed, created, updated) VALUES (?,?,?,?)",
                                 (conv["title"], conv["renamed"], conv["created"], conv["updated"])).lastrowid
                for m in db.execute("SELECT * FROM side.messages WHERE conversation = ? ORDER BY id",
                                    (conv["id"],)).fetchall():
                    finish = "interrupted" if m["state"] == "streaming" else m["finish"]
                    mid = db.execute(
                        "INSERT INTO messages (conversation, role, content, segments, stats, finish, state, pair, "
                        "drafter, created) VALUES (?,?,?,?,?,?,'done',?,?,?)",
                        (cid, m["role"], m["content"], m["segments"], m["stats"], finish, m["pair"], m["drafter"],
                         m["created"])).lastrowid
                    if pictures:
                        db.execute("INSERT INTO images (message, data) SELECT ?, data FROM side.images "
                                   "WHERE message = ? ORDER BY id", (mid, m["id"]))
            db.execute("INSERT INTO meta VALUES (?, ?)", (f"merged {side.name}", str(time.time())))
    finally:
        db.execute("DETACH DATABASE side")


def _locked(exc: Exception) -> bool:
    """Whether SQLite failed because another connection holds the file (busy or locked), not because of the file."""
    name = getattr(exc, "sqlite_errorname", "")
    return isinstance(exc, sqlite3.OperationalError) and (
        name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(exc))


def holder_of(path: Path) -> str | None:
    """The process that has ``path`` (or its -wal/-shm) open, as "name (pid N)", if it can be found."""
    import psutil

    wanted = {os.path.realpath(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")}
    for proc in psutil.process_iter(["name"]):
        if proc.pid == os.getpid():
            continue
        try:
            if any(f.path in wanted for f in proc.open_files()):
                return f"{proc.info['name'] or 'a process'} (pid {proc.pid})"
        except psutil.Error:
            continue
    return None


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def data_url(image: bytes) -> str:
    import base64

    return f"data:{image_type(image)};base64,{base64.b64encode(image).decode()}"


def image_type(image: bytes) -> str:
    """The MIME type of an image file, from its first bytes (the formats the engine takes)."""
    for magic, mime in ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
                        (b"BM", "image/bmp")):
        if image.startswith(magic):
            return mime
    return "application/octet-stream"


def for_model(messages: list[dict], system_prompt: str = "", images: bool = True) -> list[dict]:
    """What the chat template sees: the system prompt and each turn's text (thinking included: the models' own
    templates decide whether earlier turns' thinking reaches the model) and images, before the text they came
    with, as content parts the runtime reads. ``images`` False (a model that takes none): earlier turns' images are
    left out, so the conversation goes on in text; the last turn's stay, to be refused in words."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    out = []
    for i, m in enumerate(messages):
        pictures = m.get("images") if images or i == len(messages) - 1 else None
        content = [*({"type": "image", "image": b} for b in pictures), {"type": "text", "text": m["content"]}] \
            if pictures else m["content"]
        out.append({"role": m["role"], "content": content})
    return head + out
