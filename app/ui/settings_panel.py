"""The Settings tab: speculation, sampling, the models (a pair, files or a server) and the Load button, side by
side, and what the server box's fields mean (``server_fields``, ``server_spec``, ``test_server``). SpecChatUI
(app.py) makes them inside the Settings tab; settings_view.py reads them into Settings and wires their events."""
from __future__ import annotations

import gradio as gr

from ..chat.remote_server import RemoteServer, ServerSpec, base_url
from ..chat.server_keys import key_for
from ..chat.settings import Settings, usable_drafter
from ..engine import METHODS, EngineError, method_name
from ..engine.drafters import registry
from ..models.loader import LoadSpec
from . import render
from .models_tab import SERVER, ready_pairs


def drafter_choices(drafter: str, usable: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The Drafter choices: the methods the loaded pair can use (``usable``; every method before a pair is loaded),
    and the drafter chosen where it is none of them (an n-gram kind or a chain, from serve --spec-type or what check
    --measure found fastest). A method the pair cannot use is not offered: unusable_note says why."""
    choices = [(m.choice, m.name) for m in METHODS if not usable or m.name in usable]
    if drafter not in dict(choices).values() and (not usable or registry.runs_on(drafter, usable)):
        choices.append((method_name(drafter), drafter))
    return choices


def unusable_note(usable: tuple[str, ...]) -> str:
    """The methods the loaded pair cannot use, each with what it would need: why the Drafter list leaves them out."""
    missing = [m for m in METHODS if usable and m.name not in usable]
    return ("Not for this pair: " + "; ".join(f"{m.choice} (needs {m.needs})" for m in missing) + ".") \
        if missing else ""


class SettingsPanel:
    """The tab's components, made where it is constructed (inside the Settings tab), in three columns."""

    def __init__(self, s: Settings, drafter_note: str | None, usable: tuple[str, ...]):
        with gr.Row(equal_height=False, elem_id="settings"):
            with gr.Column(min_width=280):
                self._speculation(s, drafter_note, usable)
            with gr.Column(min_width=280):
                self._sampling(s)
            with gr.Column(min_width=280):
                self._models()

    def _speculation(self, s: Settings, drafter_note: str | None, usable: tuple[str, ...]) -> None:
        gr.Markdown("### Speculation")
        drafter = usable_drafter(s.drafter, usable)
        self.drafter = gr.Radio(drafter_choices(drafter, usable), value=drafter, label="Drafter", elem_id="drafter",
                                info=drafter_note)
        self.draft_max = gr.Slider(0, 64, s.draft_max, step=1, label="Draft max", elem_id="draft-max")
        self.draft_min = gr.Slider(0, 64, s.draft_min, step=1, label="Draft min", elem_id="draft-min")
        self.draft_p_min = gr.Slider(0, 1, s.draft_p_min, step=0.01, label="Draft p-min")
        self.adaptive = gr.Checkbox(s.adaptive, label="Adaptive draft length (learns when drafting pays)")
        self.enable_thinking = gr.Checkbox(s.enable_thinking, label="Let reasoning models think (Qwen3's "
                                           "enable_thinking)", elem_id="enable-thinking")
        # What "Earlier answers" drafts from: every answer since the pair was loaded (the API's per key)
        self.forget = gr.Button("Forget earlier answers", size="sm", elem_id="forget-answers")

    def _sampling(self, s: Settings) -> None:
        gr.Markdown("### Sampling")
        self.temperature = gr.Slider(0, 2, s.temperature, step=0.05, label="Temperature (0 = greedy)",
                                     elem_id="temperature")
        self.top_p = gr.Slider(0.01, 1, s.top_p, step=0.01, label="Top-p")
        self.top_k = gr.Number(s.top_k, label="Top-k (0 = off)", precision=0, elem_id="top-k")
        self.min_p = gr.Slider(0, 0.99, s.min_p, step=0.01, label="Min-p")
        self.seed = gr.Number(s.seed, label="Seed (-1 = a new one each answer)", precision=0,
                              elem_id="seed")
        self.max_tokens = gr.Number(s.max_tokens, label="Max tokens", precision=0, elem_id="max-tokens")

    def _models(self) -> None:
        gr.Markdown("### Models")
        self.pair = gr.Dropdown(ready_pairs(), value="starter", label="Pair", elem_id="pair")
        self.target = gr.Textbox(label="Target GGUF (with the files option)", elem_id="target-path")
        self.draft = gr.Textbox(label="Draft GGUF (optional)", elem_id="draft-path")
        self.ctx = gr.Number(0, label="Context size, tokens (0: the model's own, capped at 4096)", precision=0)
        self.ngl = gr.Number(None, label="GPU layers, target (-ngl; empty: what fits in the GPU, -1: all, 0: none)",
                             precision=0, elem_id="ngl")
        self.ngld = gr.Number(None, label="GPU layers, draft (-ngld; empty: what fits)", precision=0, elem_id="ngld")
        with gr.Accordion("Server (llama-server, vLLM, SGLang, TGI, specchat serve)", open=False,
                          elem_id="server-box"):
            self.s_url = gr.Textbox(label="Server URL", placeholder="http://127.0.0.1:8080", elem_id="server-url")
            self.s_key = gr.Textbox(label="API key (optional; saved for this server, readable only by you)",
                                    type="password", elem_id="server-key")
            self.s_model = gr.Dropdown([], label="Model", allow_custom_value=True, elem_id="server-model")
            self.s_off = gr.Textbox(label="Speculation-off server (optional: the same model without a draft, "
                                    "for Compare where a server cannot turn speculation off per request)",
                                    elem_id="server-off")
            self.s_method = gr.Textbox(label="Method label (optional, e.g. EAGLE-3 or draft 0.5B)",
                                       elem_id="server-method")
            self.s_test = gr.Button("Test connection", size="sm", elem_id="server-test")
        self.load = gr.Button("Load models", variant="primary", elem_id="load")
        self.notice = gr.HTML(elem_id="settings-notice")  # what a load or a connection test came to


def server_fields(spec: LoadSpec) -> list:
    """URL, key box, model, speculation-off URL, method label. The key itself never goes back to the page: the
    box only says that one is saved."""
    saved = "a key is saved for this server (type to replace it)" if key_for(spec.server) else "none"
    return [spec.server or "", gr.Textbox(value="", placeholder=saved),
            gr.Dropdown(choices=[spec.model] if spec.model else [], value=spec.model),
            spec.server_off or "", spec.method or ""]


def server_spec(url, model, url_off, method) -> LoadSpec:
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

def test_server(url, key, model):
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
