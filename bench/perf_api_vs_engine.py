"""Benchmark: does the OpenAI-compatible API cost speed? The same greedy chat answers generated (a) by the engine in
this process and (b) through `specchat serve` on the same pair, streamed to one `openai` client, interleaved.

    python bench/perf_api_vs_engine.py [--prompts tests/prompts/chat.jsonl] [--limit 6] [--max-tokens 192]

Per prompt and overall it prints the engine's tokens/s, the server's own figure for the streamed request
(``timings.predicted_per_second``), the rate at which tokens reached the client, and the ratios to the engine.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_server(home: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--pair", "starter", "--port", str(port)], cwd=ROOT,
                            env=dict(os.environ, SPECCHAT_HOME=home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "running at" in line:
            return proc, f"http://127.0.0.1:{port}/v1"
    raise SystemExit("the server did not start")


def via_api(client, messages: list[dict], max_tokens: int) -> tuple[float, float, str]:
    """(the server's tokens/s, tokens/s as received by the client, the text)."""
    arrivals, text, server_tps = [], [], None
    for c in client.chat.completions.create(messages=messages, model="starter", max_tokens=max_tokens, temperature=0,
                                            stream=True):
        if c.choices and c.choices[0].delta.content:
            arrivals.append(time.perf_counter())
            text.append(c.choices[0].delta.content)
        if (c.model_extra or {}).get("timings"):
            t = c.model_extra["timings"]
            server_tps, n = t["predicted_per_second"], t["predicted_n"]
    received = (n - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
    return server_tps, received, "".join(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=Path, default=ROOT / "tests" / "prompts" / "chat.jsonl")
    ap.add_argument("--limit", type=int, default=6, help="prompts used from the file")
    ap.add_argument("--max-tokens", type=int, default=192)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="specchat-perf-")
    os.environ["SPECCHAT_HOME"] = home

    import openai

    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.catalog import get_pair
    from app.models.loader import LoadSpec

    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = prompts[: args.limit]
    # The server's defaults are the same: greedy, the pair's recommended draft settings.
    settings = Settings(max_tokens=args.max_tokens).with_draft_params(get_pair("starter").draft_params)
    runtime = Runtime()
    runtime.load(LoadSpec(pair="starter"))
    proc, url = start_server(home)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    rows = []
    try:
        for i, prompt in enumerate([prompts[0]] + prompts):  # the first round warms both up and is not counted
            messages = [{"role": "user", "content": prompt}]
            runtime.engine.reset()  # no prefix reuse on either side: the server's cache is cold for a new prompt too
            live = None
            for live in runtime.answer(messages, settings):
                pass
            engine = live.stats.tokens_per_second
            server, received, text = via_api(client, messages, args.max_tokens)
            same = "same text" if text == live.text else "TEXT DIFFERS"
            tag = "warm-up" if i == 0 else f"prompt {i}"
            print(f"{tag:9s} engine {engine:6.1f} tok/s   API (server) {server:6.1f} ({server / engine:.3f})   "
                  f"client receives {received:6.1f} ({received / engine:.3f})   {live.stats.n_tokens} tokens, {same}",
                  flush=True)
            if i:
                rows.append((engine, server, received))
    finally:
        runtime.close()
        proc.terminate()
    e = statistics.mean(r[0] for r in rows)
    s = statistics.mean(r[1] for r in rows)
    c = statistics.mean(r[2] for r in rows)
    print(f"overall  engine {e:.1f} tok/s, API {s:.1f} tok/s (server's timings), client {c:.1f} tok/s; "
          f"API/engine = {s / e:.3f}, client/engine = {c / e:.3f} "
          f"(median per prompt {statistics.median(r[1] / r[0] for r in rows):.3f})")


if __name__ == "__main__":
    main()
