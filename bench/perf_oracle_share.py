"""Benchmark (not a test): adaptive drafting against an oracle in the same minutes, prompt by prompt.

A share of the ceiling (``specchat bench``'s "reached") compares a real run with costs timed apart, and on a busy
host the two drift: the same code reads 83% in one run and 89% in the next. Here, for each prompt, speculation off,
adaptive drafting and an oracle run back to back (the first rotating). The oracle is the real loop following the
fastest schedule with every draft token's fate known in advance (``perf_share_bound.bound_schedule``, at costs
timed just before the prompt): each round drafts only tokens the target accepts, as many as pay. What the oracle
reaches is what this machine's loop allows now; adaptive's share of it is what the controller leaves, read within
one prompt's minute.

    python bench/perf_oracle_share.py [--repeats 1] [-n 128] [--prompts tests/prompts/heldout.jsonl]
                                      [--pair starter | -m TARGET.gguf -md DRAFT.gguf]

Prints per prompt the speedups of adaptive and the oracle over plain decoding, the ceiling timed after it, and
adaptive's share of the oracle; then the totals (tokens over decode time, all prompts).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from perf_share_bound import Oracle, agreements, bound_schedule, greedy_answer  # noqa: E402

from app.cli.bench import encode_prompt, load_prompts  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402
from app.engine import DraftParams, GenerationParams, SamplingParams  # noqa: E402
from app.engine.events import Done  # noqa: E402

MODES = ("off", "adaptive", "oracle")


def decode(engine, ids: list[int], drafter: str, params: GenerationParams) -> Done:
    engine.reset()
    return [ev for ev in engine.generate(ids, params, drafter) if isinstance(ev, Done)][-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=Path, default=ROOT / "tests/prompts/heldout.jsonl")
    a, model_args = ap.parse_known_args()
    args = build_parser().parse_args(["bench", *(model_args or ["--pair", "starter"]), "--adaptive", "--prompts",
                                     str(a.prompts)])
    engine, drafter, dp = build_engine(args)
    greedy = SamplingParams(temperature=0.0)
    params = {"off": GenerationParams(max_tokens=a.max_tokens, sampling=greedy, draft=DraftParams(draft_max=0)),
              "adaptive": GenerationParams(max_tokens=a.max_tokens, sampling=greedy, draft=dp),
              "oracle": GenerationParams(max_tokens=a.max_tokens, sampling=greedy,
                                         draft=replace(dp, adaptive=False, draft_p_min=0.0))}
    prompts = load_prompts(a.prompts)
    encoded = [encode_prompt(engine, p) for p in prompts]
    texts = [agreements(engine, ids, greedy_answer(engine, ids, a.max_tokens))[0] for ids in encoded]
    decode(engine, encoded[0], drafter, replace(params["adaptive"], max_tokens=16))  # (a first call's warm-up)

    tokens = dict.fromkeys(MODES, 0)
    seconds = dict.fromkeys(MODES, 0.0)
    ceilings, shares = [], []
    for r in range(a.repeats):
        for i, (p, ids, agree) in enumerate(zip(prompts, encoded, texts)):
            costs = engine.measure_costs(dp.draft_max)
            schedule = {tuple(ids): bound_schedule(agree, costs, dp.draft_max)[1]}
            done = {}
            turn = (i + r) % len(MODES)
            for mode in MODES[turn:] + MODES[:turn]:
                if mode == "oracle":
                    with Oracle.in_loop(schedule):
                        done[mode] = decode(engine, ids, drafter, params[mode])
                else:
                    done[mode] = decode(engine, ids, "none" if mode == "off" else drafter, params[mode])
            ceiling = engine.measure_costs(dp.draft_max).ceiling(dp.draft_max)[0]
            ceilings.append(ceiling)
            tps = {}
            for mode, d in done.items():
                n, s = max(d.stats.n_tokens - 1, 0), d.stats.decode_seconds
                tokens[mode] += n
                seconds[mode] += s
                tps[mode] = n / s
            same = done["adaptive"].token_ids == done["off"].token_ids == done["oracle"].token_ids
            share = tps["adaptive"] / tps["oracle"]
            shares.append(share)
            st = done["adaptive"].stats
            print(f"{p.get('category', i):10} adaptive {tps['adaptive'] / tps['off']:.2f}x "
                  f"({st.n_accepted / max(st.n_rounds, 1):.1f} accepted a round), oracle "
                  f"{tps['oracle'] / tps['off']:.2f}x, ceiling {ceiling:.2f}x: adaptive reached {share:.0%} of the "
                  f"oracle; identical {same}", flush=True)
    speedup = {m: tokens[m] / seconds[m] / (tokens["off"] / seconds["off"]) for m in MODES}
    ceiling = statistics.fmean(ceilings)
    print(f"\ntotal: adaptive {speedup['adaptive']:.3f}x, oracle {speedup['oracle']:.3f}x, mean ceiling "
          f"{ceiling:.2f}x; shares of the ceiling: adaptive {speedup['adaptive'] / ceiling:.0%}, oracle "
          f"{speedup['oracle'] / ceiling:.0%}; adaptive / oracle {speedup['adaptive'] / speedup['oracle']:.1%} "
          f"(per prompt, median {statistics.median(shares):.0%})")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
