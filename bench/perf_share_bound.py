"""Benchmark (not a test): how much of a pair's ceiling the text itself lets any draft-length policy reach.

The ceiling ``specchat bench`` prints (``Costs.ceiling``) counts every draft token accepted. On real text some are
not, and no controller can know which in advance; so a share of the ceiling under 100% is part text, part policy.
This script splits the two. For each prompt it takes the greedy answer (speculation off), asks the draft model
at every position whether it would have proposed the target's token there (one pass of the draft over prompt
and answer), and finds by dynamic programming the fastest schedule of rounds that a policy knowing those
agreements in advance could run: each round drafts only tokens that will be accepted, as many as pay, at the
round costs timed in the same run (the ceiling's costs: a draft call, a verification batch of n; a draft model
catching up after plain steps is not charged, so the bound is optimistic). Against it, the speedup the pair's
adaptive drafting (and, with --fixed K, fixed K-token drafts) reached in the same run, as ``specchat bench``
measures it.

    python bench/perf_share_bound.py [--repeats 2] [-n 192] [--fixed 12] [--prompts tests/prompts/heldout.jsonl]
                                     [--pair starter | -m TARGET.gguf -md DRAFT.gguf]

Prints per prompt and overall: the ceiling, the text's bound (and its share of the ceiling), and each mode's
speedup with its share of the ceiling and of the bound.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from app.cli.bench import load_prompts, run_bench  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402
from app.engine import DraftParams, GenerationParams, SamplingParams  # noqa: E402
from app.engine.costs import Costs  # noqa: E402
from app.prompts import chat_tokens, plain_tokens  # noqa: E402


def greedy_answer(engine, ids: list[int], n: int) -> list[int]:
    params = GenerationParams(max_tokens=n, sampling=SamplingParams(temperature=0.0), draft=DraftParams(draft_max=0))
    return list(engine.generate(ids, params, "none"))[-1].token_ids


def agreements(engine, ids: list[int], answer: list[int]) -> list[bool]:
    """agree[i]: the draft model, given the prompt and answer[:i], proposes answer[i] (its greedy token)."""
    engine.reset()
    ctx = engine.draft.ctx
    ctx.decode(ids, n_logits=1)
    agree = [int(np.argmax(ctx.logits(-1))) == answer[0]]
    for i, token in enumerate(answer[:-1]):  # (one token a decode: the draft's context keeps one output)
        ctx.decode([token])
        agree.append(int(np.argmax(ctx.logits(-1))) == answer[i + 1])
    engine.reset()
    return agree


def bound_seconds(agree: list[bool], costs: Costs, draft_max: int) -> float:
    """Seconds the fastest schedule with every agreement known in advance takes to decode answer[1:].

    State p: answer[:p + 1] chosen, answer[p] not yet in the target. A round drafting k tokens (all agreeing,
    answer[p + 1 .. p + k]) costs draft(k) + verify(k + 1) and moves to p + k + 1; k = 0 is a plain step."""
    n = len(agree)
    run = [0] * (n + 1)  # run[i]: agreeing positions from i on
    for i in range(n - 1, -1, -1):
        run[i] = run[i + 1] + 1 if agree[i] else 0
    best = [0.0] * n  # best[p]: seconds from state p to state n - 1
    for p in range(n - 2, -1, -1):
        best[p] = min(costs.draft(k) + costs.verify(k + 1) + best[p + k + 1]
                      for k in range(0, min(draft_max, run[p + 1], n - 2 - p) + 1))
    return best[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="whole runs, each mode once per run (alternating)")
    ap.add_argument("-n", "--max-tokens", type=int, default=192)
    ap.add_argument("--fixed", type=int, default=None, metavar="K", help="also fixed K-token drafts (--no-adaptive)")
    ap.add_argument("--prompts", type=Path, default=ROOT / "tests/prompts/heldout.jsonl")
    a, model_args = ap.parse_known_args()
    model_args = model_args or ["--pair", "starter"]
    args = build_parser().parse_args(["bench", *model_args, "--adaptive", "--prompts", str(a.prompts)])
    engine, drafter, dp = build_engine(args)
    prompts = load_prompts(a.prompts)
    modes = {"adaptive": dp}
    if a.fixed:
        modes[f"fixed {a.fixed}"] = replace(dp, adaptive=False, draft_max=a.fixed)
    draft_max = max(d.draft_max for d in modes.values())

    encoded = [chat_tokens(engine.model, [{"role": "user", "content": p["prompt"]}]) if p["chat"]
               else plain_tokens(engine.model, p["prompt"]) for p in prompts]
    agree = [agreements(engine, ids, greedy_answer(engine, ids, a.max_tokens)) for ids in encoded]
    print("draft agreement with the target's greedy answer per prompt: "
          + ", ".join(f"{sum(g) / len(g):.0%}" for g in agree), flush=True)

    results: dict[str, list[dict]] = {m: [] for m in modes}
    bounds = []
    for r in range(a.repeats):
        names = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for name in names:
            rep = run_bench(engine, drafter, modes[name], prompts, a.max_tokens)
            results[name].append(rep)
            costs = Costs(verify_s={int(k): v / 1e3 for k, v in rep["costs"]["verify_ms"].items()},
                          draft_s=(rep["costs"]["draft_ms"][1] / 1e3, rep["costs"]["draft_ms"][2] / 1e3))
            plain = sum((len(g) - 1) * costs.verify(1) for g in agree)
            bound = plain / sum(bound_seconds(g, costs, draft_max) for g in agree)
            ceiling = costs.ceiling(draft_max)[0]
            bounds.append((ceiling, bound))
            o = rep["overall"]
            print(f"run {r + 1} {name}: {o['speedup']:.3f}x (worst prompt {o['min_speedup']:.2f}x), ceiling "
                  f"{ceiling:.2f}x, text's bound {bound:.2f}x ({bound / ceiling:.0%} of the ceiling); reached "
                  f"{o['speedup'] / ceiling:.0%} of the ceiling, {o['speedup'] / bound:.0%} of the bound; "
                  f"{o['mean_accepted_per_round']:.2f} accepted a round, acceptance {o['acceptance']:.1%}, "
                  f"identical {o['all_identical']}", flush=True)
            for row, g in zip(rep["prompts"], agree):
                print(f"    {row['category']:10} {row['speedup']:.2f}x, acceptance {row['acceptance']:.0%}, "
                      f"{row['mean_accepted_per_round']:.1f} a round; draft agrees at {sum(g) / len(g):.0%}")
            results[name][-1] = {"share": o["speedup"] / ceiling, "of_bound": o["speedup"] / bound}
    print("\nmedians over the runs:")
    print(f"text's bound: {statistics.median(b / c for c, b in bounds):.0%} of the ceiling")
    for name, rows in results.items():
        print(f"{name:10} {statistics.median(x['share'] for x in rows):.0%} of the ceiling, "
              f"{statistics.median(x['of_bound'] for x in rows):.0%} of the text's bound")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
