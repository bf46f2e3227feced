"""`specchat` (the app) and `specchat serve` (the API alone): load a pair, serve on loopback — the UI at ``/`` and the
OpenAI-compatible API at ``/v1`` on one port — open the browser, stop on Ctrl-C."""
from __future__ import annotations

import faulthandler
import os
import secrets
import signal
import socket
import sys
import threading
import time
import webbrowser
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

# Before Gradio is imported: no analytics or version checks (nothing leaves the machine unasked).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from ..chat.runtime import Runtime  # noqa: E402
from ..chat.settings import Settings, load_settings, save_settings, saved_at  # noqa: E402
from ..chat.worker import load_crashes  # noqa: E402
from ..engine import EngineError  # noqa: E402
from ..models.hardware import unused_gpu_advice  # noqa: E402
from ..models.loader import LoadSpec  # noqa: E402
from ..paths import clear_stale_temp_folders, remove_temp_folders, temp_folder  # noqa: E402
from ..resources import resource  # noqa: E402

if TYPE_CHECKING:  # imported where they are used: FastAPI, Gradio and uvicorn are heavy
    import uvicorn

    from ..server.app import ApiServer
    from ..server.guard import Access
    from ..ui.app import SpecChatUI

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


def startup_pair(requested: LoadSpec | None, last_used: LoadSpec | None, runtime: Runtime,
                 server_key: str | None = None) -> list[str]:
    """Load what was asked for, else the last-used pair, else the starter; say what happened."""
    notes = []
    if requested is not None:
        runtime.load(requested, api_key=server_key)  # asked for explicitly: a failure is the user's to see, at once
        return notes
    for spec in dict.fromkeys(s for s in (last_used, STARTER) if s):
        if runtime.worker and (refused := load_crashes.refusal(spec)):
            notes.append(refused)
            continue
        try:
            runtime.load(spec)
            return notes
        except EngineError as exc:
            notes.append(f"Could not load {spec.describe()}: {exc}")
    notes.append("No pair is loaded: choose one under Settings → Models.")
    return notes


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(requested: LoadSpec | None, overrides: dict, port: int | None, listen: bool, open_browser: bool,
          api_key: str | None = None, cors: list[str] | None = None, with_ui: bool = True,
          server_key: str | None = None, allow_hosts: list[str] | None = None, no_auth: bool = False,
          max_body: int | None = None, metrics: bool = False, aliases: tuple[str, ...] = (),
          chat_template: str | None = None, tags: tuple[str, ...] = (), verbose: bool = False,
          slots: bool = True) -> int:
    """``api_key`` guards this app's own /v1 (and, with ``listen``, everything: one is made up when none is given,
    unless ``no_auth``); ``server_key`` is the key for a requested server (saved once it is accepted); ``max_body``:
    the largest /v1 request body in bytes (None: sized to the loaded context); ``metrics``: serve llama-server's
    Prometheus ``/metrics``; ``aliases``: the names the loaded pair is listed by (--alias); ``chat_template``: a
    Jinja template the target's prompts are rendered with instead of its own (--chat-template); ``tags``: shown in
    /v1/models (--tags); ``verbose``: answers carry llama-server's ``__verbose`` object (--verbose); ``slots``: serve
    llama-server's /slots (--no-slots: 501)."""
    from ..server.apis.llama_server import LlamaAliases
    from ..server.guard import Access, Guard

    clear_stale_temp_folders()  # exports a crashed SpecChat left behind
    runtime = Runtime(worker=True)  # the pair in a process of its own: a crash in llama.cpp is not the app's
    settings, notes = start_runtime(runtime, requested, overrides, with_ui, server_key)
    if chat_template is not None and runtime.engine is not None:
        runtime.engine.model.template_override = chat_template
    host = "0.0.0.0" if listen else "127.0.0.1"
    port = port or free_port(host)
    api_key, made_up_key = _session_key(listen, api_key, no_auth)
    access = Access.serving(port, listen, api_key, allow_hosts or (), cors or ())
    root, api, ui = _web_app(runtime, settings, notes, with_ui, host, port, api_key, cors, max_body,
                             dict(metrics=metrics, aliases=aliases, tags=tags, verbose=verbose, slots=slots))
    server, thread = _start_http(LlamaAliases(Guard(root, access)), host, port)
    _shut_down_on_signals()
    try:  # from the moment it says it is running, Ctrl-C is a clean shutdown
        _announce(runtime, port, with_ui, listen, access, api_key, made_up_key)
        for note in (ui.notes if ui else notes):  # the pair's, the settings' and the conversations' notes
            print(f"specchat: note: {note}", file=sys.stderr)
        if open_browser and with_ui:
            # this machine's own browser signs in at once
            first = access.login_url() if listen and api_key else f"http://127.0.0.1:{port}/"
            threading.Thread(target=webbrowser.open, args=(first,), daemon=True).start()
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        print("\nspecchat: shutting down…", file=sys.stderr)
    finally:
        _shut_down(server, thread, api, ui, runtime)
    return 0


