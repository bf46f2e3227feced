"""Benchmark tool (not a test): replay an n-gram kind under a checkout's adaptive controller, without the host's noise.

The n-gram counterpart of ``replay_adaptive.py``. ``record`` takes the pair's greedy answers to each prompt of one or
more prompt files and times verification batches of 1 to 65 tokens. ``replay`` runs a checkout's real kind
(``app.engine.drafters``) and real ``DraftLength`` over those answers, as the loop does: each round the controller
says how much to draft, the kind looks up the history and asks it to take each token, the target accepts up to
the first token off its answer, and each batch costs its recorded time (linear between the sizes timed) times
seeded noise. A lookup's own time is measured as it runs. Answers of one file follow one another with one
``Measured``, as in ``specchat bench``. With --oracle, a reference no controller reaches: each round drafts exactly
the kind's correct tokens. --verify-ms replaces the recorded batch times with another run's (``perf_ngram_bound``
prints them), to try a spell the recording was not made in.

    python bench/replay_ngram.py record OUT.json [--prompts tests/prompts/repeat.jsonl ...] [-n 192] [--pair starter]
    python bench/replay_ngram.py replay OUT.json [--code CHECKOUT ...] [--kind ngram-simple] [--spec-ngram-* V ...]
                                                 [--draft-max 12] [--seeds 5] [--sigma 0.05] [--oracle]
                                                 [--verify-ms 1:24.5,2:28.9,...]
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONGEST = 64  # batches timed up to LONGEST + 1 tokens
BETWEEN_S = 0.0004  # the loop's own work between two rounds (as replay_adaptive)


def record(out: Path, prompt_files: list[Path], n: int, model_args: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from perf_share_bound import greedy_answer

    from app.cli.bench import encode_prompt, load_prompts
    from app.cli.main import build_engine, build_parser
    from app.engine.costs import Costs

    args = build_parser().parse_args(["bench", *model_args, "--prompts", str(prompt_files[0])])
    engine, _, _ = build_engine(args)
    sets = {}
    for path in prompt_files:
        sets[path.stem] = []
        for p in load_prompts(path):
            ids = encode_prompt(engine, p)
            engine.reset()
            sets[path.stem].append({"category": p.get("category", ""), "prompt": ids,
                                    "answer": greedy_answer(engine, ids, n)})
            print(f"recorded {path.stem} {p.get('category', '')}", file=sys.stderr, flush=True)
    costs = Costs.mean([engine.measure_costs(LONGEST, "ngram-simple") for _ in range(2)])
    engine.close()
    out.write_text(json.dumps({"sets": sets, "verify_s": costs.verify_s}))
    print(f"wrote {out}: batches " + ", ".join(f"{k}: {v * 1e3:.1f}" for k, v in sorted(costs.verify_s.items()))
          + " ms", file=sys.stderr)


def replay(answers: list[dict], code, kind: str, params, batches: list[float], seed: int, sigma: float,
           oracle: bool) -> tuple[float, float]:
    """(speedup over plain decoding at the same costs, acceptance) of one pass over ``answers``."""
    dc, make = code
    rng = random.Random(seed)
    cost = lambda s: s * math.exp(rng.gauss(0.0, sigma))  # noqa: E731
    measured = dc.Measured()
    on = off = 0.0
    drafted = accepted_all = 0
    for a in answers:
        prompt, answer = a["prompt"], a["answer"]
        drafter = make(kind, params.ngram)
        drafter.begin(prompt)
        control = dc.DraftLength(params, drafter.SIGNAL_EDGES, drafter.SIGNAL_PRIOR, measured,
                                 **({"signal_grows": True} if getattr(drafter, "SIGNAL_GROWS", False) else {}))
        pos, first = 0, True
        while pos + 1 < len(answer):
            room = len(answer) - 1 - pos
            history = prompt + answer[: pos + 1]
            t0 = time.perf_counter()
            if oracle:  # the kind's own draft, cut to its correct tokens
                tokens = drafter.draft_round(history, params.draft_max, room, None, None, None).tokens
                tokens = tokens[: next((i for i, t in enumerate(tokens) if t != answer[pos + 1 + i]), len(tokens))]
                draft = None
            else:
                draft = drafter.draft_round(history, min(control.next(), room), room, None, None, control)
                tokens = draft.tokens
            draft_s = time.perf_counter() - t0
            k = len(tokens)
            accepted = next((i for i, t in enumerate(tokens) if t != answer[pos + 1 + i]), k)
            drafter.accept(accepted)
            verify_s, between_s = cost(batches[min(k + 1, LONGEST + 1)]), cost(BETWEEN_S)
            if draft is not None:
                control.update(k, accepted, draft_s, verify_s, draft.signals or None, 0, 0.0, 0, None,
                               None if first else between_s)
            on += draft_s + verify_s + between_s
            drafted, accepted_all = drafted + k, accepted_all + accepted
            pos, first = pos + accepted + 1, False
        off += sum(cost(batches[1]) + cost(BETWEEN_S) for _ in range(len(answer) - 1))
    return off / on, accepted_all / max(drafted, 1)


def load_code(path: Path):
    """A checkout's draft_control and a maker of its n-gram kinds (each checkout imported afresh)."""
    for name in [m for m in sys.modules if m == "app" or m.startswith("app.")]:
        del sys.modules[name]
    sys.path.insert(0, str(path.resolve()))
    try:
        dc = importlib.import_module("app.engine.draft_control")
        kinds = importlib.import_module("app.engine.drafters.registry").KINDS
    finally:
        sys.path.pop(0)
    return dc, lambda kind, ngram: kinds[kind](ngram)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record greedy answers and batch costs (model options as specchat bench)")
    r.add_argument("out", type=Path)
    r.add_argument("--prompts", type=Path, nargs="+", default=[ROOT / "tests/prompts/repeat.jsonl",
                                                                ROOT / "tests/prompts/chat.jsonl"])
    r.add_argument("-n", "--max-tokens", type=int, default=192)
    p = sub.add_parser("replay", help="replay a kind under checkouts' controllers")
    p.add_argument("recording", type=Path)
    p.add_argument("--code", type=Path, nargs="+", default=[ROOT], help="checkouts to compare (default: this)")
    p.add_argument("--kind", default="ngram-simple")
    p.add_argument("--draft-max", type=int, default=12)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sigma", type=float, default=0.05, help="log-normal noise on every batch's time")
    p.add_argument("--oracle", action="store_true", help="also: each round drafts exactly the kind's correct tokens")
    p.add_argument("--verify-ms", help="batch times to use instead of the recorded ones: 1:24.5,2:28.9,...")
    a, rest = ap.parse_known_args()
    if a.cmd == "record":
        record(a.out, a.prompts, a.max_tokens, rest or ["--pair", "starter"])
        return 0
    rec = json.loads(a.recording.read_text())
    timed = ({int(n): float(ms) / 1e3 for n, ms in (x.split(":") for x in a.verify_ms.split(","))} if a.verify_ms
             else {int(n): s for n, s in rec["verify_s"].items()})
    flags = dict(zip(rest[::2], rest[1::2]))  # --spec-ngram-simple-size-n 2: NgramParams(simple_size_n=2)
    if len(rest) % 2 or not all(f.startswith("--spec-ngram-") for f in flags):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    settings = {f.removeprefix("--spec-ngram-").replace("-", "_"): int(v) for f, v in flags.items()}
    for code_path in a.code:
        code = load_code(code_path)
        costs = importlib.import_module("app.engine.costs").Costs(timed)  # (linear between the sizes timed)
        batches = [0.0] + [costs.verify(n) for n in range(1, LONGEST + 2)]
        ngram = importlib.import_module("app.engine.drafters.ngram").NgramParams(**settings)
        params = code[0].DraftParams(draft_max=a.draft_max, adaptive=True, ngram=ngram)
        for name, answers in rec["sets"].items():
            runs = [replay(answers, code, a.kind, params, batches, s, a.sigma, False) for s in range(a.seeds)]
            line = (f"{code_path}: {a.kind}, {name}, --draft-max {a.draft_max}: adaptive "
                    f"{statistics.median(s for s, _ in runs):.3f}x (median of {a.seeds} seeds), acceptance "
                    f"{statistics.median(x for _, x in runs):.0%}")
            if a.oracle:
                line += f"; oracle {replay(answers, code, a.kind, params, batches, 0, a.sigma, True)[0]:.3f}x"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
