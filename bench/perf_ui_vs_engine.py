"""Benchmark: does streaming through the app cost speed? Tokens/s of the same greedy chat answer, generated
(a) by the engine directly in this process and (b) through the running app's API (gradio_client), interleaved.

    python bench/perf_ui_vs_engine.py [--repeats 6] [--max-tokens 256] [--browser]

Prints, per run and overall, the engine's tokens/s, the app's (measured by the engine inside the server while
it streams to a viewer) and, with the API viewer, the rate at which tokens reached the client, and the ratios
app / engine. --browser views the stream in headless chromium instead, which renders every update on the same
cores, as a user's browser would.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def start_app(home: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "app", "--no-browser", "--port", str(port)], cwd=ROOT,
                            env=dict(os.environ, SPECCHAT_HOME=home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "running at" in line:
            return proc, f"http://127.0.0.1:{port}/"
    raise SystemExit("the app did not start")


class ApiViewer:
    """Streams the answer through the app's API (gradio_client), timing the updates as they arrive."""

    def __init__(self, url: str, values: list):
        from gradio_client import Client

        self.client, self.values = Client(url, verbose=False), values

    def run(self, expected_s: float) -> tuple[float, float, int]:
        self.client.predict(PROMPT, False, api_name="/submit")
        arrivals = []
        for out in self.client.submit(*self.values, api_name="/chat"):
            html = next((o for o in out if isinstance(o, str) and "spec-live" in o), "")  # the live panel
            m = re.search(r'data-tps="([\d.]+)" data-tokens="(\d+)"', html)
            if m:
                arrivals.append((time.perf_counter(), int(m.group(2)), float(m.group(1))))
        (t0, n0, _), (t1, n1, app) = arrivals[0], arrivals[-1]
        self.client.predict(api_name="/new_chat")
        return app, (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0, n1

    def close(self) -> None:
        pass


class BrowserViewer:
    """Sends the prompt in headless chromium, which renders every update (markdown, live panel, chart).

    Playwright attaches over the DevTools protocol only to click Send and to read the result: while the answer
    streams the browser runs unobserved, as a user's would (attached, the instrumentation costs a few percent
    more)."""

    def __init__(self, url: str):
        from playwright.sync_api import sync_playwright

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self._port = s.getsockname()[1]
        self._profile = tempfile.mkdtemp(prefix="specchat-perf-chromium-")
        self._chromium = subprocess.Popen(
            ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--window-size=1400,950", f"--user-data-dir={self._profile}",
             f"--remote-debugging-port={self._port}", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._pw = sync_playwright().start()
        with self._attached() as page:
            page.locator("#msg textarea").wait_for(state="visible", timeout=60_000)

    @contextlib.contextmanager
    def _attached(self):
        for attempt in range(100):  # chromium takes a moment to open its DevTools port
            try:
                browser = self._pw.chromium.connect_over_cdp(f"http://127.0.0.1:{self._port}")
                break
            except Exception:
                if attempt == 99:
                    raise
                time.sleep(0.1)
        try:
            yield browser.contexts[0].pages[0]
        finally:
            browser.close()  # disconnects; the browser and its page keep running

    def run(self, expected_s: float) -> tuple[float, None, int]:
        with self._attached() as page:
            page.locator("#new-chat").click()
            page.wait_for_function("document.querySelector('#live-stats .spec-live').dataset.state == 'idle'")
            page.locator("#msg textarea").fill(PROMPT)
            page.locator("#send").click()
        time.sleep(expected_s)  # unobserved while it streams
        with self._attached() as page:
            page.wait_for_function("document.querySelector('#live-stats .spec-live').dataset.state == 'done'",
                                   polling=200, timeout=300_000)
            el = page.locator("#live-stats .spec-live")
            return float(el.get_attribute("data-tps")), None, int(el.get_attribute("data-tokens"))

    def close(self) -> None:
        self._pw.stop()
        self._chromium.terminate()
        self._chromium.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--browser", action="store_true",
                    help="view the stream in headless chromium (Debian's /usr/bin/chromium) instead of the API")
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="specchat-perf-")
    os.environ["SPECCHAT_HOME"] = home

    from app.models.catalog import get_pair
    from app.models.loader import LoadSpec
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings, save_settings
    from app.ui.app import SETTING_NAMES

    settings = Settings(max_tokens=args.max_tokens, models=LoadSpec(pair="starter"))
    settings = settings.with_draft_params(get_pair("starter").draft_params)
    save_settings(settings)  # what the app (and so the browser's settings panel) starts with
    messages = [{"role": "user", "content": PROMPT}]

    proc, url = start_app(home)
    runtime = Runtime()
    runtime.load(LoadSpec(pair="starter"))
    engine_tps, app_tps, client_tps = [], [], []
    viewer = BrowserViewer(url) if args.browser else ApiViewer(url, [getattr(settings, n) for n in SETTING_NAMES])
    try:
        for i in range(args.repeats + 1):  # the first round warms both up and is not counted
            live = None
            for live in runtime.answer(messages, settings):
                pass
            e = live.stats.tokens_per_second
            # the browser viewer looks again once the answer should be done (the engine's time, plus slack)
            a, c, n = viewer.run(1.5 * live.stats.n_tokens / e + 1.0)
            tag = "warm-up" if i == 0 else f"run {i}"
            received = f"   client receives {c:6.1f} tok/s ({c / e:.3f})" if c is not None else ""
            print(f"{tag:8s} engine {e:6.1f} tok/s   app {a:6.1f} tok/s ({a / e:.3f}){received}   {n} tokens",
                  flush=True)
            if i:
                engine_tps.append(e), app_tps.append(a), client_tps.append(c)
    finally:
        viewer.close()
        runtime.close()
        proc.terminate()
    e, a = statistics.mean(engine_tps), statistics.mean(app_tps)
    per_run = statistics.median(x / y for x, y in zip(app_tps, engine_tps))
    received = ""
    if client_tps[0] is not None:
        c = statistics.mean(client_tps)
        received = f", client {c:.1f} tok/s; client/engine = {c / e:.3f}"
    print(f"overall ({'browser' if args.browser else 'API'} viewer)  engine {e:.1f} tok/s, app {a:.1f} tok/s; "
          f"app/engine = {a / e:.3f} (median of per-run ratios {per_run:.3f}){received}")


if __name__ == "__main__":
    main()
