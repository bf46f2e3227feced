"""The Gradio app: thin views over app.chat.runtime's snapshot streams. No llama_cpp here; HTML comes from render.py.
The page is built here (the header, the tabs, the events); each part's components and handlers stand beside it:
chat_tab.py and chat_view.py (the chat), conversations_view.py (the conversation list), compare_tab.py,
models_tab.py, settings_panel.py and settings_view.py (the Settings tab: its components, its handlers).

Every handler that touches the engine shares one concurrency slot ("engine"), so two tabs sending at once are
queued (Gradio shows the queue) rather than interleaved; Stop runs outside the queue so it acts at once.
"""
from __future__ import annotations

import threading
from dataclasses import replace

import gradio as gr

from ..chat.conversations import Conversations
from ..chat.runtime import Runtime
from ..chat.settings import Settings, load_settings, save_settings
from ..engine import EngineError
from ..models import hardware
from ..models.loader import LoadSpec
from ..paths import temp_folder
from ..resources import resource
from . import attachments, render
from .chat_tab import ChatTab
from .chat_view import ChatView
from .compare_tab import CompareRuns, CompareTab
from .conversations_view import ConversationsView
from .models_tab import FILES, SERVER, ModelsView, ready_pairs
from .settings_panel import server_fields
from .settings_view import SETTING_NAMES, SettingsView, collect

ENGINE = dict(concurrency_id="engine", concurrency_limit=1)
PUBLIC_API = ("submit", "chat", "compare", "new_chat")  # the app's Gradio API for gradio_client (docs/api.md)


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
        self.chat = ChatView(runtime, self.store, self.busy, self.cancels, self._tab, self._cancel_for, self._images,
                             self._save, self.conversations.choices)

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

    def stop(self, request: gr.Request):
        ev = self.cancels.get(self._tab(request))
        if ev:
            ev.set()

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
            self.chat.wire(chat, history, conv, values, self.stop, ENGINE)
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
