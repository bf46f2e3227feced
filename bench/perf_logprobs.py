"""Benchmark (not a test): what token probabilities cost. One row's log-softmax and top-20 (the work per committed
token, at the starter's 49,152 and Gemma's 262,144 vocabularies), and the starter pair's tokens/s with and without
``logprobs=20``, interleaved in the same run so neither is judged on a quieter minute.

    python bench/perf_logprobs.py [--repeats 3] [-n 128]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine import DraftParams, Engine, GenerationParams, ModelSettings  # noqa: E402
from app.engine.logprobs import from_logits  # noqa: E402
from app.models import starter  # noqa: E402

PROMPT = "The history of the printing press begins"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    args = ap.parse_args()
    for n_vocab in (49152, 262144):
        row = np.random.default_rng(0).normal(0, 3, n_vocab).astype(np.float32)
        per = timeit.timeit(lambda: from_logits(row, 5, 20), number=500) / 500
        print(f"one row of {n_vocab} logits, top 20: {per * 1e6:.0f} us")
    engine = Engine(ModelSettings(starter.target_path(), n_ctx=1024), ModelSettings(starter.draft_path(), n_ctx=1024))
    ids = engine.model.tokenize(PROMPT, add_special=True)
    rates: dict[object, list[float]] = {None: [], 20: []}
    try:
        for rep in range(args.repeats):
            for asked in ((None, 20) if rep % 2 == 0 else (20, None)):
                params = GenerationParams(max_tokens=args.n, logprobs=asked, draft=DraftParams(draft_max=8))
                stats = list(engine.generate(ids, params, "model"))[-1].stats
                rates[asked].append(stats.tokens_per_second)
                print(f"repeat {rep} logprobs={asked}: {stats.n_tokens} tokens, {stats.tokens_per_second:.1f} tok/s")
    finally:
        engine.close()
    off, on = statistics.median(rates[None]), statistics.median(rates[20])
    print(f"median tok/s: without {off:.1f}, with logprobs=20 {on:.1f} ({on / off:.3f}x)")


if __name__ == "__main__":
    main()
