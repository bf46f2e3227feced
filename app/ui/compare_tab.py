"""The Compare tab's layout: a prompt run with speculation off, then on, the two answers side by side, a summary,
the speedups of the runs so far as a chart and a table, exported as CSV and JSON. Components only: SpecChatUI
(app.py) holds the handlers and wires the events."""
from __future__ import annotations

import gradio as gr

from . import render


class CompareTab:
    """The tab's components, made where it is constructed (inside the Compare tab)."""

    def __init__(self):
        gr.Markdown("Runs **one after the other** — speculation off first, then on — so each gets the whole machine; "
                    "both start from an empty cache. Uses the settings from the Chat tab.")
        with gr.Row():
            self.prompt = gr.MultimodalTextbox(label="Prompt (Enter runs, Shift+Enter for a new line; images: attach, "
                                               "paste or drop)", lines=1, max_lines=8, scale=6, elem_id="cmp-prompt",
                                               file_types=["image"], file_count="multiple", sources=["upload"],
                                               submit_btn=False, max_plain_text_length=10**9)
            with gr.Column(scale=1, min_width=110):
                self.run = gr.Button("Compare", variant="primary", elem_id="cmp-run")
                self.stop = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
        with gr.Row():
            self.off = gr.Markdown("**Speculation off**", elem_id="cmp-off", height=360, elem_classes=["cmp-pane"])
            self.on = gr.Markdown("**Speculation on**", elem_id="cmp-on", height=360, elem_classes=["cmp-pane"])
        self.summary = gr.HTML(elem_id="cmp-summary")
        with gr.Row():
            self.chart = gr.HTML(elem_id="cmp-chart")
            with gr.Column():
                self.export_csv = gr.DownloadButton("Export CSV", interactive=False, size="sm")
                self.export_json = gr.DownloadButton("Export JSON", interactive=False, size="sm")
        self.table = gr.Dataframe(headers=render.COMPARE_COLUMNS, interactive=False, elem_id="cmp-table")
