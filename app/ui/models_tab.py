"""The Models tab: the catalog with what is downloaded and whether it fits, downloads with per-file progress,
removal, any GGUF from the Hub (search, a repo's files, drafts that suit a target, checked before they come
down), and a check of your own pair before loading it. No llama_cpp here."""
from __future__ import annotations

import threading
from typing import Callable, Iterator

import gradio as gr

from ..engine import EngineError
from ..models import discover, downloads, hf_files, hub
from ..models.catalog import get_pair, load_catalog
from ..models.check import check_files, describe, own_drafting
from . import render

FILES = "(GGUF files below)"
SERVER = "(a server, below)"
POLL = 0.25  # seconds between progress updates
USE_FILTER = ["all", "chat", "code", "reasoning", "vision"]
# A row clicked, or focused and Enter pressed, picks its pair (the Pair list below the table follows).
PICK_ROW = """
const pick = (e) => {
  const row = e.target.closest('tr[data-pair]');
  if (row) trigger('click', {pair: row.dataset.pair});
};
element.addEventListener('click', pick);
element.addEventListener('keydown', (e) => { if (e.key === 'Enter') pick(e); });
"""
# The filters only show and hide rows (data attributes the stylesheet reads): nothing is asked of the server.
FILTER_JS = "(v) => { document.querySelector('#models-table').dataset.{key} = {value}; }"


def ready_pairs() -> list[str]:
    """What the chat's pair picker offers: pairs whose files are all on this machine, then "your own files"."""
    try:
        return [r["pair"] for r in downloads.rows() if r["ready"]] + [FILES, SERVER]
    except EngineError:
        return ["starter", FILES, SERVER]


