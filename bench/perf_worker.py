"""Benchmark: what the engine worker process costs. The starter pair loaded (a) in this process and (b) in an engine
worker (app/chat/worker), alternately, each answering the same greedy chat prompts; timed where the app reads the
events (this process), so the worker's socket is inside what is measured.

    python bench/perf_worker.py [--prompts tests/prompts/chat.jsonl] [--limit 4] [--max-tokens 160] [--rounds 3]

Per round and mode it prints the time from ``Runtime.load`` to a loaded pair, and per answer the time to the first
text and the rate at which text arrived (tokens after the first over the time since the first). The summary gives
worker / in-process ratios of the medians: streamed tokens/s, and the differences in time to first token and in
start to a ready chat. Goals (issue "The engine in its own process"): >= 0.98, <= 10 ms, <= 1 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def answer(engine, ids, params) -> tuple[float, float, int, str]:
    """(seconds to the first text, tokens/s as the text arrived, tokens, the text)."""
    from app.engine import DRAFT_MODEL, Done, TextDelta

    start, first, last, done, text = time.perf_counter(), None, None, None, []
    for ev in engine.generate(ids, params, DRAFT_MODEL):
        if isinstance(ev, TextDelta) and ev.text:
            last = time.perf_counter()
            first = first or last
            text.append(ev.text)
        elif isinstance(ev, Done):
            done = ev
    n = done.stats.n_tokens
    return first - start, (n - 1) / (last - first) if last > first else 0.0, n, "".join(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(ROOT / "tests/prompts/chat.jsonl"))
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    os.environ.setdefault("SPECCHAT_HOME", tempfile.mkdtemp(prefix="specchat-bench-"))
    from app.chat.runtime import Runtime
    from app.engine import DraftParams, GenerationParams, SamplingParams
    from app.models.loader import LoadSpec
    from app.prompts import chat_tokens

    prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()][: args.limit]
    params = GenerationParams(max_tokens=args.max_tokens, sampling=SamplingParams(temperature=0.0),
                              draft=DraftParams(adaptive=False))
    spec = LoadSpec(pair="starter")
    Runtime().load(spec)  # (the starter's target is written on first use: not part of either mode's time)
    figures = {mode: {"ready": [], "ttft": [], "tps": []} for mode in ("in-process", "worker")}
    texts: dict[int, set] = {}  # prompt -> the answers it got, in either mode (greedy: one)
    for r in range(args.rounds):
        for mode in (("in-process", "worker") if r % 2 == 0 else ("worker", "in-process")):
            t0 = time.perf_counter()
            rt = Runtime(worker=mode == "worker")
            rt.load(spec)
            ready = time.perf_counter() - t0
            figures[mode]["ready"].append(ready)
            engine = rt.engine
            for i, p in enumerate(prompts):
                ids = chat_tokens(engine.model, [{"role": "user", "content": p}])
                engine.reset()  # (each answer evaluates its whole prompt, in both modes)
                ttft, tps, n, text = answer(engine, ids, params)
                texts.setdefault(i, set()).add(text)
                figures[mode]["ttft"].append(ttft)
                figures[mode]["tps"].append(tps)
                print(f"round {r} {mode:10s} prompt {i}: first text {ttft * 1000:7.1f} ms, {tps:6.1f} tok/s, "
                      f"{n} tokens", flush=True)
            print(f"round {r} {mode:10s} load to ready: {ready:.2f} s", flush=True)
            rt.close()
    med = {m: {k: statistics.median(v) for k, v in f.items()} for m, f in figures.items()}
    w, p = med["worker"], med["in-process"]
    print("\nmedians        in-process    worker")
    print(f"load to ready  {p['ready']:9.2f} s {w['ready']:8.2f} s   worker - in-process: "
          f"{w['ready'] - p['ready']:+.2f} s")
    print(f"first text     {p['ttft'] * 1000:8.1f} ms {w['ttft'] * 1000:7.1f} ms   worker - in-process: "
          f"{(w['ttft'] - p['ttft']) * 1000:+.1f} ms")
    print(f"streamed tok/s {p['tps']:9.1f}   {w['tps']:8.1f}     worker / in-process: {w['tps'] / p['tps']:.3f}")
    print("same text in both modes, every prompt:", "yes" if all(len(t) == 1 for t in texts.values()) else "NO")


if __name__ == "__main__":
    main()
