"""`specchat` with no subcommand: load a pair, serve the app on loopback, open the browser, stop on Ctrl-C."""
from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import webbrowser
from dataclasses import replace

# Before Gradio is imported: no analytics or version checks (nothing leaves the machine unasked).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from ..engine import EngineError  # noqa: E402
from ..models.loader import LoadSpec  # noqa: E402
from ..resources import resource  # noqa: E402
from ..chat.runtime import Runtime  # noqa: E402
from ..chat.settings import load_settings, save_settings  # noqa: E402

STARTER = LoadSpec(pair="starter")


def free_port(host: str, start: int = 7860, tries: int = 100) -> int:
    """Gradio's usual port, or the next free one."""
    for port in range(start, start + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    raise EngineError(f"No free port between {start} and {start + tries - 1}; choose one with --port.")


def startup_pair(requested: LoadSpec | None, last_used: LoadSpec | None, runtime: Runtime) -> list[str]:
    """Load what was asked for, else the last-used pair, else the starter; say what happened."""
    notes = []
    if requested is not None:
        runtime.load(requested)  # asked for explicitly: a failure is the user's to see, at once
        return notes
    for spec in dict.fromkeys(s for s in (last_used, STARTER) if s):
        try:
            runtime.load(spec)
            return notes
        except EngineError as exc:
            notes.append(f"Could not load {spec.describe()}: {exc}")
    notes.append("No pair is loaded: choose one under Settings → Models.")
    return notes


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(requested: LoadSpec | None, overrides: dict, port: int | None, listen: bool, open_browser: bool) -> int:
    runtime = Runtime()
    print("specchat: loading models…", flush=True)
    settings, warning = load_settings()
    notes = [warning] if warning else []
    notes += startup_pair(requested, settings.models, runtime)
    if runtime.spec and runtime.spec != settings.models:  # a pair not used last time brings its draft settings
        settings = settings.with_draft_params(runtime.resolved.draft_params)
    settings = replace(settings, **overrides, models=runtime.spec or settings.models)  # flags win
    save_settings(settings.for_pair(None, runtime.has_draft))

    from .app import SpecChatUI, css, theme  # Gradio is heavy: import it only when serving

    host = "0.0.0.0" if listen else "127.0.0.1"
    port = port or free_port(host)
    if listen:
        print("specchat: warning: --listen serves the app to your network, without a password.", file=sys.stderr)
    ui = SpecChatUI(runtime, notes)
    demo = ui.build()
    demo.queue(default_concurrency_limit=1)
    demo.launch(server_name=host, server_port=port, share=False, inbrowser=False, prevent_thread_lock=True,
                quiet=True, show_error=True, theme=theme(), css=css(), footer_links=["api", "settings"],
                favicon_path=str(resource("assets/logo.svg")))
    # Ctrl-C (even where a parent shell started us with SIGINT ignored), SIGTERM and SIGHUP (the terminal of a
    # desktop launcher closed) all shut down cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)
    url = f"http://127.0.0.1:{port}/"
    pair = runtime.spec.describe() if runtime.spec else "none loaded"
    print(f"SpecChat is running at {url}  (pair: {pair}; Ctrl-C to quit)", flush=True)
    for note in ui.notes:  # the pair's, the settings' and the conversations' notes
        print(f"specchat: note: {note}", file=sys.stderr)
    if open_browser:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("\nspecchat: shutting down…", file=sys.stderr)
    finally:
        # Saved files are written atomically, so a stuck shutdown loses nothing: if it takes over 15 s, print
        # where it is stuck and exit anyway (the timer stays armed through interpreter exit).
        faulthandler.dump_traceback_later(15, exit=True)
        for cancel in list(ui.cancels.values()):  # end answers in progress
            cancel.set()
        demo.close(verbose=False)
        ui.store.close()
        runtime.close()
    return 0