def start_runtime(runtime: Runtime, requested: LoadSpec | None, overrides: dict, with_ui: bool,
                  server_key: str | None) -> tuple[Settings, list[str]]:
    """Load the pair (or connect to the server) to serve; the settings requests start from (``overrides``: the
    command's flags, which win) and notes for the person."""
    print("specchat: loading models…", flush=True)
    settings, warning = load_settings()
    notes = [n for n in (warning, unused_gpu_advice()) if n]
    if with_ui:
        notes += startup_pair(requested, settings.models, runtime, server_key)
    else:  # the API alone serves what was asked for, else the last-used pair: nothing to choose from without a UI
        runtime.load(requested or settings.models or STARTER, api_key=server_key)
    if runtime.spec != settings.models:  # a pair not used last time brings its draft settings and measured drafter
        settings = settings.for_pair(runtime.recommended, runtime.drafters, runtime.preferred)
    elif runtime.preferred and runtime.ranking.at > saved_at():  # measured since the settings were saved
        settings = replace(settings, drafter=runtime.preferred)
    settings = replace(settings, **overrides).loaded(runtime.spec)  # flags win
    if with_ui:
        save_settings(settings.for_pair(None, runtime.drafters))
    return settings, notes


def request_defaults(args) -> dict:
    """llama-server's flags for what a request leaves out, as Settings fields (only those given)."""
    from ..server.requests.openai import NO_LIMIT

    given = dict(temperature=args.temperature, seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                 max_tokens=NO_LIMIT if args.max_tokens == -1 else args.max_tokens,
                 enable_thinking={"on": True, "off": False}.get(args.reasoning))
    if args.reasoning_format in ("deepseek", "deepseek-legacy"):
        raise EngineError(f"--reasoning-format {args.reasoning_format} is not supported: SpecChat leaves the "
                          "thinking in the answer's content (as --reasoning-format none).")
    return {k: v for k, v in given.items() if v is not None}


def aliases_flag(values: list[str]) -> tuple[str, ...]:
    """--alias or --tags NAMES (comma-separated, repeatable): each once, sorted as llama-server keeps them (a
    std::set: the first alias names the model)."""
    return tuple(sorted({n.strip() for v in values for n in v.split(",")} - {""}))


def chat_template_flag(text: str | None, path: Path | None) -> str | None:
    """--chat-template TEXT or --chat-template-file FILE: a Jinja template, or (TEXT) the name of one of llama.cpp's
    own formats (``llama3``, ``chatml``...), rendered by llama.cpp as llama-server renders it."""
    from ..engine.llama import builtin_template_names

    if text is not None and path is not None:
        raise EngineError("Give --chat-template or --chat-template-file, not both.")
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EngineError(f"Cannot read --chat-template-file {path}: {exc}") from None
    if text is not None and "{%" not in text and "{{" not in text and text not in builtin_template_names():
        raise EngineError(f"--chat-template {text[:40]!r} is neither a Jinja template nor one of llama.cpp's "
                          f"formats ({', '.join(sorted(builtin_template_names()))}): give the template's text (or "
                          "--chat-template-file) or one of those names.")
    return text


def _session_key(listen: bool, api_key: str | None, no_auth: bool) -> tuple[str | None, bool]:
    """The key that guards the app, and whether it was made up here: serving the network, one is needed."""
    made_up_key = listen and not api_key and not no_auth
    if made_up_key:  # as Jupyter does: a random key, printed with the URL that signs in
        api_key = secrets.token_urlsafe(24)
    if listen and not api_key:
        print("specchat: warning: --listen --no-auth serves to your whole network and nobody needs a key: anyone who "
              "can reach this machine can read your conversations and use the models. Leave out --no-auth to "
              "require a key.", file=sys.stderr)
    return api_key, made_up_key


