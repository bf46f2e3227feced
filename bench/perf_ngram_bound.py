"""Benchmark (not a test): how fast any n-gram lookup could go on a pair's answers, beside what each of llama.cpp's
n-gram kinds reaches, in one run.

An n-gram kind proposes what followed an earlier occurrence of the last n tokens (its key). On a given answer,
how much of it a lookup can propose, and how fast that could decode, is fixed by the text and by what this machine
charges for a verification batch. This script measures the kinds as ``specchat bench --ngram-kinds`` does (every
kind against the same speculation-off runs, interleaved, greedy, every output compared), then bounds every lookup
on the same greedy answers at the verification costs timed in the same run:
- for each key length n, at each position of the answer, the longest correct proposal a lookup keyed on the last
  n tokens can make from the prompt and the answer so far: continuing the latest earlier occurrence of the key
  (what ``ngram-simple`` does), and at most, each token from any earlier occurrence of the n before it (every
  proposed token ends an (n + 1)-gram seen before, whatever a kind keeps of them: no lookup with a key of n tokens
  or more, chained or weighted, proposes more);
- the fastest schedule of rounds drafting only such correct proposals, each as long as pays (dynamic programming,
  ``perf_share_bound.fastest_schedule``), drafting counted free;
- and the ceiling: every position drafted and accepted.
A bound under a goal says that no lookup with that key, or a longer one, can reach the goal on these answers on
this machine now (an ``ngram-cache`` static file, -lcs, brings n-grams from other text: left out).

    python bench/perf_ngram_bound.py [--prompts tests/prompts/repeat.jsonl] [-n 192] [--repeats 1]
                                     [--keys 1 2 3 4 8 12 24] [--pair starter | -m T.gguf] [--spec-ngram-* V ...]

Kind settings (``--spec-ngram-*``, ``--draft-max``) pass through to the engine as ``specchat bench`` takes them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cli.bench import encode_prompt, load_prompts, run_bench  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402
from app.engine.costs import Costs  # noqa: E402
from app.engine.drafters import registry  # noqa: E402
from perf_share_bound import fastest_schedule, greedy_answer  # noqa: E402

LONGEST = 64  # the kinds' own longest drafts (ngram-mod's default --spec-ngram-mod-n-max)


def lookup_runs(prompt: list[int], answer: list[int], n: int) -> tuple[list[int], list[int]]:
    """(latest, any): at each answer position i, how many of answer[i:] a lookup keyed on n tokens proposes
    correctly, knowing prompt + answer[:i]: continuing the latest earlier occurrence of the last n tokens (a simple
    lookup), or with each token chosen from any earlier occurrence of the n before it (the drafted ones included):
    every proposed token ends an (n + 1)-gram already seen, whatever a kind keeps of them, so no lookup keyed on n
    tokens or more proposes more. One 0 appended (the end)."""
    seq = prompt + answer
    seen: set[tuple[int, ...]] = set()  # (n + 1)-grams within seq[:cur]
    latest_start: dict[tuple[int, ...], int] = {}  # n-gram -> the end of its latest occurrence with a known next
    latest, any_, j_next = [], [], n
    for i in range(len(answer)):
        cur = len(prompt) + i
        for j in range(j_next, cur):  # the n-grams followed by a known token, and those (n + 1)-grams
            latest_start[tuple(seq[j - n:j])] = j
            seen.add(tuple(seq[j - n:j + 1]))
        j_next = max(j_next, cur)
        source = latest_start.get(tuple(seq[cur - n:cur])) if cur >= n else None
        m = 0
        if source is not None:
            while source + m < cur and cur + m < len(seq) and seq[source + m] == seq[cur + m]:
                m += 1
        latest.append(m)
        m = 0
        while cur + m < len(seq) and cur + m >= n and tuple(seq[cur + m - n:cur + m + 1]) in seen:
            m += 1
        any_.append(m)
    return latest + [0], any_ + [0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=ROOT / "tests/prompts/repeat.jsonl")
    ap.add_argument("-n", "--max-tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each prompt each way (alternating)")
    ap.add_argument("--keys", type=int, nargs="+", default=[1, 2, 3, 4, 8, 12, 24], help="key lengths to bound")
    a, model_args = ap.parse_known_args()
    if not {"--pair", "--target", "-m"} & set(model_args):
        model_args = ["--pair", "starter", *model_args]
    args = build_parser().parse_args(["bench", *model_args, "--prompts", str(a.prompts)])
    engine, _, dp = build_engine(args)
    prompts = load_prompts(a.prompts)
    kinds = list(registry.KINDS)

    reports = run_bench(engine, kinds, dp, prompts, a.max_tokens, a.repeats, progress=sys.stderr)
    encoded = [encode_prompt(engine, p) for p in prompts]
    answers = [greedy_answer(engine, ids, a.max_tokens) for ids in encoded]
    # batches up to LONGEST + 1 timed twice in this run, after the kinds' runs and after the answers
    costs = Costs.mean([engine.measure_costs(LONGEST, kinds[0]) for _ in range(2)])
    plain = sum((len(x) - 1) * costs.verify(1) for x in answers)
    caps = sorted({dp.draft_max, LONGEST})

    def speedup(runs, cap: int) -> float:
        return plain / sum(fastest_schedule(run, costs, cap)[0] for run in runs)

    print(f"\n{a.prompts.name}, {len(prompts)} prompts, {a.max_tokens} tokens, greedy; verification ms by batch: "
          + ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in sorted(costs.verify_s.items())))
    print(f"measured, --draft-max {dp.draft_max}{', adaptive' * dp.adaptive} (every kind against the same "
          "speculation-off runs):")
    for kind, r in zip(kinds, reports):
        o = r["overall"]
        print(f"  {kind:14} {o['speedup']:.2f}x (worst prompt {o['min_speedup']:.2f}x), acceptance "
              f"{o['acceptance']:.0%}, identical {o['all_identical']}; "
              + ", ".join(f"{row['category']} {row['speedup']:.2f}x" for row in r["prompts"]))
    print("bounds at this run's costs, drafting free, at most " + " / ".join(map(str, caps)) + " tokens a round:")
    print("  every position drafted and accepted: " + " / ".join(f"{costs.ceiling(c)[0]:.2f}x" for c in caps))
    for n in a.keys:
        latest, any_ = zip(*(lookup_runs(ids, x, n) for ids, x in zip(encoded, answers)))
        found = sum(m > 0 for run in any_ for m in run) / sum(len(run) - 1 for run in any_)
        print(f"  key of {n:2} tokens: the latest occurrence "
              + " / ".join(f"{speedup(latest, c):.2f}x" for c in caps) + "; any occurrence (the most) "
              + " / ".join(f"{speedup(any_, c):.2f}x" for c in caps) + f"; {found:.0%} of positions have a proposal")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
