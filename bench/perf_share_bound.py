"""Benchmark (not a test): how much of a pair's ceiling the text itself lets any draft-length policy reach.

The ceiling ``specchat bench`` prints (``Costs.ceiling``) counts every draft token accepted. On real text some are
not, and no controller can know which in advance; so a share of the ceiling under 100% is part text, part policy.
This script splits the two. For each prompt it takes the greedy answer (speculation off), asks the draft model
at every position whether it would have proposed the target's token there (one pass of the draft over prompt
and answer), and finds by dynamic programming the fastest schedule of rounds that a policy knowing those
agreements in advance could run: each round drafts only tokens that will be accepted, as many as pay, at the
round costs timed in the same run (the ceiling's costs: a draft call, a verification batch of n; a draft model
catching up after plain steps is not charged, so the bound is optimistic). Between the two, causal policies
simulated at the same costs: every fixed length up to draft-max, and --draft-p-min gates (stop at a token the
draft gives less than p), the best of each chosen in hindsight. Against them, the speedup the pair's adaptive
drafting (and, with --fixed K, fixed K-token drafts, also simulated to show how far the real loop runs below its
simulation) reached in the same run, as ``specchat bench`` measures it. With --oracle, the real loop also runs
the bound's own schedule (each round drafts exactly the tokens that schedule drafts, all of which the target
accepts): what the real loop reaches when no token's fate is unknown, the highest share any controller can reach
on this machine in this run.

    python bench/perf_share_bound.py [--repeats 2] [-n 192] [--fixed 12] [--oracle]
                                     [--prompts tests/prompts/heldout.jsonl]
                                     [--pair starter | -m TARGET.gguf -md DRAFT.gguf]

Prints per run: each mode's speedup and share of the ceiling, the simulated shares, and per prompt its speedup,
acceptance and how often the draft agrees with the answer; then the medians.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from app.cli.bench import encode_prompt, load_prompts, run_bench  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402
from app.engine import DraftParams, GenerationParams, SamplingParams  # noqa: E402
from app.engine import loop  # noqa: E402
from app.engine.costs import Costs  # noqa: E402


P_MIN = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def greedy_answer(engine, ids: list[int], n: int) -> list[int]:
    params = GenerationParams(max_tokens=n, sampling=SamplingParams(temperature=0.0), draft=DraftParams(draft_max=0))
    return list(engine.generate(ids, params, "none"))[-1].token_ids


def agreements(engine, ids: list[int], answer: list[int]) -> tuple[list[bool], list[float]]:
    """agree[i]: the draft model, given the prompt and answer[:i], proposes answer[i] (its greedy token); conf[i]:
    the probability it gives that proposal (what --draft-p-min compares)."""
    engine.reset()
    ctx = engine.draft.ctx
    agree, conf = [], []

    def judge(logits: np.ndarray, want: int) -> None:
        z = np.exp(logits - logits.max())
        agree.append(int(np.argmax(logits)) == want)
        conf.append(float(z.max() / z.sum()))

    ctx.decode(ids, n_logits=1)
    judge(ctx.logits(-1), answer[0])
    for i, token in enumerate(answer[:-1]):  # (one token a decode: the draft's context keeps one output)
        ctx.decode([token])
        judge(ctx.logits(-1), answer[i + 1])
    engine.reset()
    return agree, conf


def runs_from(agree: list[bool]) -> list[int]:
    """run[i]: agreeing positions from i on."""
    run = [0] * (len(agree) + 1)
    for i in range(len(agree) - 1, -1, -1):
        run[i] = run[i + 1] + 1 if agree[i] else 0
    return run


def policy_seconds(agree: list[bool], conf: list[float], costs: Costs, k_max: int, p_min: float) -> float:
    """Seconds a causal policy takes to decode answer[1:]: draft up to k_max tokens a round, stopping at a token the
    draft gives less than p_min (llama.cpp's fixed drafting). A round's first draft call catches up on two tokens
    after a round accepted whole, on one after a rejection; each token kept but the last costs one more call."""
    n, run = len(agree), runs_from(agree)
    one, two = costs.draft_s
    p, seconds, rejected = 0, 0.0, False
    while p < n - 1:
        limit = min(k_max, n - 2 - p)
        if limit <= 0:
            seconds += costs.verify(1)
            p += 1
            continue
        k = 0
        while k < limit and conf[p + 1 + k] >= p_min:
            k += 1
        calls = k if k == limit else k + 1
        accepted = min(k, run[p + 1])
        seconds += (one if rejected else two) + (calls - 1) * one + costs.verify(k + 1)
        rejected = accepted < k
        p += accepted + 1
    return seconds


def bound_schedule(agree: list[bool], costs: Costs, draft_max: int) -> tuple[float, list[int]]:
    """(seconds, k at each state) of the fastest schedule with every agreement known in advance, decoding answer[1:]."""
    return fastest_schedule(runs_from(agree), costs, draft_max)


def fastest_schedule(run: list[int], costs: Costs, draft_max: int) -> tuple[float, list[int]]:
    """(seconds, k at each state) of the fastest schedule decoding answer[1:] where a draft starting at position i
    can hold at most run[i] tokens that agree (known in advance).

    State p: answer[:p + 1] chosen, answer[p] not yet in the target. A round drafting k tokens (all agreeing,
    answer[p + 1 .. p + k]) costs draft(k) + verify(k + 1) and moves to p + k + 1; k = 0 is a plain step."""
    n = len(run) - 1
    best = [0.0] * n  # best[p]: seconds from state p to state n - 1
    choice = [0] * n
    for p in range(n - 2, -1, -1):
        best[p], choice[p] = min((costs.draft(k) + costs.verify(k + 1) + best[p + k + 1], k)
                                 for k in range(0, min(draft_max, run[p + 1], n - 2 - p) + 1))
    return best[0], choice


class Oracle:
    """Stands in for the loop's ``DraftLength`` (with adaptive drafting off, the loop drafts what ``next`` says):
    each round drafts what the bound's schedule drafts at the answer's position, which ``record`` advances by the
    tokens each round committed. The schedule is the one for the prompt ``_prefill`` last saw."""

    schedules: dict[tuple[int, ...], list[int]] = {}
    prompt: tuple[int, ...] = ()

    def __init__(self, *_args):
        self.p = 0

    def next(self) -> int:
        k = self.schedules.get(self.prompt, [])
        return k[self.p] if self.p < len(k) else 0

    def record(self, draft, n_drafted: int, n_accepted: int, *_times) -> None:
        self.p += n_accepted + 1

    @classmethod
    @contextmanager
    def in_loop(cls, schedules: dict[tuple[int, ...], list[int]]):
        """Swapped into the loop meanwhile, noting each generation's prompt as the loop prefills it."""
        cls.schedules, prefill, length = schedules, loop._prefill, loop.DraftLength

        def noting(target, prompt_ids, *args):
            cls.prompt = tuple(prompt_ids)
            return prefill(target, prompt_ids, *args)

        loop._prefill, loop.DraftLength = noting, cls
        try:
            yield
        finally:
            loop._prefill, loop.DraftLength = prefill, length


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="whole runs, each mode once per run (alternating)")
    ap.add_argument("-n", "--max-tokens", type=int, default=192)
    ap.add_argument("--fixed", type=int, default=None, metavar="K", help="also fixed K-token drafts (--no-adaptive)")
    ap.add_argument("--oracle", action="store_true",
                    help="also run the bound's schedule in the real loop (the highest share reachable here)")
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

    encoded = [encode_prompt(engine, p) for p in prompts]
    texts = [agreements(engine, ids, greedy_answer(engine, ids, a.max_tokens)) for ids in encoded]
    if a.oracle:
        modes["oracle"] = replace(dp, adaptive=False, draft_max=draft_max, draft_p_min=0.0)
    print("draft agreement with the target's greedy answer per prompt: "
          + ", ".join(f"{sum(g) / len(g):.0%}" for g, _ in texts), flush=True)

    shares: dict[str, list[float]] = defaultdict(list)  # what reached (measured) or could reach (simulated) a share
    for r in range(a.repeats):
        names = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for name in names:
            swap = nullcontext()
            if name == "oracle":  # the bound's schedule at costs timed just before it runs
                now = engine.measure_costs(draft_max)
                swap = Oracle.in_loop({tuple(ids): bound_schedule(g, now, draft_max)[1]
                                       for ids, (g, _) in zip(encoded, texts)})
            with swap:
                rep = run_bench(engine, drafter, modes[name], prompts, a.max_tokens)
            costs = Costs(verify_s={int(k): v / 1e3 for k, v in rep["costs"]["verify_ms"].items()},
                          draft_s=(rep["costs"]["draft_ms"][1] / 1e3, rep["costs"]["draft_ms"][2] / 1e3))
            plain = sum((len(g) - 1) * costs.verify(1) for g, _ in texts)
            ceiling = costs.ceiling(draft_max)[0]

            def share(seconds) -> float:  # a schedule's speedup over plain decoding, as a share of the ceiling
                return plain / sum(seconds(g, c) for g, c in texts) / ceiling

            bound = share(lambda g, c: bound_schedule(g, costs, draft_max)[0])
            fixed = {k: share(lambda g, c: policy_seconds(g, c, costs, k, 0.0)) for k in range(1, draft_max + 1)}
            gated = {pm: share(lambda g, c: policy_seconds(g, c, costs, draft_max, pm)) for pm in P_MIN}
            k_best, pm_best = max(fixed, key=fixed.get), max(gated, key=gated.get)
            o = rep["overall"]
            shares[name].append(o["speedup"] / ceiling)
            for label, x in (("text's bound", bound), ("best fixed length", fixed[k_best]),
                             ("best --draft-p-min", gated[pm_best])):
                shares[label].append(x)
            print(f"run {r + 1} {name}: {o['speedup']:.3f}x (worst prompt {o['min_speedup']:.2f}x), ceiling "
                  f"{ceiling:.2f}x: reached {o['speedup'] / ceiling:.0%} of it; {o['mean_accepted_per_round']:.2f} "
                  f"accepted a round, acceptance {o['acceptance']:.1%}, identical {o['all_identical']}", flush=True)
            own = share(lambda g, c: policy_seconds(g, c, costs, modes[name].draft_max, modes[name].draft_p_min))
            print(f"    simulated at this run's costs: the text's bound {bound:.0%} of the ceiling, the best fixed "
                  f"length {fixed[k_best]:.0%} (k={k_best}), the best --draft-p-min {gated[pm_best]:.0%} "
                  f"(p={pm_best}, k<={draft_max}); this mode's own policy if fixed: {own:.0%}", flush=True)
            for row, (g, _) in zip(rep["prompts"], texts):
                print(f"    {row['category']:10} {row['speedup']:.2f}x, acceptance {row['acceptance']:.0%}, "
                      f"{row['mean_accepted_per_round']:.1f} a round; draft agrees at {sum(g) / len(g):.0%}")
    print("\nmedians over the runs, shares of the same run's ceiling:")
    for label, xs in shares.items():
        print(f"  {label:20} {statistics.median(xs):.0%}  ({', '.join(f'{x:.0%}' for x in xs)})")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