def _web_app(runtime: Runtime, settings: Settings, notes: list[str], with_ui: bool, host: str, port: int,
             api_key: str | None, cors: list[str] | None, max_body: int | None = None,
             api_options: dict | None = None) -> tuple[object, ApiServer, SpecChatUI | None]:
    """The ASGI app: the API at /v1 and, ``with_ui``, the Gradio UI at /. Returns it, the API and the UI (or None).
    ``api_options``: ApiServer's (metrics, aliases, tags)."""
    from fastapi import FastAPI

    from ..server.app import ApiServer

    # What a request leaves out: the app's settings as last saved by the UI, or this command's.
    defaults = (lambda: load_settings()[0]) if with_ui else (lambda: settings)
    api = ApiServer(runtime, defaults, max_body=max_body, **(api_options or {}))
    root = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    root.mount("/v1", api.app(cors))
    if not with_ui:
        return root, api, None
    # Gradio copies files it serves (exports) into its cache: keep that owner-only too, not in a shared /tmp, and
    # removed at exit.
    if "GRADIO_TEMP_DIR" not in os.environ:
        os.environ["GRADIO_TEMP_DIR"] = str(temp_folder("gradio"))
    import gradio as gr

    from ..ui.app import PAGE_JS, SpecChatUI, css, theme  # Gradio is heavy: import it only when serving the UI

    ui = SpecChatUI(runtime, notes, api_info=lambda: {"base_url": f"http://127.0.0.1:{port}/v1",
                                                       "key": bool(api_key), "served": list(api.served)})
    demo = ui.build()
    demo.queue(default_concurrency_limit=1)
    root = gr.mount_gradio_app(root, demo, path="/", server_name=host, server_port=port, show_error=True,
                               theme=theme(), css=css(), js=PAGE_JS,
                               footer_links=[],  # no Gradio footer: the API tab is ours
                               favicon_path=str(resource("assets/logo.svg")))
    return root, api, ui


def _start_http(app, host: str, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """uvicorn serving ``app`` on a thread, once it listens. Returns the server and its thread."""
    import uvicorn

    from ..server.connections import server_config

    # Slow and idle connections are timed out, and how many are open is bounded (app/server/connections.py).
    server = uvicorn.Server(server_config(app, host, port))
    server.install_signal_handlers = lambda: None  # ours below; uvicorn's would swallow Ctrl-C
    thread = threading.Thread(target=server.run, daemon=True, name="specchat-http")
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.05)
    if not server.started:
        raise EngineError(f"Could not serve on {host}:{port} (is the port in use?); choose another with --port.")
    return server, thread


def _shut_down_on_signals() -> None:
    """Ctrl-C (even where a parent shell started us with SIGINT ignored), SIGTERM and SIGHUP (the terminal of a
    desktop launcher closed) all shut down cleanly."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)


def _announce(runtime: Runtime, port: int, with_ui: bool, listen: bool, access: Access, api_key: str | None,
              made_up_key: bool) -> None:
    """Where it runs, and, serving the network, the key made up for the session and the LAN address."""
    from ..server.guard import lan_address

    url = f"http://127.0.0.1:{port}/"
    pair = runtime.spec.describe() if runtime.spec else "none loaded"
    what = "SpecChat is running at" if with_ui else "SpecChat's API is running at"
    print(f"{what} {url}{'' if with_ui else 'v1'}  (pair: {pair}; API at {url}v1; Ctrl-C to quit)", flush=True)
    if listen:
        lan = lan_address(access.names)
        if made_up_key:
            where = [access.login_url(h) for h in ([lan] if lan else []) + ["127.0.0.1"]] if with_ui else []
            print(f"specchat: the key for this session is {api_key}" + (
                " — open " + " or ".join(where) + " to sign in" if where else
                " (send it as 'Authorization: Bearer KEY')"), flush=True)
        if lan:
            print(f"specchat: on your network: http://{lan}:{port}/", flush=True)


def _shut_down(server: uvicorn.Server, thread: threading.Thread, api: ApiServer, ui: SpecChatUI | None,
               runtime: Runtime) -> None:
    """End answers and API requests in progress, stop serving, close the conversations and the backend."""
    # Saved files are written atomically, so a stuck shutdown loses nothing: if it takes over 15 s, print
    # where it is stuck and exit anyway (the timer stays armed through interpreter exit).
    faulthandler.dump_traceback_later(15, exit=True)
    if ui:
        for cancel in list(ui.cancels.values()):  # end answers in progress
            cancel.set()
    api.cancel_all()  # and API requests, queued ones included: none of them waits for its turn now
    server.should_exit = True
    thread.join(10)
    if ui:
        ui.store.close()
    runtime.close()
    remove_temp_folders()  # exports and Gradio's copies of them
