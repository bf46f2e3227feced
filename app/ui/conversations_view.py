"""The conversation list's handlers: show one, switch, start a new one, delete and undo, rename, search, export.
Its components stand in the Chat tab (chat_tab.py); SpecChatUI (app.py) builds the page and calls ``wire``."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

import gradio as gr

from ..chat.conversations import Conversations
from ..engine import Stats
from . import render
from .chat_tab import ChatTab


class ConversationsView:
    """Over the conversations ``store``. ``busy``: the browser sessions whose answer is queued or streaming (the
    app's), where switching is refused; ``tab``: a request's session; ``exports``: where exports are written."""

    def __init__(self, store: Conversations, busy: set[str], tab: Callable[[gr.Request | None], str],
                 exports: Path):
        self.store, self.busy, self.tab, self.exports = store, busy, tab, exports

    def choices(self, query: str = "") -> list[tuple[str, int]]:
        return [(c["title"], c["id"]) for c in self.store.list(query)]

    def open(self, conv: int | None, show_draft: bool, notice: str = "", query: str = "", undo: bool = False):
        """Show one conversation (None: a new, empty one). Outputs: history, conv, chatbot, live panel, notice,
        conversation list, title, undo button."""
        history = self.store.messages(conv) if conv is not None else []
        answers = [m for m in history if m.get("stats")]
        if answers:  # the panel shows the last answer's figures (its chart points are not kept)
            last = answers[-1]
            panel = render.live_panel(Stats.from_dict(last["stats"]), [],
                                      render.FINISH_STATE.get(last.get("finish"), "done"))
        else:
            panel = render.live_panel(None, [], "idle")
        return (history, conv, render.chat_messages(history, show_draft), panel, notice,
                gr.Radio(choices=self.choices(query), value=conv),
                self.store.title(conv) if conv is not None else "", gr.Button(visible=undo))

    def _refuse_if_busy(self, request: gr.Request | None, conv):
        """Switching while this tab's answer streams would mix two conversations: refuse, keep the current one."""
        if self.tab(request) not in self.busy:
            return None
        message = render.notice("An answer is being written: stop it (Stop) or let it finish, then switch.",
                                "warning")
        return (gr.skip(), gr.skip(), gr.skip(), gr.skip(), message, gr.Radio(value=conv), gr.skip(), gr.skip())

    def select(self, picked, conv, show_draft: bool, query: str, request: gr.Request):
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return refused
        return self.open(int(picked) if picked is not None and self.store.exists(int(picked)) else None,
                          show_draft, query=query)

    def new_chat(self, conv, show_draft: bool, request: gr.Request):
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return refused
        return self.open(None, show_draft)

    def delete(self, conv, show_draft: bool, request: gr.Request):
        """Outputs: as _open, plus the id Undo restores."""
        if conv is None:
            return *self.open(None, show_draft), None
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return *refused, gr.skip()
        title = self.store.title(conv)
        self.store.delete(conv)
        rest = self.store.list()
        note = render.notice(f"Deleted “{title}”. Undo brings it back until the app restarts.", "info")
        return *self.open(rest[0]["id"] if rest else None, show_draft, note, undo=True), conv

    def undelete(self, deleted, conv, show_draft: bool, request: gr.Request):
        if deleted is None:
            return *self.open(conv, show_draft), gr.skip()
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return *refused, gr.skip()
        self.store.undelete(deleted)
        return *self.open(deleted, show_draft), None

    def rename(self, title: str, conv, query: str):
        if conv is None:
            return gr.skip(), render.notice("Send a message first: a new chat is saved with its first message.",
                                            "warning")
        self.store.rename(conv, title or "")
        return gr.Radio(choices=self.choices(query), value=conv), ""

    def search(self, query: str, conv):
        return gr.Radio(choices=self.choices(query), value=conv)

    def export(self, conv):
        if conv is None:
            return gr.File(visible=False), render.notice("Nothing to export yet: this chat is empty.", "warning")
        folder = Path(tempfile.mkdtemp(prefix="specchat-chat-", dir=self.exports))
        name = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in self.store.title(conv))[:60] or "chat"
        md, js = folder / f"{name}.md", folder / f"{name}.json"
        md.write_text(self.store.export_markdown(conv), encoding="utf-8")
        js.write_text(json.dumps(self.store.export(conv), indent=1, ensure_ascii=False), encoding="utf-8")
        return gr.File(value=[str(md), str(js)], visible=True), ""

    def wire(self, chat: ChatTab, view: list, deleted: gr.State) -> None:
        """The conversation list: new, switch, search, rename, delete and undo, export. ``view``: what open
        returns."""
        conv, show_draft = view[1], chat.show_draft
        chat.new_chat.click(self.new_chat, [conv, show_draft], view, queue=False, api_name="new_chat")
        chat.chatbot.clear(self.new_chat, [conv, show_draft], view, queue=False)  # its bin icon: a fresh chat
        chat.conv_list.input(self.select, [chat.conv_list, conv, show_draft, chat.search], view, queue=False)
        chat.search.change(self.search, [chat.search, conv], chat.conv_list, queue=False)
        chat.title.submit(self.rename, [chat.title, conv, chat.search], [chat.conv_list, chat.notice], queue=False)
        chat.delete.click(self.delete, [conv, show_draft], [*view, deleted], queue=False)
        chat.undo.click(self.undelete, [deleted, conv, show_draft], [*view, deleted], queue=False)
        chat.export.click(self.export, conv, [chat.exported, chat.notice], queue=False)