class ModelsView:
    """Components of the tab (built by ``build``), their handlers and their events (``wire``)."""

    def __init__(self, tab_key: Callable[[gr.Request | None], str], loaded_pair: Callable[[], str | None]):
        self._tab_key = tab_key
        self._loaded_pair = loaded_pair
        self.cancels: dict[str, threading.Event] = {}

    def build(self) -> None:
        names = list(load_catalog())
        gr.Markdown("Pairs from `models.toml`. Downloads go to the Hugging Face cache (`HF_HUB_CACHE` / `HF_HOME`; "
                    "`HF_TOKEN` for gated models), resume after an interruption and are checked against the "
                    "Hub's SHA-256. A downloaded pair appears under Pair in the Settings tab.")
        with gr.Row():
            self.use_filter = gr.Radio(USE_FILTER, value="all", label="Show", elem_id="models-use", scale=3)
            self.well_only = gr.Checkbox(False, label="Only pairs that run well on this machine",
                                         elem_id="models-well", scale=2)
        self.table = gr.HTML(elem_id="models-table", js_on_load=PICK_ROW)
        with gr.Row():
            self.pick = gr.Dropdown(names, value=names[0] if names else None, label="Pair", scale=3,
                                    elem_id="models-pair")
            self.download = gr.Button("Download", variant="primary", elem_id="models-download")
            self.stop = gr.Button("Stop", variant="stop", elem_id="models-stop")
            self.remove = gr.Button("Remove", elem_id="models-remove")
        self.progress = gr.HTML(elem_id="models-progress")
        with gr.Accordion("Any GGUF from the Hub", open=False, elem_id="hub-find"):
            with gr.Row():
                self.query = gr.Textbox(label="Search the Hub for GGUF models (Enter)", lines=1, scale=4,
                                        placeholder="e.g. qwen2.5 7b instruct", elem_id="hub-query")
                self.find = gr.Button("Search", scale=1, elem_id="hub-search")
            with gr.Row():
                self.results = gr.Dropdown([], label="Repos, most downloaded first", interactive=True,
                                           elem_id="hub-results")
                self.files = gr.Dropdown([], label="Its GGUF models", interactive=True, elem_id="hub-files")
            with gr.Row():
                self.repo = gr.Textbox(label="Repo id", placeholder="owner/name", elem_id="hub-repo")
                self.file = gr.Textbox(label="GGUF file (a split model: its first shard)", elem_id="hub-file")
                self.role = gr.Radio(["target", "draft"], value="target", label="Use as", elem_id="hub-role")
            with gr.Row():
                self.fetch = gr.Button("Download file", elem_id="hub-fetch")
                self.suggest = gr.Button("Suggest drafts for this target", elem_id="hub-suggest")
            self.drafts = gr.Dropdown([], label="Drafts that suit it (checked from the files' headers)",
                                      interactive=True, elem_id="hub-drafts")
            self.advice = gr.HTML(elem_id="hub-advice")
            self.hub_target = gr.State(None)  # (repo, file) of the target chosen on the Hub, for pairing advice
        gr.Markdown("### Your own pair\nAny two GGUF files: their metadata is read (no weights loaded) to check "
                    "that the draft shares the target's tokenizer, to estimate memory and recommend GPU offload.")
        with gr.Row():
            self.own_target = gr.Textbox(label="Target GGUF", elem_id="own-target")
            self.own_draft = gr.Textbox(label="Draft GGUF (empty: suggest drafts)", elem_id="own-draft")
            self.own_ctx = gr.Number(0, label="Context (0 = default)", precision=0, elem_id="own-ctx")
        with gr.Row():
            self.check = gr.Button("Check pair", elem_id="own-check")
            self.use = gr.Button("Use in chat", elem_id="own-use")
        self.report = gr.HTML(elem_id="pair-report")

    def wire(self, pair: gr.Dropdown, target: gr.Textbox, draft: gr.Textbox) -> None:
        """The tab's events, once the chat's pair picker and GGUF paths (Settings → Models) exist: a download or
        "Use in chat" updates them. Downloads have their own slot, so a chat can go on while a pair comes down."""
        download = dict(concurrency_id="download", concurrency_limit=1, show_progress="hidden")
        self.download.click(self.pull_pair, [self.pick], [self.progress, self.table, pair], api_name="pull",
                            **download)
        self.fetch.click(self.pull_file, [self.repo, self.file, self.role, self.hub_target],
                         [self.progress, self.table, pair, target, draft, self.hub_target], **download)
        for trigger in (self.find.click, self.query.submit):
            trigger(self.search_hub, self.query, [self.results, self.files, self.advice])
        self.results.input(self.pick_repo, self.results, [self.files, self.repo, self.file, self.advice])
        self.files.input(lambda f: f or gr.skip(), self.files, self.file, queue=False)
        self.suggest.click(self.suggest_drafts, [self.repo, self.file],
                           [self.drafts, self.advice, self.hub_target, self.role])
        self.drafts.input(self.pick_draft, self.drafts, [self.repo, self.file, self.role], queue=False)
        self.stop.click(self.stop_download, None, None, queue=False)
        self.table.click(self.pick_row, None, self.pick, queue=False)
        self.use_filter.change(None, self.use_filter, None,
                               js=FILTER_JS.replace("{key}", "use").replace("{value}", "v"))
        self.well_only.change(None, self.well_only, None,
                              js=FILTER_JS.replace("{key}", "well").replace("{value}", "v ? 'yes' : 'any'"))
        self.remove.click(self.remove_pair, [self.pick], [self.progress, self.table, pair], queue=False)
        self.check.click(self.check_pair, [self.own_target, self.own_draft, self.own_ctx], self.report)
        self.use.click(self.use_in_chat, [self.own_target, self.own_draft], [pair, target, draft, self.report],
                       queue=False)

    # --- handlers -------------------------------------------------------------------------------------------
    def refresh(self) -> str:
        return render.models_table(downloads.rows())

    def pick_row(self, evt: gr.EventData):
        """A row of the table clicked: its pair becomes the one Download and Remove act on."""
        pair = (evt._data or {}).get("pair") if isinstance(evt._data, dict) else None
        return pair if pair in load_catalog() else gr.skip()

    def pull_pair(self, name: str, request: gr.Request) -> Iterator[tuple]:
        """Outputs: progress, table, chat pair picker."""
        try:
            pair = get_pair(name or "")
        except EngineError as exc:
            yield render.notice(str(exc)), gr.skip(), gr.skip()
            return
        if not downloads.hub_files(pair.sources):
            yield render.download_progress([], "done", f"{name} is built in: nothing to download."), gr.skip(), \
                gr.skip()
            return
        for html, paths in self._pull(lambda p, c: downloads.pull(pair, p, c), request):
            if paths is None:
                yield html, gr.skip(), gr.skip()
            else:
                yield html, self.refresh(), gr.Dropdown(choices=ready_pairs(), value=name)

    def search_hub(self, query: str) -> tuple:
        """Outputs: results, files, advice."""
        try:
            hits = discover.search(query or "")
        except EngineError as exc:
            return gr.skip(), gr.skip(), render.notice(str(exc))
        choices = [(f"{h.repo} — {h.downloads:,} downloads"
                    + (f", {h.parameters / 1e9:.1f}B" if h.parameters else "")
                    + (f", {h.architecture}" if h.architecture else ""), h.repo) for h in hits]
        note = "" if hits else render.notice(f"No GGUF repos match {query!r}.", "info")
        return (gr.Dropdown(choices=choices, value=None), gr.Dropdown(choices=[], value=None), note)

    def pick_repo(self, repo: str) -> tuple:
        """Outputs: files, repo, file, advice."""
        if not repo:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            files = discover.list_gguf(repo)
        except EngineError as exc:
            return gr.Dropdown(choices=[], value=None), repo, "", render.notice(str(exc))
        listed = hf_files.listed(files)  # (models first: the first is picked)
        choices = [(f"{c.quantization or '?'} — {render.size(c.size)} — {c.file}"
                    + (f" ({len(c.shards)} files)" if len(c.shards) > 1 else "") + (f" — {note}" if note else ""),
                    c.file) for c, note in listed]
        first = listed[0][0].file if listed else None
        note = "" if files else render.notice(f"{repo} has no GGUF model files.", "info")
        return gr.Dropdown(choices=choices, value=first), repo, first or "", note

    def suggest_drafts(self, repo: str, file: str) -> tuple:
        """Outputs: drafts, advice, hub target, role. Candidates by name (and, where none shares the target's tokens,
        the catalog's drafts of other families), each judged by llama.cpp's rule on the two files' headers (a few
        MB each), before anything is downloaded; and whether the target drafts for itself (MTP heads)."""
        repo, file = (repo or "").strip(), (file or "").strip()
        try:
            target = discover.choose(f"{repo}:{file}")
            info = discover.remote_info(target)
            found = discover.judged_drafts(target, info=info)
        except EngineError as exc:
            return gr.skip(), render.notice(str(exc)), gr.skip(), gr.skip()
        rows = [(a.mark, c.repo, discover.ref_tag(c), c.size, hit.downloads if hit else None, a.lines[-1])
                for hit, c, a in found]
        good = [(f"{c.repo} — {discover.ref_tag(c)}, {render.size(c.size)}"
                 + (" (drafts as text)" if a.as_text else ""), f"{c.repo}:{c.file}") for _, c, a in found if a.ok]
        return (gr.Dropdown(choices=good, value=None), render.hub_drafts(f"{repo}/{file}", rows, own_drafting(info)),
                (target.repo, target.file), "target")

    def pick_draft(self, ref: str) -> tuple:
        """Outputs: repo, file, role."""
        if not ref:
            return gr.skip(), gr.skip(), gr.skip()
        repo, _, file = ref.partition(":")
        return repo, file, "draft"

    def pull_file(self, repo: str, file: str, role: str, hub_target, request: gr.Request) -> Iterator[tuple]:
        """Outputs: progress, table, chat pair picker, target path, draft path, hub target."""
        repo, file = (repo or "").strip(), (file or "").strip()
        if not repo or not file.endswith(".gguf"):
            yield render.notice("Give a repo id (owner/name) and a .gguf file name."), *[gr.skip()] * 5
            return
        note = ""
        if role == "draft" and hub_target:  # pairing advice before the draft comes down
            try:
                advice = discover.advise(discover.choose(":".join(hub_target)), discover.choose(f"{repo}:{file}"))
            except EngineError as exc:
                yield render.notice(str(exc)), *[gr.skip()] * 5
                return
            if advice.as_text:
                note = f" It drafts for {hub_target[1]} as text: {advice.lines[-1]}"
        def work(progress, cancel):  # a target comes with its repo's vision projector, as llama.cpp's -hf
            proj = downloads.hf_projector(repo, file) if role == "target" else None
            files = [(repo, file)] + ([(proj.repo, proj.file)] if proj else [])
            return hub.pull_files(files, on_progress=progress, cancel=cancel)

        for html, paths in self._pull(work, request, note):
            if paths is None:
                yield html, *[gr.skip()] * 5
            else:
                path = str(paths[0])
                yield (html, gr.skip(), gr.Dropdown(choices=ready_pairs(), value=FILES),
                       path if role == "target" else gr.skip(), path if role == "draft" else gr.skip(),
                       (repo, file) if role == "target" else gr.skip())

    def _pull(self, work, request, note: str = "") -> Iterator[tuple[str, list | None]]:
        """Run a download on a worker thread, yielding (progress HTML, None) while it runs and (HTML, paths) at
        the end, ``note`` after the last words; an error or Stop ends with a message (the partial file is kept for
        a resume)."""
        cancel = self.cancels[self._tab_key(request)] = threading.Event()
        seen: dict[int, hub.Progress] = {}
        result: dict = {}

        def run():
            try:
                result["paths"] = work(lambda p: seen.__setitem__(p.index, p), cancel)
            except Exception as exc:  # shown in the UI; the app keeps running
                result["error"] = exc

        worker = threading.Thread(target=run, name="specchat-download", daemon=True)
        worker.start()
        yield render.download_progress([], "running", "Asking the Hub for the files…"), None
        while worker.is_alive():
            worker.join(POLL)
            yield render.download_progress(list(seen.values()), "running"), None
        files = list(seen.values())
        if "error" in result:
            exc = result["error"]
            state = "cancelled" if isinstance(exc, hub.DownloadCancelled) else "error"
            words = str(exc) if isinstance(exc, EngineError) else f"Download failed: {exc}"
            yield render.download_progress(files, state, words), None
            return
        paths = result["paths"]
        yield render.download_progress(files, "done", f"Downloaded and verified {len(paths)} file(s).{note}"), paths

    def stop_download(self, request: gr.Request) -> None:
        ev = self.cancels.get(self._tab_key(request))
        if ev:
            ev.set()

    def remove_pair(self, name: str) -> tuple:
        """Outputs: progress, table, chat pair picker."""
        if name and name == self._loaded_pair():
            return render.notice(f"{name} is loaded in the chat: load another pair first."), gr.skip(), gr.skip()
        try:
            freed, removed, kept = downloads.remove(get_pair(name or ""))
        except (EngineError, OSError) as exc:
            return render.notice(str(exc)), gr.skip(), gr.skip()
        msg = (f"Removed {len(removed)} file(s) of {name}, {freed / 1e9:.2f} GB freed."
               + "".join(f" Kept {k}: another downloaded pair uses it." for k in kept)) if removed or kept \
            else f"Nothing of {name} is downloaded."
        return render.notice(msg, "info"), self.refresh(), gr.Dropdown(choices=ready_pairs())

    def check_pair(self, target: str, draft: str, ctx) -> str:
        if not (target or "").strip():
            return render.notice("Give the path of a target GGUF file.")
        try:
            report = check_files((target or "").strip(), (draft or "").strip() or None, int(ctx or 0))
        except (EngineError, ValueError, TypeError, OSError) as exc:
            return render.notice(str(exc))
        return render.pair_report(describe(report), report.fit.ok)

    def use_in_chat(self, target: str, draft: str) -> tuple:
        """Outputs: chat pair picker, target path, draft path, report."""
        if not (target or "").strip():
            return gr.skip(), gr.skip(), gr.skip(), render.notice("Give the path of a target GGUF file.")
        return (gr.Dropdown(choices=ready_pairs(), value=FILES), target.strip(), (draft or "").strip(),
                render.notice("Files set in Settings → Models: press Load models there.", "info"))
