"""The Gradio app: thin views over app.chat.runtime's snapshot streams. No llama_cpp here; HTML comes from render.py.
The page is built here (header, Settings sidebar, the events); the tabs' layouts come from chat_tab.py,
compare_tab.py and models_tab.py.

Every handler that touches the engine shares one concurrency slot ("engine"), so two tabs sending at once are
queued (Gradio shows the queue) rather than interleaved; Stop runs outside the queue so it acts at once.
"""
from __future__ import annotations

import csv
import json
import tempfile
import threading
import time
from dataclasses import fields, replace
from pathlib import Path

import gradio as gr

from ..chat.conversations import Conversations, for_model
from ..chat.remote_server import RemoteServer, ServerSpec, base_url
from ..chat.runtime import Runtime
from ..chat.server_keys import key_for
from ..chat.settings import LOAD_SPECS, Settings, load_settings, save_settings
from ..chat.worker import WorkerDied
from ..engine import EngineError, Stats
from ..models import hardware
from ..models.loader import LoadSpec
from ..paths import temp_folder
from ..resources import resource
from . import attachments, render
from .chat_tab import ChatTab
from .compare_tab import CompareTab
from .models_tab import FILES, SERVER, ModelsView, ready_pairs
from .settings_panel import SettingsPanel, drafter_choices

ENGINE = dict(concurrency_id="engine", concurrency_limit=1)
SAVE_EVERY = 1.0  # seconds between saves of an answer while it streams: a crash loses at most this much
# Settings edited in the panel, in the order the handlers receive them.
# Settings the panel does not show: kept as start-up flags or settings.json set them (the n-gram kinds' settings)
NOT_IN_PANEL = tuple(f.name for f in fields(Settings) if not f.metadata.get("panel", True))
SETTING_NAMES = [f.name for f in fields(Settings) if f.name not in (*LOAD_SPECS, *NOT_IN_PANEL)]
LABELS = {"top_k": "Top-k", "seed": "Seed", "max_tokens": "Max tokens", "draft_max": "Draft max",
          "draft_min": "Draft min", "temperature": "Temperature", "top_p": "Top-p", "min_p": "Min-p",
          "draft_p_min": "Draft p-min"}


