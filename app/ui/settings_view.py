"""The Settings tab's handlers: the panel's values read into Settings (``collect``), each change saved as it is made,
the Drafter list for the loaded pair, and Load models. Its components are settings_panel.py's; SpecChatUI (app.py)
makes this view and wires it."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Callable

import gradio as gr

from ..chat.runtime import Runtime
from ..chat.settings import LOAD_SPECS, Settings, load_settings, usable_drafter
from ..engine import EngineError
from ..models.loader import LoadSpec
from . import render
from .models_tab import FILES, SERVER
from .settings_panel import SettingsPanel, drafter_choices, server_fields, server_spec, test_server, unusable_note

# Settings the panel does not show: kept as start-up flags or settings.json set them (the n-gram kinds' settings)
NOT_IN_PANEL = tuple(f.name for f in fields(Settings) if not f.metadata.get("panel", True))
# Settings edited in the panel, in the order the handlers receive them.
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


class SettingsView:
    """``save(settings)``: keep them for the next start; ``header``, ``hardware``, ``image_note``: the page's parts
    a load changes, drawn afresh."""

    def __init__(self, runtime: Runtime, save: Callable[[Settings], None], header: Callable[[], str],
                 hardware: Callable[[], str], image_note: Callable[[], str]):
        self.runtime, self.save = runtime, save
        self.header, self.hardware, self.image_note = header, hardware, image_note

    def drafter_note(self) -> str | None:
        """Why the loaded pair drafts as it does, where `specchat check --measure` measured its methods here, and
        which methods it cannot use."""
        ranking = self.runtime.ranking
        return " ".join(n for n in (ranking.why() if ranking else "", unusable_note(self.runtime.drafters)) if n) \
            or None

    def drafter_choice(self, drafter: str):
        """The Drafter list for the loaded pair, ``drafter`` chosen where the pair can use it."""
        usable = self.runtime.drafters
        drafter = usable_drafter(drafter, usable)
        return gr.update(choices=drafter_choices(drafter, usable), value=drafter, info=self.drafter_note())

    def panel(self, s: Settings) -> SettingsPanel:
        """The tab's components (made inside the Settings tab)."""
        return SettingsPanel(s, self.drafter_note(), self.runtime.drafters)

    def save_panel(self, *values) -> None:
        """A setting changed in the Settings tab: saved at once, so a reload or a restart keeps it. One the engine
        would refuse is not saved; sending a message says what is wrong with it."""
        try:
            settings = collect(values)
            settings.generation()
        except EngineError:
            return
        self.save(settings)

    def load_models(self, progress: gr.Progress = gr.Progress(), *args):
        """Inputs: pair, target, draft, ctx, ngl, ngld, the server's URL, key, model, speculation-off URL and
        method label, then the settings. Outputs: the Settings tab's notice, the chat's (a good load clears an
        earlier error there), header, hardware, drafter, draft max, draft min, draft p-min, adaptive, key box, the
        words on images."""
        pair, target, draft, ctx, ngl, ngld, url, key, model, url_off, method, *values = args
        keep = [gr.skip()] * 6
        try:
            key = (key or "").strip() or None
            if pair == SERVER:
                spec = server_spec(url, model, url_off, method)
            else:
                numbers = [int(x) if x is not None else None for x in (ctx, ngl, ngld)]  # (None: what fits)
                ctx, ngl, ngld = numbers[0] or 0, numbers[1], numbers[2]
                spec = LoadSpec(pair=pair, ctx=ctx, ngl=ngl, ngld=ngld) if pair != FILES else \
                    LoadSpec(target=(target or "").strip() or None, draft=(draft or "").strip() or None,
                             ctx=ctx, ngl=ngl, ngld=ngld)
                if min(n for n in (ngl, ngld, 0) if n is not None) < -1 or ctx < 0:
                    raise EngineError("Context size must be 0 (default) or more; GPU layers empty (what fits), "
                                      "-1 (all), 0 or more.")
            self.runtime.load(spec, lambda f, msg: progress(f, desc=msg), api_key=key if spec.server else None)
        except (EngineError, ValueError, TypeError) as exc:
            return render.notice(str(exc)), gr.skip(), self.header(), self.hardware(), *keep, self.image_note()
        # A new pair brings its recommended draft settings, and the drafter it can use.
        settings = collect(values).for_pair(self.runtime.recommended, self.runtime.drafters, self.runtime.preferred)
        self.save(settings)
        info = self.runtime.info()
        if server := info["server"]:
            msg = (f"Connected to {server['engine']} at {server['url']}: model {server['model']}, speculation "
                   f"{server['method']}" + (f"; speculation off from {server['off']}" if server["off"] else ""))
        else:
            msg = f"Loaded {info['pair']}: {info['target']}" + (f" + draft {info['draft']}" if info["draft"] else "")
        return (render.notice(msg, "info"), "", self.header(), self.hardware(),
                self.drafter_choice(settings.drafter),
                settings.draft_max, settings.draft_min, settings.draft_p_min, settings.adaptive,
                server_fields(self.runtime.spec or LoadSpec())[1], self.image_note())

    def forget_answers(self) -> str:
        try:
            self.runtime.forget_answers()
        except EngineError as exc:
            return render.notice(str(exc))
        return render.notice("Forgot the earlier answers: Earlier answers drafts from the conversation in front of "
                             "it until new answers are written.", "info")

    def wire(self, panel: SettingsPanel, values: list, to_load: list, chat_notice, header, hw, image_note,
             slot: dict) -> None:
        """Each setting saved as it changes; Load models; Test connection (or Enter in the URL). ``values``: the
        settings' components in SETTING_NAMES' order; ``to_load``: what load_models reads before them; ``slot``: the
        engine's concurrency slot."""
        for field in values:
            field.input(self.save_panel, values, None, queue=False, trigger_mode="always_last",
                        show_progress="hidden", api_visibility="private")
        panel.load.click(self.load_models, [*to_load, *values],
                         [panel.notice, chat_notice, header, hw, panel.drafter, panel.draft_max, panel.draft_min,
                          panel.draft_p_min, panel.adaptive, panel.s_key, image_note], **slot)
        panel.forget.click(self.forget_answers, None, panel.notice, queue=False, api_visibility="private")
        for trigger in (panel.s_test.click, panel.s_url.submit):
            trigger(test_server, [panel.s_url, panel.s_key, panel.s_model], [panel.pair, panel.s_model, panel.notice])
