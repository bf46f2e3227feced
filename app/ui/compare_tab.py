"""The Compare tab: a prompt run with speculation off, then on, the two answers side by side, a summary, the speedups
of the runs so far as a chart and a table (kept in the data dir: a reload or a restart shows them again), exported
as CSV and JSON. ``CompareTab`` is its components, made where the page is built (app.py); ``CompareRuns`` its
handlers, which the page wires."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

import gradio as gr

from ..chat.conversations import for_model
from ..json_files import load_json, save_json
from ..chat.runtime import Runtime
from ..engine import EngineError
from ..paths import data_dir
from . import attachments, compare_html, render

HISTORY = "comparisons.json"
KEPT = 200  # runs in the history: the newest


class CompareTab:
    """The tab's components, made where it is constructed (inside the Compare tab)."""

    def __init__(self):
        gr.Markdown("Runs **one after the other** — speculation off first, then on — so each gets the whole machine; "
                    "both start from an empty cache. The drafter, sampling and draft length are the Settings tab's.")
        with gr.Row():
            self.prompt = gr.MultimodalTextbox(
                label="Prompt", show_label=False, placeholder="A prompt to run with speculation off, then on… "
                "(Enter runs, Shift+Enter for a new line; paste or drop images)", lines=1, max_lines=8, scale=6,
                elem_id="cmp-prompt", file_types=["image"], file_count="multiple", sources=["upload"],
                submit_btn=False, max_plain_text_length=10**9)
            with gr.Column(scale=1, min_width=110):
                self.run = gr.Button("Compare", variant="primary", elem_id="cmp-run")
                self.stop = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
        with gr.Row():  # as tall as their text, up to 360 px (then they scroll): a short answer leaves no gap
            self.off = gr.Markdown(EMPTY_PANE["off"], elem_id="cmp-off", max_height=360, elem_classes=["cmp-pane"])
            self.on = gr.Markdown(EMPTY_PANE["on"], elem_id="cmp-on", max_height=360, elem_classes=["cmp-pane"])
        self.summary = gr.HTML(elem_id="cmp-summary")
        # The runs so far: shown once there is one (a page restored with runs shows them at load)
        with gr.Row():
            self.chart = gr.HTML(elem_id="cmp-chart")
            with gr.Column():
                self.export_csv = gr.DownloadButton("Export CSV", visible=False, size="sm")
                self.export_json = gr.DownloadButton("Export JSON", visible=False, size="sm")
        # The prompt wraps in a quarter of the width, so every column fits a laptop screen
        self.table = gr.Dataframe(headers=compare_html.COMPARE_COLUMNS, interactive=False, elem_id="cmp-table",
                                  wrap=True, column_widths=compare_html.COMPARE_WIDTHS, visible=False)


EMPTY_PANE = {"off": "**Speculation off**\n\n<small>The target alone, token by token: the answer to match.</small>",
              "on": "**Speculation on**\n\n<small>The same prompt drafted and verified: its answer, its speed, "
                    "where it differs.</small>"}


class CompareRuns:
    """The tab's handlers: a prompt run off then on over the ``runtime``, the runs so far exported. ``cancel_for``:
    a request's Stop event; ``images``: the attached images read (an EngineError where the model takes none);
    ``settings_of``: the settings panel's values as Settings; ``exports``: where the CSV and JSON go."""

    def __init__(self, runtime: Runtime, cancel_for: Callable, images: Callable, settings_of: Callable,
                 exports: Path):
        self.runtime, self.cancel_for, self.images, self.settings_of = runtime, cancel_for, images, settings_of
        self.exports = exports
        self.warning = ""  # a history file that could not be read (set aside) or written

    def _history(self) -> list[dict]:
        rows, warning = load_json(data_dir() / HISTORY, list)
        self.warning = warning or ""
        return [r for r in rows or [] if isinstance(r, dict) and isinstance(r.get("speedup"), (int, float))]

    def _shown(self, rows: list[dict]) -> list:
        """Rows state, table, chart, CSV and JSON buttons for the runs so far."""
        if not rows:
            return [rows, gr.skip(), "", gr.skip(), gr.skip()]
        csv_path, json_path = self._export(rows)
        return [rows, gr.Dataframe(compare_html.compare_table(rows), visible=True), compare_html.bar_chart(rows),
                gr.DownloadButton(value=str(csv_path), visible=True),
                gr.DownloadButton(value=str(json_path), visible=True)]

    def restore(self) -> list:
        """At page load: the runs of earlier sessions (outputs as ``_shown``)."""
        return self._shown(self._history())

    def run(self, request: gr.Request, box, rows: list, *values):
        """Outputs: off pane, on pane, summary, rows state, table, bar chart, CSV file, JSON file. The prompt's
        images go to both runs."""
        skip = [gr.skip()] * 5
        prompt, paths = attachments.box_parts(box)
        prompt = prompt.strip()
        if not prompt and not paths:
            yield gr.skip(), gr.skip(), render.notice("Type a prompt to compare."), *skip
            return
        cancel = self.cancel_for(request)
        try:
            settings = self.settings_of(values)
            turn = {"role": "user", "content": prompt, "images": self.images(paths)}
            messages = for_model([turn], settings.system_prompt)
            for cmp in self.runtime.compare(messages, settings, cancel):
                yield (compare_html.compare_pane(cmp, "off"), compare_html.compare_pane(cmp, "on"),
                       compare_html.compare_summary(cmp), *skip)
        except EngineError as exc:
            yield gr.skip(), gr.skip(), render.notice(str(exc)), *skip
            return
        if not cmp.finished:
            return
        rows = self._history()  # (the file's: another tab may have added runs since this one loaded)
        n = max([r["run"] for r in rows if isinstance(r.get("run"), int)], default=0) + 1
        rows = (rows + [compare_html.compare_row(cmp, n, self.runtime.info()["pair"] or "")])[-KEPT:]
        try:
            save_json(data_dir() / HISTORY, rows)
        except OSError as exc:
            self.warning = f"The comparison history could not be saved: {exc}"
        summary = compare_html.compare_summary(cmp) + render.notice(self.warning, "warning")
        yield (gr.skip(), gr.skip(), summary, *self._shown(rows))

    def _export(self, rows: list[dict]) -> tuple[Path, Path]:
        csv_path, json_path = self.exports / "specchat-comparisons.csv", self.exports / "specchat-comparisons.json"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        json_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
        return csv_path, json_path

    def wire(self, cmp: CompareTab, rows: gr.State, values: list, stop: Callable, slot: dict) -> None:
        """Compare (or Enter) runs the prompt off, then on; Stop (``stop``) ends it. ``rows``: the comparisons so
        far; ``slot``: the engine's concurrency slot, which every handler that touches the engine shares."""
        cmp.stop.click(stop, None, None, queue=False)
        for trigger, api in ((cmp.run.click, "public"), (cmp.prompt.submit, "undocumented")):
            trigger(self.run, [cmp.prompt, rows, *values],
                    [cmp.off, cmp.on, cmp.summary, rows, cmp.table, cmp.chart, cmp.export_csv, cmp.export_json],
                    api_name="compare" if api == "public" else None, api_visibility=api, **slot)
