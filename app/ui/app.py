"""The Gradio app: thin views over app.chat.runtime's snapshot streams. No llama_cpp here; HTML comes from render.py.
The page is built here (the header, the tabs, the events) with the chat's handlers; each part's components and
handlers stand beside it: chat_tab.py, conversations_view.py (the conversation list), compare_tab.py,
models_tab.py, settings_panel.py and settings_view.py (the Settings tab: its components, its handlers).

Every handler that touches the engine shares one concurrency slot ("engine"), so two tabs sending at once are
queued (Gradio shows the queue) rather than interleaved; Stop runs outside the queue so it acts at once.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import gradio as gr

from ..chat.conversations import Conversations, for_model
from ..chat.runtime import Runtime
from ..chat.settings import Settings, load_settings, save_settings
from ..chat.worker import WorkerDied
from ..engine import EngineError
from ..models import hardware
from ..models.loader import LoadSpec
from ..paths import temp_folder
from ..resources import resource
from . import attachments, render
from .chat_tab import ChatTab
from .compare_tab import CompareRuns, CompareTab
from .conversations_view import ConversationsView
from .models_tab import FILES, SERVER, ModelsView, ready_pairs
from .settings_panel import server_fields
from .settings_view import SETTING_NAMES, SettingsView, collect

ENGINE = dict(concurrency_id="engine", concurrency_limit=1)
PUBLIC_API = ("submit", "chat", "compare", "new_chat")  # the app's Gradio API for gradio_client (docs/api.md)
SAVE_EVERY = 1.0  # seconds between saves of an answer while it streams: a crash loses at most this much
def api_panel(api_info, runtime: Runtime) -> str:
    """The API tab: where this app serves the OpenAI-compatible API (``api_info``: None where it does not)."""
    if not api_info:
        return ""
    if runtime.remote is not None:  # this app's /v1 serves a local pair; the server has its own API
        return render.notice(f"The chat runs on {runtime.remote.base}, which serves the OpenAI-compatible API itself: "
                             "point your clients there. This app's /v1 answers when a local pair is loaded.", "info")
    return render.api_panel(api_info(), runtime.info()["pair"])


class SpecChatUI:
    def __init__(self, runtime: Runtime, startup_notes: list[str] | None = None, api_info=None):
        """``api_info()``, where the app serves the OpenAI-compatible API too: its base URL, whether a key is
        required and the requests served (newest first)."""
        self.runtime = runtime
        self.api_info = api_info
        self.notes = list(startup_notes or [])
        self.cancels: dict[str, threading.Event] = {}  # per browser session: the generation Stop should end
        self.busy: set[str] = set()  # browser sessions with an answer queued or streaming
        self.store = Conversations()
        if self.store.warning:
            self.notes.append(self.store.warning)
        self.store.import_legacy()
        self.logo = resource("assets/logo.svg").read_text(encoding="utf-8")
        self.exports = temp_folder("compare")  # removed at exit
        self.models = ModelsView(self._tab, lambda: self.runtime.spec.pair if self.runtime.spec else None)
        self.conversations = ConversationsView(self.store, self.busy, self._tab, self.exports)
        self.comparisons = CompareRuns(runtime, self._cancel_for, self._images, collect, self.exports)
        self.settings = SettingsView(runtime, self._save, self._header, self._hardware, self._image_note)

    # --- helpers --------------------------------------------------------------------------------------------
    @staticmethod
    def _tab(request: gr.Request | None) -> str:
        return request.session_hash if request else ""

    def _cancel_for(self, request: gr.Request | None) -> threading.Event:
        ev = threading.Event()
        self.cancels[self._tab(request)] = ev
        return ev

    def _header(self) -> str:
        return render.header(self.runtime.info()["pair"], self.logo)

    def _hardware(self) -> str:
        return render.hardware_panel(hardware.snapshot(), self.runtime.info())

    def _api(self) -> str:
        return api_panel(self.api_info, self.runtime)

    def _save(self, settings: Settings) -> None:
        try:
            # The panel's settings carry no server: the one saved stays while a pair is loaded.
            save_settings(replace(settings, server=load_settings()[0].server).loaded(self.runtime.spec))
        except OSError as exc:
            self.notes.append(f"Settings could not be saved: {exc}")

    # --- page load ------------------------------------------------------------------------------------------
    def page_load(self):
        settings, s_warning = load_settings()
        notes = [n for n in (*self.notes, s_warning) if n]
        spec = self.runtime.spec or settings.models or LoadSpec(pair="starter")
        values = [getattr(settings, n) for n in SETTING_NAMES]
        values[SETTING_NAMES.index("drafter")] = self.settings.drafter_choice(settings.drafter)
        recent = self.store.list()
        view = list(self.conversations.open(recent[0]["id"] if recent else None, settings.show_draft_tokens))
        view[4] = render.notice(" ".join(notes), "warning") if notes else ""
        return [*view[:-1], self._header(), self._hardware(),
                gr.Dropdown(choices=ready_pairs(), value=SERVER if spec.server else spec.pair or FILES),
                spec.target or "", spec.draft or "", spec.ctx, spec.ngl, spec.ngld,
                *server_fields(spec if spec.server else settings.server or LoadSpec()),
                *values, self.models.refresh(), self._image_note()]

    # --- chat -----------------------------------------------------------------------------------------------
    def _images(self, paths: list[str]) -> list[bytes]:
        """The attached images, checked; an EngineError in words where the model takes none or a file is bad."""
        if paths and not self.runtime.takes_images:
            raise EngineError("This model takes no images: load it with its vision projector (mmproj) to send them, "
                              "or remove them and send the text." if self.runtime.remote is None else
                              "The server's model takes no images (it says so): remove them and send the text.")
        return attachments.read_images(paths)

    def _image_note(self) -> str:
        return attachments.note(self.runtime.takes_images, self.runtime.remote is not None)

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
        if self._tab(request) in self.busy:
            return refuse("An answer is still being written: wait for it or press Stop (Esc).", "warning")
        try:
            images = self._images(paths)
        except EngineError as exc:
            return refuse(str(exc))
        if conv is None or not self.store.exists(conv):
            conv, history = self.store.create(), []
        mid = self.store.add(conv, "user", text, images=images)
        self._cancel_for(request)
        self.busy.add(self._tab(request))
        history = history + [{"id": mid, "role": "user", "content": text, **({"images": images} if images else {})}]
        return (attachments.box_value("", []), history, conv, render.chat_messages(history, show_draft), "",
                gr.Radio(choices=self.conversations.choices(), value=conv), self.store.title(conv),
                render.live_panel(None, [], "queued"))

    def respond(self, request: gr.Request, history: list, conv, *values):
        """Stream the answer to the last user message, saving it as it goes. Outputs: history, chatbot, live
        panel, notice, textbox."""
        tab = self._tab(request)
        try:
            if not history or history[-1]["role"] != "user" or conv is None:
                yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                return
            yield from self._respond(request, history, conv, values)
        finally:
            self.busy.discard(tab)

    def _respond(self, request, history, conv, values):
        cancel = self.cancels.get(self._tab(request)) or threading.Event()
        show = bool(values[SETTING_NAMES.index("show_draft_tokens")])
        live, mid, finished = None, None, False
        try:
            settings = collect(values)
            messages = for_model(history, settings.system_prompt, images=self.runtime.takes_images)
            stream = self.runtime.answer(messages, settings, cancel)
            mid = self.store.add(conv, "assistant", "", state="streaming", drafter=settings.drafter,
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
            # Nothing is lost: the message goes back into the box, the conversation stays as it was.
            finished = True
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
        done = live.done
        answer = {"role": "assistant", "content": live.text, "segments": live.segments,
                  "stats": done.stats.as_dict(), "finish": done.finish_reason}
        notice = ""
        try:
            self.store.update(mid, live.text, segments=live.segments, stats=answer["stats"], finish=done.finish_reason)
        except Exception as exc:  # the answer is still shown; say it was not saved
            notice = render.notice(f"The answer could not be saved: {exc}", "warning")
        history = history + [{"id": mid, **answer}]
        self._save(settings)
        state = "cancelled" if done.finish_reason == "cancelled" else "done"
        yield (history, render.chat_messages(history, show), render.live_panel(live.stats, live.points, state),
               notice, gr.skip())

    def stop(self, request: gr.Request):
        ev = self.cancels.get(self._tab(request))
        if ev:
            ev.set()

    def regenerate(self, history: list, show_draft: bool, request: gr.Request):
        if self._tab(request) in self.busy:
            return gr.skip(), gr.skip()
        if history and history[-1]["role"] == "assistant":
            self.store.remove_message(history[-1]["id"])
            history = history[:-1]
        self._cancel_for(request)
        if history:
            self.busy.add(self._tab(request))
        return history, render.chat_messages(history, show_draft)

    def edit(self, history: list, conv, show_draft: bool, evt: gr.EditData, request: gr.Request):
        """A sent message edited in the chat (its pencil), then answered again. The last one changes in place (its
        answer goes, as Regenerate's does); an earlier one continues in a copy of the chat up to it, so the turns
        after it stay where they were. Outputs: history, conv, chatbot, notice, conversation list, title, live
        panel. Refused (the chat shows the message as it was) while this tab's answer is being written."""
        def refuse(msg: str, kind: str = "warning"):
            return (gr.skip(), gr.skip(), render.chat_messages(history, show_draft), render.notice(msg, kind),
                    gr.skip(), gr.skip(), gr.skip())
        if self._tab(request) in self.busy:
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
        self._cancel_for(request)
        self.busy.add(self._tab(request))
        return (history, conv, render.chat_messages(history, show_draft), "",
                gr.Radio(choices=self.conversations.choices(), value=conv), self.store.title(conv),
                render.live_panel(None, [], "queued"))

    def redraw(self, history: list, show_draft: bool):
        return render.chat_messages(history, show_draft)

    # --- layout ---------------------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        """The page: the header, the tabs, then their events."""
        s = Settings()
        with gr.Blocks(title="SpecChat", analytics_enabled=False) as demo:
            history = gr.State([])
            conv = gr.State(None)  # the conversation shown in this tab (None: a new chat, saved on its first message)
            deleted = gr.State(None)  # the conversation Undo brings back
            rows = gr.State([])
            header = gr.HTML(render.header(None, self.logo, ready=False))
            with gr.Tabs():
                with gr.Tab("Chat", id="chat"):
                    chat = ChatTab(s)
                with gr.Tab("Settings", id="settings"):
                    panel = self.settings.panel(s)
                with gr.Tab("Compare", id="compare"):
                    cmp = CompareTab()
                with gr.Tab("Models", id="models"):
                    self.models.build()
                with gr.Tab("Hardware", id="hardware") as hw_tab:  # (drawn afresh each time it is opened)
                    hw = gr.HTML(elem_id="hardware")
                    with gr.Row():  # (a button of its own size, not a bar across the page)
                        hw_refresh = gr.Button("Refresh", size="sm", scale=0, min_width=120)
                with gr.Tab("API", id="api", visible=self.api_info is not None) as api_tab:
                    api_panel = gr.HTML(elem_id="api-panel")
                    with gr.Row():
                        api_refresh = gr.Button("Refresh", size="sm", elem_id="api-refresh", scale=0, min_width=120)
            by_name = dict(system_prompt=chat.system, drafter=panel.drafter, temperature=panel.temperature,
                           top_k=panel.top_k, top_p=panel.top_p, min_p=panel.min_p, seed=panel.seed,
                           max_tokens=panel.max_tokens, draft_max=panel.draft_max, draft_min=panel.draft_min,
                           draft_p_min=panel.draft_p_min, adaptive=panel.adaptive,
                           enable_thinking=panel.enable_thinking, show_draft_tokens=chat.show_draft)
            values = [by_name[n] for n in SETTING_NAMES]  # the order collect() reads them in
            # What Load models reads before the settings: the pair or files, then the server's fields.
            to_load = [panel.pair, panel.target, panel.draft, panel.ctx, panel.ngl, panel.ngld, panel.s_url,
                       panel.s_key, panel.s_model, panel.s_off, panel.s_method]
            view = [history, conv, chat.chatbot, chat.live, chat.notice, chat.conv_list, chat.title, chat.undo]
            demo.load(self.page_load, None, [*view[:-1], header, hw, *to_load, *values, self.models.table,
                                             chat.images])
            self._wire_chat(chat, history, conv, values)
            self.conversations.wire(chat, view, deleted)
            self.comparisons.wire(cmp, rows, values, self.stop, ENGINE)
            demo.load(self.comparisons.restore, None, [rows, cmp.table, cmp.chart, cmp.export_csv, cmp.export_json],
                      queue=False)
            self.settings.wire(panel, values, to_load, chat.notice, header, hw, chat.images, ENGINE)
            for trigger, fn, out in ((hw_tab.select, self._hardware, hw), (hw_refresh.click, self._hardware, hw),
                                     (api_tab.select, self._api, api_panel), (api_refresh.click, self._api, api_panel)):
                trigger(fn, None, out, queue=False)
            self.models.wire(panel.pair, panel.target, panel.draft)
        for fn in demo.fns.values():  # the rest stay callable as before; "Use via API" lists only what docs/api.md does
            if fn.api_visibility == "public" and fn.api_name not in PUBLIC_API:
                fn.api_visibility = "undocumented"
        return demo

    def _wire_chat(self, chat: ChatTab, history: gr.State, conv: gr.State, values: list) -> None:
        """Send (or Enter) stores the message, then the answer streams; Stop, Regenerate, a sent message edited, the
        draft colouring."""
        respond_out = [history, chat.chatbot, chat.live, chat.notice, chat.msg]
        submit_out = [chat.msg, history, conv, chat.chatbot, chat.notice, chat.conv_list, chat.title, chat.live]
        # API (gradio_client): /submit adds a message to the session's conversation, /chat streams the answer.
        for trigger, api in ((chat.send.click, "public"), (chat.msg.submit, "undocumented")):
            trigger(self.submit, [chat.msg, history, conv, chat.show_draft], submit_out, queue=False,
                    api_name="submit" if api == "public" else None, api_visibility=api) \
                .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden",
                      api_name="chat" if api == "public" else None, api_visibility=api, **ENGINE)
        chat.stop.click(self.stop, None, None, queue=False)
        chat.regen.click(self.regenerate, [history, chat.show_draft], [history, chat.chatbot], queue=False) \
            .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden", **ENGINE)
        chat.chatbot.edit(self.edit, [history, conv, chat.show_draft],
                          [history, conv, chat.chatbot, chat.notice, chat.conv_list, chat.title, chat.live],
                          queue=False) \
            .then(self.respond, [history, conv, *values], respond_out, show_progress="hidden", **ENGINE)
        chat.show_draft.change(self.redraw, [history, chat.show_draft], chat.chatbot, queue=False)


