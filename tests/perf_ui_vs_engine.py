"""Benchmark: does streaming through the app cost speed? Tokens/s of the same greedy chat answer, generated
(a) by the engine directly in this process and (b) through the running app's API (gradio_client), interleaved.

    python tests/perf_ui_vs_engine.py [--repeats 6] [--max-tokens 256]

Prints, per run and overall, the engine's tokens/s, the app's (measured by the engine inside the server while
it streams to a client) and the rate at which tokens reached the client, and the ratios app / engine.
"""
from __future__ import annotations

import argparse
import os
import re
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="specchat-perf-")
    os.environ["SPECCHAT_HOME"] = home
    from gradio_client import Client

    from app.catalog import get_pair
    from app.loader import LoadSpec
    from app.runtime import Runtime
    from app.settings import Settings
    from app.ui.app import SETTING_NAMES

    settings = Settings(max_tokens=args.max_tokens).with_draft_params(get_pair("starter").draft_params)
    values = [getattr(settings, n) for n in SETTING_NAMES]
    messages = [{"role": "user", "content": PROMPT}]

    proc, url = start_app(home)
    runtime = Runtime()
    runtime.load(LoadSpec(pair="starter"))
    engine_tps, app_tps, client_tps = [], [], []
    try:
        client = Client(url, verbose=False)
        for i in range(args.repeats + 1):  # the first round warms both up and is not counted
            live = None
            for live in runtime.answer(messages, settings):
                pass
            e = live.stats.tokens_per_second

            client.predict(PROMPT, False, api_name="/submit")
            job = client.submit(*values, api_name="/chat")
            arrivals = []
            for out in job:
                html = next((o for o in out if isinstance(o, str) and "spec-live" in o), "")  # the live panel
                m = re.search(r'data-tps="([\d.]+)" data-tokens="(\d+)"', html)
                if m:
                    arrivals.append((time.perf_counter(), int(m.group(2)), float(m.group(1))))
            (t0, n0, _), (t1, n1, a) = arrivals[0], arrivals[-1]
            c = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
            tag = "warm-up" if i == 0 else f"run {i}"
            print(f"{tag:8s} engine {e:6.1f} tok/s   app {a:6.1f} tok/s ({a / e:.3f})   "
                  f"client receives {c:6.1f} tok/s ({c / e:.3f})   {n1} tokens", flush=True)
            if i:
                engine_tps.append(e), app_tps.append(a), client_tps.append(c)
            client.predict(api_name="/clear")
    finally:
        runtime.close()
        proc.terminate()
    e, a, c = (statistics.mean(x) for x in (engine_tps, app_tps, client_tps))
    per_run = statistics.median(x / y for x, y in zip(app_tps, engine_tps))
    print(f"overall  engine {e:.1f} tok/s, app {a:.1f} tok/s, client {c:.1f} tok/s; "
          f"app/engine = {a / e:.3f} (median of per-run ratios {per_run:.3f}), client/engine = {c / e:.3f}")


if __name__ == "__main__":
    main()