def collect(values) -> Settings:
    """Settings from the panel's values; an empty or malformed number is reported by its label."""
    d = dict(zip(SETTING_NAMES, values))
    base = Settings()
    for name, v in d.items():
        want = type(getattr(base, name))
        if want in (int, float) and (v is None or isinstance(v, str)):
            try:
                d[name] = want(v)
            except (TypeError, ValueError):
                raise EngineError(f"{LABELS.get(name, name)} must be a number (got {v!r}).") from None
        elif want is int and isinstance(v, float):
            if v != int(v):
                raise EngineError(f"{LABELS.get(name, name)} must be a whole number (got {v}).")
            d[name] = int(v)
    saved = load_settings()[0]
    return replace(base, **{n: getattr(saved, n) for n in NOT_IN_PANEL}, **d)


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

    def _drafter_note(self) -> str | None:
        """Why the loaded pair drafts as it does, where `specchat check --measure` measured its methods here."""
        ranking = self.runtime.ranking
        return ranking.why() if ranking else None

    def _hardware(self) -> str:
        return render.hardware_panel(hardware.snapshot(), self.runtime.info())

    def _api(self) -> str:
        if not self.api_info:
            return ""
        if self.runtime.remote is not None:  # this app's /v1 serves a local pair; the server has its own API
            return render.notice(f"The chat runs on {self.runtime.remote.base}, which serves the OpenAI-compatible "
                                 "API itself: point your clients there. This app's /v1 answers when a local pair is "
                                 "loaded.", "info")
        return render.api_panel(self.api_info(), self.runtime.info()["pair"])

    def _save(self, settings: Settings) -> None:
        try:
            # The panel's settings carry no server: the one saved stays while a pair is loaded.
            save_settings(replace(settings, server=load_settings()[0].server).loaded(self.runtime.spec))
        except OSError as exc:
            self.notes.append(f"Settings could not be saved: {exc}")

    # --- conversations --------------------------------------------------------------------------------------
    def _choices(self, query: str = "") -> list[tuple[str, int]]:
        return [(c["title"], c["id"]) for c in self.store.list(query)]

    def _open(self, conv: int | None, show_draft: bool, notice: str = "", query: str = "", undo: bool = False):
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
                gr.Radio(choices=self._choices(query), value=conv),
                self.store.title(conv) if conv is not None else "", gr.Button(visible=undo))

    def _refuse_if_busy(self, request: gr.Request | None, conv):
        """Switching while this tab's answer streams would mix two conversations: refuse, keep the current one."""
        if self._tab(request) not in self.busy:
            return None
        message = render.notice("An answer is being written: stop it (Stop) or let it finish, then switch.",
                                "warning")
        return (gr.skip(), gr.skip(), gr.skip(), gr.skip(), message, gr.Radio(value=conv), gr.skip(), gr.skip())

    def select(self, picked, conv, show_draft: bool, query: str, request: gr.Request):
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return refused
        return self._open(int(picked) if picked is not None and self.store.exists(int(picked)) else None,
                          show_draft, query=query)

    def new_chat(self, conv, show_draft: bool, request: gr.Request):
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return refused
        return self._open(None, show_draft)

    def delete(self, conv, show_draft: bool, request: gr.Request):
        """Outputs: as _open, plus the id Undo restores."""
        if conv is None:
            return *self._open(None, show_draft), None
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return *refused, gr.skip()
        title = self.store.title(conv)
        self.store.delete(conv)
        rest = self.store.list()
        note = render.notice(f"Deleted “{title}”. Undo brings it back until the app restarts.", "info")
        return *self._open(rest[0]["id"] if rest else None, show_draft, note, undo=True), conv

    def undelete(self, deleted, conv, show_draft: bool, request: gr.Request):
        if deleted is None:
            return *self._open(conv, show_draft), gr.skip()
        if (refused := self._refuse_if_busy(request, conv)) is not None:
            return *refused, gr.skip()
        self.store.undelete(deleted)
        return *self._open(deleted, show_draft), None

    def rename(self, title: str, conv, query: str):
        if conv is None:
            return gr.skip(), render.notice("Send a message first: a new chat is saved with its first message.",
                                            "warning")
        self.store.rename(conv, title or "")
        return gr.Radio(choices=self._choices(query), value=conv), ""

    def search(self, query: str, conv):
        return gr.Radio(choices=self._choices(query), value=conv)

    def export(self, conv):
        if conv is None:
            return gr.File(visible=False), render.notice("Nothing to export yet: this chat is empty.", "warning")
        folder = Path(tempfile.mkdtemp(prefix="specchat-chat-", dir=self.exports))
        name = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in self.store.title(conv))[:60] or "chat"
        md, js = folder / f"{name}.md", folder / f"{name}.json"
        md.write_text(self.store.export_markdown(conv), encoding="utf-8")
        js.write_text(json.dumps(self.store.export(conv), indent=1, ensure_ascii=False), encoding="utf-8")
        return gr.File(value=[str(md), str(js)], visible=True), ""

    # --- page load ------------------------------------------------------------------------------------------
    def page_load(self):
        settings, s_warning = load_settings()
        notes = [n for n in (*self.notes, s_warning) if n]
        spec = self.runtime.spec or settings.models or LoadSpec(pair="starter")
        values = [getattr(settings, n) for n in SETTING_NAMES]
        recent = self.store.list()
        view = list(self._open(recent[0]["id"] if recent else None, settings.show_draft_tokens))
        view[4] = render.notice(" ".join(notes), "warning") if notes else ""
        return [*view[:-1], self._header(), self._hardware(),
                gr.Dropdown(choices=ready_pairs(), value=SERVER if spec.server else spec.pair or FILES),
                spec.target or "", spec.draft or "", spec.ctx, spec.ngl, spec.ngld,
                *self._server_fields(spec if spec.server else settings.server or LoadSpec()),
                *values, self.models.refresh(), self._image_note()]

    @staticmethod
    def _server_fields(spec: LoadSpec) -> list:
        """URL, key box, model, speculation-off URL, method label. The key itself never goes back to the page: the
        box only says that one is saved."""
        saved = "a key is saved for this server (type to replace it)" if key_for(spec.server) else "none"
        return [spec.server or "", gr.Textbox(value="", placeholder=saved),
                gr.Dropdown(choices=[spec.model] if spec.model else [], value=spec.model),
                spec.server_off or "", spec.method or ""]

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
            return refuse("An answer is still being written: wait for it or press Stop.", "warning")
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
                gr.Radio(choices=self._choices(), value=conv), self.store.title(conv),
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
                       render.live_panel(live.stats, live.points, "running"), gr.skip(), gr.skip())
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

    def redraw(self, history: list, show_draft: bool):
        return render.chat_messages(history, show_draft)

    # --- compare --------------------------------------------------------------------------------------------
    def compare(self, request: gr.Request, box, rows: list, *values):
        """Outputs: off pane, on pane, summary, rows state, table, bar chart, CSV file, JSON file. The prompt's
        images go to both runs."""
        skip = [gr.skip()] * 5
        prompt, paths = attachments.box_parts(box)
        prompt = prompt.strip()
        if not prompt and not paths:
            yield gr.skip(), gr.skip(), render.notice("Type a prompt to compare."), *skip
            return
        cancel = self._cancel_for(request)
        try:
            settings = collect(values)
            turn = {"role": "user", "content": prompt, "images": self._images(paths)}
            messages = for_model([turn], settings.system_prompt)
            for cmp in self.runtime.compare(messages, settings, cancel):
                yield (render.compare_pane(cmp, "off"), render.compare_pane(cmp, "on"), render.compare_summary(cmp),
                       *skip)
        except EngineError as exc:
            yield gr.skip(), gr.skip(), render.notice(str(exc)), *skip
            return
        if not (cmp.off.done and cmp.on.done) or cmp.on.done.finish_reason == "cancelled":
            return
        rows = rows + [render.compare_row(cmp, len(rows) + 1, self.runtime.info()["pair"] or "")]
        csv_path, json_path = self._export(rows)
        yield (gr.skip(), gr.skip(), gr.skip(), rows,
               [list(r.values()) for r in rows], render.bar_chart([r["speedup"] for r in rows]),
               gr.DownloadButton(value=str(csv_path), interactive=True),
               gr.DownloadButton(value=str(json_path), interactive=True))

    def _export(self, rows: list[dict]) -> tuple[Path, Path]:
        csv_path, json_path = self.exports / "specchat-comparisons.csv", self.exports / "specchat-comparisons.json"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        json_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
        return csv_path, json_path

    # --- models ---------------------------------------------------------------------------------------------
    def load_models(self, progress: gr.Progress = gr.Progress(), *args):
        """Inputs: pair, target, draft, ctx, ngl, ngld, the server's URL, key, model, speculation-off URL and
        method label, then the settings. Outputs: notice, header, hardware, drafter, draft max, draft min, draft
        p-min, adaptive, key box, the words on images."""
        pair, target, draft, ctx, ngl, ngld, url, key, model, url_off, method, *values = args
        keep = [gr.skip()] * 6
        try:
            key = (key or "").strip() or None
            if pair == SERVER:
                spec = self._server_spec(url, model, url_off, method)
            else:
                numbers = [int(x) if x is not None else 0 for x in (ctx, ngl, ngld)]
                spec = LoadSpec(pair=pair, ctx=numbers[0], ngl=numbers[1], ngld=numbers[2]) if pair != FILES else \
                    LoadSpec(target=(target or "").strip() or None, draft=(draft or "").strip() or None,
                             ctx=numbers[0], ngl=numbers[1], ngld=numbers[2])
                if min(numbers) < -1 or numbers[0] < 0:
                    raise EngineError("Context size must be 0 (default) or more; GPU layers -1 (all), 0 or more.")
            self.runtime.load(spec, lambda f, msg: progress(f, desc=msg), api_key=key if spec.server else None)
        except (EngineError, ValueError, TypeError) as exc:
            return render.notice(str(exc)), self._header(), self._hardware(), *keep, self._image_note()
        # A new pair brings its recommended draft settings, and the drafter it can use.
        settings = collect(values).for_pair(self.runtime.recommended, self.runtime.drafters, self.runtime.preferred)
        self._save(settings)
        info = self.runtime.info()
        if server := info["server"]:
            msg = (f"Connected to {server['engine']} at {server['url']}: model {server['model']}, speculation "
                   f"{server['method']}" + (f"; speculation off from {server['off']}" if server["off"] else ""))
        else:
            msg = f"Loaded {info['pair']}: {info['target']}" + (f" + draft {info['draft']}" if info["draft"] else "")
        return (render.notice(msg, "info"), self._header(), self._hardware(),
                gr.update(choices=drafter_choices(settings.drafter), value=settings.drafter,
                          info=self._drafter_note()),
                settings.draft_max, settings.draft_min, settings.draft_p_min, settings.adaptive,
                self._server_fields(self.runtime.spec)[1], self._image_note())

    @staticmethod
    def _server_spec(url, model, url_off, method) -> LoadSpec:
        """The server fields as a LoadSpec (the key goes apart: it is saved once the server accepts it)."""
        url, url_off = (url or "").strip(), (url_off or "").strip()
        if not url:
            raise EngineError("Give the server's URL, e.g. http://127.0.0.1:8080 (llama-server, vLLM, SGLang, "
                              "specchat serve).")
        for u in (url, url_off):
            if u:
                base_url(u)  # a clear error at once
        return LoadSpec(server=url, model=(model or "").strip() or None, server_off=url_off or None,
                        method=(method or "").strip() or None)

    def test_server(self, url, key, model):
        """Test connection: the server's models and engine, and what it reports. Outputs: pair, model, report."""
        url = (url or "").strip()
        server = None
        try:
            server = RemoteServer(ServerSpec(url, (key or "").strip() or key_for(url), (model or "").strip() or None))
            models = server.models()
            engine, method = server.identify(), server.method()
        except EngineError as exc:
            return gr.skip(), gr.skip(), render.notice(str(exc))
        finally:
            if server is not None:
                server.close()
        chosen = model if model in models else models[0]
        lines = [f"{engine} at {server.base}", f"models: {', '.join(models)}", f"speculation: {method}"]
        return gr.Dropdown(value=SERVER), gr.Dropdown(choices=models, value=chosen), \
            render.notice(" · ".join(lines) + ". Press Load models to use it.", "info")

    # --- layout ---------------------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        """The page: the header, the tabs, the Settings sidebar, then their events."""
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
                with gr.Tab("Compare", id="compare"):
                    cmp = CompareTab()
                with gr.Tab("Models", id="models"):
                    self.models.build()
                with gr.Tab("Hardware", id="hardware") as hw_tab:  # (drawn afresh each time it is opened)
                    hw = gr.HTML(elem_id="hardware")
                    hw_refresh = gr.Button("Refresh", size="sm")
                with gr.Tab("API", id="api", visible=self.api_info is not None) as api_tab:
                    api_panel = gr.HTML(elem_id="api-panel")
                    api_refresh = gr.Button("Refresh", size="sm", elem_id="api-refresh")
            panel = SettingsPanel(s, self._drafter_note())
            by_name = dict(system_prompt=chat.system, drafter=panel.drafter, temperature=panel.temperature,
                           top_k=panel.top_k, top_p=panel.top_p, min_p=panel.min_p, seed=panel.seed,
                           max_tokens=panel.max_tokens, draft_max=panel.draft_max, draft_min=panel.draft_min,
                           draft_p_min=panel.draft_p_min, adaptive=panel.adaptive,
                           enable_thinking=panel.enable_thinking, show_draft_tokens=chat.show_draft)
            values = [by_name[n] for n in SETTING_NAMES]  # the order collect() reads them in
            # What load_models reads before the settings: the pair or files, then the server's fields.
            to_load = [panel.pair, panel.target, panel.draft, panel.ctx, panel.ngl, panel.ngld, panel.s_url,
                       panel.s_key, panel.s_model, panel.s_off, panel.s_method]
            view = [history, conv, chat.chatbot, chat.live, chat.notice, chat.conv_list, chat.title, chat.undo]
            demo.load(self.page_load, None, [*view[:-1], header, hw, *to_load, *values, self.models.table,
                                             chat.images])
            self._wire_chat(chat, history, conv, values)
            self._wire_conversations(chat, view, deleted)
            self._wire_compare(cmp, rows, values)
            panel.load.click(self.load_models, [*to_load, *values],
                             [chat.notice, header, hw, panel.drafter, panel.draft_max, panel.draft_min,
                              panel.draft_p_min, panel.adaptive, panel.s_key, chat.images], **ENGINE)
            for trigger in (panel.s_test.click, panel.s_url.submit):
                trigger(self.test_server, [panel.s_url, panel.s_key, panel.s_model], [panel.pair, panel.s_model,
                                                                                    chat.notice])
            for trigger, fn, out in ((hw_tab.select, self._hardware, hw), (hw_refresh.click, self._hardware, hw),
                                     (api_tab.select, self._api, api_panel), (api_refresh.click, self._api, api_panel)):
                trigger(fn, None, out, queue=False)
            self.models.wire(panel.pair, panel.target, panel.draft)
        return demo

    def _wire_chat(self, chat: ChatTab, history: gr.State, conv: gr.State, values: list) -> None:
        """Send (or Enter) stores the message, then the answer streams; Stop, Regenerate, the draft colouring."""
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
        chat.show_draft.change(self.redraw, [history, chat.show_draft], chat.chatbot, queue=False)

    def _wire_conversations(self, chat: ChatTab, view: list, deleted: gr.State) -> None:
        """The conversation list: new, switch, search, rename, delete and undo, export. ``view``: what _open
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

    def _wire_compare(self, cmp: CompareTab, rows: gr.State, values: list) -> None:
        """Compare (or Enter) runs the prompt off, then on; Stop ends it. ``rows``: the comparisons so far."""
        cmp.stop.click(self.stop, None, None, queue=False)
        for trigger, api in ((cmp.run.click, "public"), (cmp.prompt.submit, "undocumented")):
            trigger(self.compare, [cmp.prompt, rows, *values],
                    [cmp.off, cmp.on, cmp.summary, rows, cmp.table, cmp.chart, cmp.export_csv, cmp.export_json],
                    api_name="compare" if api == "public" else None, api_visibility=api, **ENGINE)


def theme() -> gr.themes.Base:
    """Gradio's default theme fetches web fonts; this one uses the system's, so nothing leaves the machine."""
    return gr.themes.Soft(
        primary_hue="amber", neutral_hue="slate",
        font=["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"],
    )


def css() -> str:
    return resource("assets/specchat.css").read_text(encoding="utf-8")