def theme() -> gr.themes.Base:
    """Gradio's default theme fetches web fonts; this one uses the system's, so nothing leaves the machine. Field
    names read as quiet text over their fields, as in a desktop app's forms: amber is kept for what acts (Send,
    the chosen option) and for what the draft model contributed, not spent on every label."""
    return gr.themes.Soft(
        primary_hue="amber", neutral_hue="slate",
        font=["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"],
    ).set(
        block_title_background_fill="transparent", block_title_background_fill_dark="transparent",
        block_title_text_color="*neutral_600", block_title_text_color_dark="*neutral_300",
        block_title_padding="0 0 2px 0",
        block_label_background_fill="*background_fill_primary",
        block_label_background_fill_dark="*background_fill_primary",
        block_label_text_color="*neutral_500", block_label_text_color_dark="*neutral_400",
    )


def css() -> str:
    return resource("assets/specchat.css").read_text(encoding="utf-8")


# Escape stops what streams in the open tab, as its Stop button does (the chat's answer, Compare's runs), wherever
# the focus is: most often still in the box the message was typed in. Stop only ever ends this tab's own work.
# In a sent message being edited, Enter submits the edit and Escape cancels it, as in the message box (Gradio's
# edit box takes Enter as a new line; Shift+Enter still is one).
# Text typed but not sent (the message box, Compare's prompt) is kept in the browser's storage twice a second and
# put back after a reload or a restart of the app; a box the app emptied (sent) is kept empty. Only a change is
# written, so another tab of the app, its box untouched, leaves this one's text alone.
PAGE_JS = """() => {
  document.addEventListener('keydown', (e) => {
    if (e.isComposing) return;
    if (e.target.matches && e.target.matches('#chat textarea.edit-textarea')) {  // a sent message being edited
      const name = e.key === 'Escape' ? 'Cancel' : e.key === 'Enter' && !e.shiftKey ? 'Submit' : null;
      const button = name && [...document.querySelectorAll(`#chat button[aria-label="${name}"]`)]
        .find((b) => b.offsetParent !== null);
      if (button) { e.preventDefault(); e.stopPropagation(); button.click(); }
      return;
    }
    if (e.key !== 'Escape') return;
    const stop = [...document.querySelectorAll('#stop, #cmp-stop')].find((b) => b.offsetParent !== null);
    if (stop) stop.click();
  });
  // An answer drawn with HTML (draft colours, an interrupted mark) keeps its Markdown in a .spec-source: its Copy
  // button gives that, where Gradio's would give the HTML
  document.addEventListener('click', (e) => {
    const button = e.target.closest && e.target.closest('#chat button[aria-label="Copy message"]');
    const row = button && button.closest('.message-buttons');
    const source = row && row.previousElementSibling && row.previousElementSibling.querySelector('.spec-source');
    if (!source || !navigator.clipboard) return;
    e.preventDefault(); e.stopImmediatePropagation();
    navigator.clipboard.writeText(source.title).then(() => {  // a tick in place of the icon, as Gradio's own shows
      button.classList.add('spec-copied');
      setTimeout(() => button.classList.remove('spec-copied'), 2000);
    });
  }, true);
  const boxes = {'#msg textarea': 'specchat-unsent', '#cmp-prompt textarea': 'specchat-unsent-compare'};
  const seen = {};  // each box's value at the last look (absent: not restored yet)
  setInterval(() => {
    for (const [sel, key] of Object.entries(boxes)) {
      const box = document.querySelector(sel);
      if (!box) continue;
      if (!(key in seen)) {
        const kept = localStorage.getItem(key);
        if (kept && !box.value) {
          box.value = kept;
          box.dispatchEvent(new Event('input', {bubbles: true}));
        }
      } else if (box.value !== seen[key]) {
        if (box.value) localStorage.setItem(key, box.value); else localStorage.removeItem(key);
      }
      seen[key] = box.value;
    }
  }, 500);
}"""
