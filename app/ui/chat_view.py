"""The chat's handlers: a message sent (stored before anything else), its answer streamed and saved as it goes,
Regenerate, Continue and a sent message edited. Its components are chat_tab.py's; SpecChatUI (app.py)
builds the page and calls ``wire``."""
from __future__ import annotations

import threading
import time
from typing import Callable

import gradio as gr

from ..chat.conversations import Conversations, for_model
from ..chat.live_answer import Live
from ..chat.runtime import Runtime
from ..chat.worker import WorkerDied
from ..engine import EngineError
from . import attachments, render
from .chat_tab import ChatTab
from .settings_view import SETTING_NAMES, collect

SAVE_EVERY = 1.0  # seconds between saves of an answer while it streams: a crash loses at most this much


class ChatView:
    """Over the ``runtime`` and the conversations ``store``. Per browser session (``tab(request)``): ``busy`` holds
    the sessions with an answer queued or streaming, ``cancels`` each one's Stop event (``cancel_for`` makes a new
    one). ``images(paths)`` reads attached images (an EngineError where the model takes none), ``save(settings)``
    keeps the settings an answer was written with, ``choices()`` lists the conversations."""

    def __init__(self, runtime: Runtime, store: Conversations, busy: set[str], cancels: dict[str, threading.Event],
                 tab: Callable, cancel_for: Callable, images: Callable, save: Callable, choices: Callable):
        self.runtime, self.store, self.busy, self.cancels = runtime, store, busy, cancels
        self.tab, self.cancel_for, self.images, self.save, self.choices = tab, cancel_for, images, save, choices
        self.continuing: set[str] = set()  # sessions whose queued answer goes on from the last one (Continue)

    def submit(self, box, history: list, conv, show_draft: bool, request: gr.Request):
        """Store the message (text and images) before anything else happens. Outputs: message box, history, conv,
        chatbot, notice, conversation list, title, live panel (waiting for the engine, not the last answer's
        state). A refused message stays in the box as it was."""
        text, paths = attachments.box_parts(box)
        text = text.strip()
        if not text and not paths:
            return (gr.skip(),) * 8

        def refuse(msg: str, kind: str = "error"):  # the box, the history and the chat stay as they are
            return (gr.skip(),) * 4 + (render.notice(msg, kind),) + (gr.skip(),) * 3
        if self.tab(request) in self.busy:
            return refuse("An answer is still being written: wait for it or press Stop (Esc).", "warning")
        try:
            images = self.images(paths)
        except EngineError as exc:
            return refuse(str(exc))
        if conv is None or not self.store.exists(conv):
            conv, history = self.store.create(), []
        mid = self.store.add(conv, "user", text, images=images)
        self.cancel_for(request)
        self.busy.add(self.tab(request))
        history = history + [{"id": mid, "role": "user", "content": text, **({"images": images} if images else {})}]
        return (attachments.box_value("", []), history, conv, render.chat_messages(history, show_draft), "",
                gr.Radio(choices=self.choices(), value=conv), self.store.title(conv),
                render.live_panel(None, [], "queued"))

    def respond(self, request: gr.Request, history: list, conv, *values):
        """Stream the answer to the last user message, or (Continue) the last answer further, saving it as it
        goes. Outputs: history, chatbot, live panel, notice, textbox."""
        tab = self.tab(request)
        try:
            going_on = tab in self.continuing
            self.continuing.discard(tab)
            if not history or conv is None or history[-1]["role"] != ("assistant" if going_on else "user"):
                yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                return
            if going_on:
                yield from self._respond(request, history[:-1], conv, values, history[-1])
            else:
                yield from self._respond(request, history, conv, values)
        finally:
            self.busy.discard(tab)

    def _respond(self, request, history, conv, values, prior: dict | None = None):
        """``prior``: the answer (after ``history``) that this one continues, in its message."""
        cancel = self.cancels.get(self.tab(request)) or threading.Event()
        show = bool(values[SETTING_NAMES.index("show_draft_tokens")])
        live, mid, finished = None, None, False
        try:
            settings = collect(values)
            messages = for_model(history, settings.system_prompt, images=self.runtime.takes_images)
            so_far = None if prior is None else Live.going_on(prior["content"], prior.get("segments"),
                                                               prior.get("stats"))
            stream = self.runtime.answer(messages, settings, cancel, continues=so_far)
            mid = prior["id"] if prior is not None else self.store.add(
                conv, "assistant", "", state="streaming", drafter=settings.drafter,
                pair=self.runtime.spec.describe() if self.runtime.spec else None)
            saved = time.monotonic()
            for live in stream:
                if time.monotonic() - saved >= SAVE_EVERY:
                    self.store.update(mid, live.text, segments=live.segments, stats=live.stats.as_dict(),
                                      state="streaming")
                    saved = time.monotonic()
                yield (gr.skip(), render.chat_messages(history, show, live),
                       render.live_panel(live.stats, live.points, "running", live.prompt), gr.skip(), gr.skip())
        except WorkerDied as exc:  # the engine's process died mid-answer: keep what it wrote, say what happened
            finished = True
            if mid is None:
                raise
            text, segments, stats = (live.text, live.segments, live.stats.as_dict()) if live else ("", [], None)
            self.store.update(mid, text, segments=segments, stats=stats, finish="interrupted")
            history = history + [{"id": mid, "role": "assistant", "content": text, "segments": segments,
                                  "stats": stats, "finish": "interrupted"}]
            yield (history, render.chat_messages(history, show),
                   render.live_panel(live.stats if live else None, live.points if live else [], "interrupted"),
                   render.notice(str(exc)), gr.skip())
            return
        except EngineError as exc:
            # Nothing is lost: the message goes back into the box (an answer continued stays as it was), the
            # conversation stays as it was.
            finished = True
            if prior is not None:
                self.store.update(prior["id"], prior["content"], segments=prior.get("segments"),
                                  stats=prior.get("stats"), finish=prior.get("finish"))
                history = history + [prior]
                yield (history, render.chat_messages(history, show), render.live_panel(None, [], "error"),
                       render.notice(str(exc)), gr.skip())
                return
            if mid is not None:
                self.store.remove_message(mid)
            self.store.remove_message(history[-1]["id"])
            box, history = attachments.box_value(history[-1]["content"], history[-1].get("images", [])), history[:-1]
            yield (history, render.chat_messages(history, show), render.live_panel(None, [], "error"),
                   render.notice(str(exc)), box)
            return
        finally:
            if not finished and mid is not None and (live is None or live.done is None):
                # The viewer went away mid-answer (tab closed): keep what was written, marked as stopped.
                self.store.update(mid, live.text if live else "", segments=live.segments if live else None,
                                  stats=live.stats.as_dict() if live else None, finish="cancelled")
        finished = True
        assert live is not None and live.done is not None and mid is not None  # (every stream ends with its Done)
        done = live.done
        answer = {"role": "assistant", "content": live.text, "segments": live.segments,
                  "stats": live.stats.as_dict(), "finish": done.finish_reason}
        notice = ""
        try:
            self.store.update(mid, live.text, segments=live.segments, stats=answer["stats"], finish=done.finish_reason)
        except Exception as exc:  # the answer is still shown; say it was not saved
            notice = render.notice(f"The answer could not be saved: {exc}", "warning")
        history = history + [{"id": mid, **answer}]
        self.save(settings)
        state = "cancelled" if done.finish_reason == "cancelled" else "done"
        yield (history, render.chat_messages(history, show), render.live_panel(live.stats, live.points, state),
               notice, gr.skip())


    def regenerate(self, history: list, show_draft: bool, request: gr.Request):
        if self.tab(request) in self.busy:
            return gr.skip(), gr.skip()
        if history and history[-1]["role"] == "assistant":
            self.store.remove_message(history[-1]["id"])
            history = history[:-1]
        self.cancel_for(request)
        if history:
            self.busy.add(self.tab(request))
        return history, render.chat_messages(history, show_draft)

    def carry_on(self, history: list, request: gr.Request):
        """Continue: the chat's last answer goes on from where it ended (the token limit, Stop, a crash), in the
        same message; ``respond`` streams it. Outputs: the notice, the live panel. Refused while this tab's answer
        is being written, and where the chat does not end with an answer."""
        tab = self.tab(request)
        if tab in self.busy:
            return render.notice("An answer is being written: let it finish (or stop it), then continue it.",
                                 "warning"), gr.skip()
        if not history or history[-1]["role"] != "assistant":
            return render.notice("Nothing to continue: Continue goes on with the chat's last answer, as where it "
                                 "hit the token limit or was stopped.", "info"), gr.skip()
        self.cancel_for(request)
        self.busy.add(tab)
        self.continuing.add(tab)
        return "", render.live_panel(None, [], "queued")

    def edit(self, history: list, conv, show_draft: bool, evt: gr.EditData, request: gr.Request):
        """A sent message edited in the chat (its pencil), then answered again. The last one changes in place (its
        answer goes, as Regenerate's does); an earlier one continues in a copy of the chat up to it, so the turns
        after it stay where they were. Outputs: history, conv, chatbot, notice, conversation list, title, live
        panel. Refused (the chat shows the message as it was) while this tab's answer is being written."""
        def refuse(msg: str, kind: str = "warning"):
            return (gr.skip(), gr.skip(), render.chat_messages(history, show_draft), render.notice(msg, kind),
                    gr.skip(), gr.skip(), gr.skip())
        if self.tab(request) in self.busy:
            return refuse("An answer is being written: stop it (Stop or Esc) or let it finish, then edit.")
        k = render.history_index(history, evt.index, show_draft)
        text = evt.value.strip() if isinstance(evt.value, str) else ""  # (the edited text row's: a string)
        if k is None or conv is None or history[k]["role"] != "user":
            return refuse("Only your own messages can be edited.")
        if not text:
            return refuse("An edited message needs some text: press Cancel to keep it as it was.")
        message = history[k]
        if any(m["role"] == "user" for m in history[k + 1:]):  # the list shows both: "… (edited)" on top
            conv = self.store.branch(conv, message["id"], f"{self.store.title(conv)} (edited)")
            self.store.add(conv, "user", text, images=message.get("images", ()))
            history = self.store.messages(conv)
        else:
            for m in history[k + 1:]:
                self.store.remove_message(m["id"])
            self.store.edit(message["id"], text)
            history = history[:k] + [{**message, "content": text}]
        self.cancel_for(request)
        self.busy.add(self.tab(request))
        return (history, conv, render.chat_messages(history, show_draft), "",
                gr.Radio(choices=self.choices(), value=conv), self.store.title(conv),
                render.live_panel(None, [], "queued"))

    def redraw(self, history: list, show_draft: bool):
        return render.chat_messages(history, show_draft)

    def wire(self, chat: ChatTab, history: gr.State, conv: gr.State, values: list, stop: Callable,
             engine: dict) -> None:
        """Send (or Enter) stores the message, then the answer streams; Stop, Regenerate, Continue, a sent message
        edited, the draft colouring."""
        respond_out = [history, chat.chatbot, chat.live, chat.notice, chat.msg]
        submit_out = [chat.msg, history, conv, chat.chatbot, chat.notice, chat.conv_list, chat.title, chat.live]
        # API (gradio_client): /submit adds a message to the session's conversation, /chat streams the answer.
        for trigger, api in ((chat.send.click, "public"), (chat.msg.submit, "undocumented")):
            trigger(self.submit, [chat.msg, history, conv, chat.show_draft], submit_out, queue=False,
                    api_name="submit" if api == "public" else None, api_visibility=api) \
                .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden",
                      api_name="chat" if api == "public" else None, api_visibility=api, **engine)
        chat.stop.click(stop, None, None, queue=False)
        chat.regen.click(self.regenerate, [history, chat.show_draft], [history, chat.chatbot], queue=False) \
            .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden", **engine)
        chat.go_on.click(self.carry_on, [history], [chat.notice, chat.live], queue=False) \
            .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden", **engine)
        chat.chatbot.edit(self.edit, [history, conv, chat.show_draft],
                          [history, conv, chat.chatbot, chat.notice, chat.conv_list, chat.title, chat.live],
                          queue=False) \
            .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden", **engine)
        chat.show_draft.change(self.redraw, [history, chat.show_draft], chat.chatbot, queue=False)
