"""The conversations store: SQLite in WAL mode, crash-safe streaming answers, import of history.json, bad files."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from app.chat.conversations import Conversations, for_model, title_from
from app.json_files import save_json


@pytest.fixture
def store(tmp_path):
    s = Conversations(tmp_path / "c.sqlite3")
    yield s
    s.close()


def test_conversations_are_listed_newest_first_with_titles_from_the_first_message(store):
    a = store.create()
    store.add(a, "user", "How do hash maps handle collisions in practice and in theory?")
    b = store.create()
    store.add(b, "user", "Write a haiku")
    assert [c["id"] for c in store.list()] == [b, a]
    assert store.title(a) == "How do hash maps handle collisions in practice…"
    assert store.title(b) == "Write a haiku"
    store.add(a, "assistant", "Chaining or open addressing.")  # activity moves a conversation to the top
    assert [c["id"] for c in store.list()] == [a, b]
    store.rename(b, "  Poems  ")
    store.add(b, "user", "another")  # a renamed conversation keeps its name
    assert store.title(b) == "Poems"
    assert title_from("") == "New chat"


def test_messages_keep_their_figures_and_who_wrote_them(store):
    cid = store.create()
    store.add(cid, "user", "hi")
    stats = {"drafter": "model", "n_tokens": 3, "n_drafted": 4, "n_accepted": 2, "decode_seconds": 0.5}
    store.add(cid, "assistant", "hello there", segments=[["hello", True], [" there", False]], stats=stats,
              finish="stop", pair="starter", drafter="model")
    user, answer = store.messages(cid)
    assert user == {"id": user["id"], "role": "user", "content": "hi"}
    assert answer["segments"] == [["hello", True], [" there", False]] and answer["stats"] == stats
    assert (answer["finish"], answer["pair"], answer["drafter"]) == ("stop", "starter", "model")


def test_a_branch_copies_the_turns_before_a_message_and_leaves_the_original_whole(store):
    a = store.create()
    store.add(a, "user", "Describe this", images=[b"\x89PNG one"])
    store.add(a, "assistant", "A cat.", segments=[["A cat.", True]], stats={"n_tokens": 3}, finish="stop",
              drafter="model")
    later = store.add(a, "user", "And this?")
    store.add(a, "assistant", "A dog.")
    b = store.branch(a, later, "Describe this (edited)")
    copied, original = store.messages(b), store.messages(a)
    assert [m["content"] for m in original] == ["Describe this", "A cat.", "And this?", "A dog."]
    assert [{k: v for k, v in m.items() if k != "id"} for m in copied] == \
        [{k: v for k, v in m.items() if k != "id"} for m in original[:2]]  # images, figures and who drafted
    assert store.title(b) == "Describe this (edited)"
    assert {m["id"] for m in copied}.isdisjoint(m["id"] for m in original)


def test_an_edited_first_message_renames_the_conversation_unless_the_user_named_it(store):
    a, b = store.create(), store.create()
    first, later = store.add(a, "user", "Describe this", images=[b"\x89PNG one"]), store.add(a, "user", "And this?")
    store.edit(later, "And that?")
    assert store.title(a) == "Describe this"  # a later message leaves the title alone
    store.edit(first, "Describe that")
    assert store.title(a) == "Describe that"
    assert [(m["content"], m.get("images", [])) for m in store.messages(a)] == [("Describe that", [b"\x89PNG one"]),
                                                                        ("And that?", [])]
    named = store.add(b, "user", "Hello")
    store.rename(b, "Greetings")
    store.edit(named, "Hi")
    assert store.title(b) == "Greetings" and store.messages(b)[0]["content"] == "Hi"


def test_search_matches_titles_and_message_text(store):
    a, b = store.create(), store.create()
    store.add(a, "user", "tell me about lighthouses")
    store.add(b, "user", "pasta recipes")
    store.add(b, "assistant", "Boil water, add salt. 100% simple_")
    assert [c["id"] for c in store.list("LIGHTHOUSE")] == [a]
    assert [c["id"] for c in store.list("salt")] == [b]
    assert store.list("no such words") == []
    assert [c["id"] for c in store.list("100%")] == [b]  # LIKE wildcards in a query are plain text


def test_delete_removes_one_conversation_undo_brings_it_back_and_a_restart_purges_it(tmp_path):
    path = tmp_path / "c.sqlite3"
    s = Conversations(path)
    a, b = s.create(), s.create()
    s.add(a, "user", "keep me")
    s.add(b, "user", "delete me")
    s.delete(b)
    assert [c["id"] for c in s.list()] == [a] and not s.exists(b)
    s.undelete(b)
    assert {c["id"] for c in s.list()} == {a, b}
    s.delete(b)
    s.close()
    s = Conversations(path)
    assert [c["id"] for c in s.list()] == [a] and s.messages(b) == []  # purged, messages with it
    assert s.messages(a)[0]["content"] == "keep me"
    s.close()


def test_a_streaming_answer_is_marked_interrupted_after_the_process_dies(tmp_path):
    """A real crash: another process stores a question and half an answer, then is killed (SIGKILL)."""
    path = tmp_path / "c.sqlite3"
    code = textwrap.dedent(f"""
        import os, signal
        from app.chat.conversations import Conversations
        s = Conversations({str(path)!r})
        c = s.create()
        s.add(c, "user", "the question")
        m = s.add(c, "assistant", "", state="streaming")
        s.update(m, "half an ans", state="streaming")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == -9
    s = Conversations(path)
    [conv] = s.list()
    question, answer = s.messages(conv["id"])
    assert question["content"] == "the question"
    assert answer["content"] == "half an ans" and answer["finish"] == "interrupted"
    s.close()


def test_history_json_is_imported_once(tmp_path):
    save_json(tmp_path / "history.json", {"version": 1, "messages": [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer", "stats": {"n_tokens": 2}, "finish": "stop"},
        {"role": "bogus", "content": 1},
    ]})
    s = Conversations(tmp_path / "c.sqlite3")
    cid = s.import_legacy(tmp_path)
    assert [m["content"] for m in s.messages(cid)] == ["old question", "old answer"]
    assert s.messages(cid)[1]["stats"] == {"n_tokens": 2}
    assert s.import_legacy(tmp_path) is None and len(s.list()) == 1
    s.close()


def test_export_as_markdown_and_json(store):
    cid = store.create()
    store.add(cid, "user", "hi")
    store.add(cid, "assistant", "hello", stats={"drafter": "model", "n_tokens": 5, "n_drafted": 4, "n_accepted": 3,
                                                "decode_seconds": 0.5})
    md = store.export_markdown(cid)
    assert md.startswith("# hi\n") and "## You\n\nhi" in md and "## Assistant\n\nhello" in md
    assert "5 tokens · 8.0 tok/s" in md and "acceptance 75.0%" in md
    data = store.export(cid)
    assert json.loads(json.dumps(data))["messages"][1]["content"] == "hello"


def test_a_corrupt_file_is_set_aside_and_a_fresh_store_started(tmp_path):
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    s = Conversations(path)
    assert s.warning and "set aside" in s.warning
    assert s.list() == []
    asides = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert asides and asides[0].stat().st_size > 4000  # the old file kept, never deleted
    s.close()


def test_a_locked_file_is_left_alone_and_a_fresh_store_started_beside_it(tmp_path):
    """Held here by a second connection; tests/test_reliability.py holds it from another process."""
    path = tmp_path / "c.sqlite3"
    Conversations(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        s = Conversations(path)
        assert s.warning and "locked" in s.warning and path.exists()
        cid = s.create()
        s.add(cid, "user", "still works")
        assert s.messages(cid)[0]["content"] == "still works"
        s.close()
    finally:
        holder.close()


# --- images ---------------------------------------------------------------------------------------------------
PNG, JPEG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, b"\xff\xd8\xff\xe0" + b"\x00\xffjpeg" * 50


def test_a_messages_images_are_kept_in_order_and_leave_with_it(store):
    cid = store.create()
    mid = store.add(cid, "user", "What is in these?", images=[PNG, JPEG])
    store.add(cid, "assistant", "Two pictures.")
    question, answer = store.messages(cid)
    assert question["images"] == [PNG, JPEG] and "images" not in answer
    store.remove_message(mid)  # a refused message takes its images with it
    assert store._db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 0


def test_images_survive_a_kill_9_and_a_restart(tmp_path):
    path = tmp_path / "c.sqlite3"
    code = textwrap.dedent(f"""
        import os, signal
        from app.chat.conversations import Conversations
        s = Conversations({str(path)!r})
        c = s.create()
        s.add(c, "user", "look", images=[{PNG!r}, {JPEG!r}])
        s.add(c, "assistant", "", state="streaming")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == -9
    s = Conversations(path)
    [conv] = s.list()
    question, answer = s.messages(conv["id"])
    assert question["content"] == "look" and question["images"] == [PNG, JPEG] and answer["finish"] == "interrupted"
    s.close()


def test_images_are_exported_as_data_urls_and_reach_the_model_before_their_text(store):
    import base64

    cid = store.create()
    store.add(cid, "user", "describe", images=[PNG])
    store.add(cid, "assistant", "noise")
    store.add(cid, "user", "again", images=[JPEG])
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert store.export(cid)["messages"][0]["images"] == [url]
    assert f"![image 1]({url})" in store.export_markdown(cid)
    history = store.messages(cid)
    first, _, last = for_model(history, "")
    assert first["content"] == [{"type": "image", "image": PNG}, {"type": "text", "text": "describe"}]
    assert last["content"][0] == {"type": "image", "image": JPEG}
    # A model that takes no images: earlier turns go on as text, the last turn keeps its image (to be refused).
    first, _, last = for_model(history, "", images=False)
    assert first["content"] == "describe" and last["content"][0]["type"] == "image"


def test_a_session_beside_a_locked_file_brings_its_images_when_merged(tmp_path):
    path = tmp_path / "c.sqlite3"
    Conversations(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        side = Conversations(path)
        cid = side.create()
        side.add(cid, "user", "beside", images=[PNG])
        side.close()
    finally:
        holder.close()
    s = Conversations(path)
    [conv] = s.list()
    assert s.messages(conv["id"])[0]["images"] == [PNG]
    s.close()
