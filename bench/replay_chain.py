"""Benchmark tool (not a test): replay drafters, chains among them, under a checkout's adaptive controller, without
the host's noise.

A chain (``--drafters model,ngram-simple``) runs two drafters a round and verifies one draft: whether it beats its
members is a question of costs and acceptance that real runs here cannot settle (the host's spells moved the draft
model alone between 0.71x and 1.71x in one evening). This tool replays the checkout's real ``ChainDrafter``, n-gram
kinds and ``DraftLength`` over a recording of ``replay_adaptive.py record`` (the target's greedy answers, the draft
model's greedy chain at every position, each operation's time): the draft model drafts along its recorded chain as
``ModelDrafter.propose`` does (catching up on the tokens made since it last drafted, which after a round won by
another member includes that round), a lookup runs for real, the target accepts up to the first token off its
answer, and every operation costs its recorded time times seeded noise. Each drafter named is replayed alone or as
the chain it names, over the same answers and seeds.

    python bench/replay_adaptive.py record OUT.json --pair starter --prompts tests/prompts/repeat.jsonl -n 192
    python bench/replay_chain.py OUT.json [--drafters ngram-simple model model,ngram-simple] [--code CHECKOUT ...]
                                          [--draft-max 12] [--seeds 5] [--sigma 0.05] [--spec-ngram-* V ...]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_adaptive import BETWEEN_S, Recording, ask, draft_along  # noqa: E402
from replay_ngram import load_code  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 64  # the most draft tokens a round verifies (draft_control.MAX_DRAFT)


class RecordedModel:
    """The draft model, replayed: drafts along the recorded greedy chain at the history's position, as
    ``ModelDrafter.propose`` does, and adds what its calls cost to ``spent``."""

    name, label = "model", "draft model"

    def __init__(self, rec: Recording, answer: dict, base, cost):
        self.rec, self.chains, self.answer, self.cost = rec, answer["chains"], answer["answer"], cost
        self.n_prompt, self.cached, self.spent = len(answer["prompt"]), 0, 0.0  # spent: its calls' seconds
        self.Draft = base.Draft
        self.SIGNAL_EDGES, self.SIGNAL_PRIOR = base.ModelDrafter.SIGNAL_EDGES, base.ModelDrafter.SIGNAL_PRIOR
        self.SIGNAL_GROWS = False

    def begin(self, prompt_ids):
        pass

    def draft_round(self, history, n_max, limit, sp, rng, gate):
        n = min(n_max, limit)
        return self.propose(history, n, sp, rng, gate) if n > 0 else self.Draft()

    def propose(self, history, n_max, sp, rng, gate=None, stop=None):
        pos = len(history) - self.n_prompt - 1
        n_first = max(pos + 1 - self.cached, 1)  # (catch_up: the tokens made since, or the last one again)
        tokens, signals, evals, first_s, spent, unsure = draft_along(self.rec, self.chains[pos], n_max, n_first,
                                                                      gate, self.cost)
        decoded = tokens[: evals - 1]  # (its context keeps what it decoded, up to a wrong token)
        held = next((j for j, t in enumerate(decoded) if t != self.answer[pos + 1 + j]), len(decoded))
        self.cached, self.spent = pos + 1 + held, self.spent + spent
        draft = self.Draft(tokens=tokens, signals=signals if gate else None, n_evals=evals, first_s=first_s,
                           n_first=n_first)
        draft.unsure = unsure  # (a field older checkouts' Draft lacks: they ignore it)
        return draft

    def accept(self, n_accepted):
        pass


def make(code, name: str, rec: Recording, answer: dict, ngram, cost):
    """The drafter ``name`` names (a chain for several, in llama.cpp's order: lookups first) and its draft model."""
    kinds = code.registry.KINDS
    model = RecordedModel(rec, answer, code, cost)
    parts = sorted(name.split(","), key=lambda p: list(kinds).index(p) if p in kinds else len(kinds))
    made = [kinds[p](ngram) if p in kinds else model for p in parts]
    if len(made) == 1:
        return made[0], model
    return code.chain.ChainDrafter([(d, d is model) for d in made]), model


def replay(rec: Recording, code, name: str, params, seed: int, sigma: float) -> tuple[float, dict]:
    """(Speedup over plain decoding at the same costs, per member: rounds, drafted, accepted) of one pass."""
    rng = random.Random(seed)
    cost = lambda s: s * math.exp(rng.gauss(0.0, sigma))  # noqa: E731
    measured = code.dc.Measured()
    on = off = 0.0
    used: dict[str, list[int]] = {}
    for a in rec.answers:
        prompt, answer = a["prompt"], a["answer"]
        drafter, model = make(code, name, rec, a, params.ngram, cost)
        drafter.begin(prompt)
        control = code.dc.DraftLength(params, drafter.SIGNAL_EDGES, drafter.SIGNAL_PRIOR, measured,
                                      **({"signal_grows": True} if getattr(drafter, "SIGNAL_GROWS", False) else {}))
        pos, first = 0, True
        while pos + 1 < len(answer):
            room = len(answer) - 1 - pos
            model.spent = 0.0
            t0 = time.perf_counter()
            draft = drafter.draft_round(prompt + answer[: pos + 1], min(ask(control, room), room), min(room, LIMIT),
                                        None, None, control)
            draft_s = time.perf_counter() - t0 + model.spent  # (a lookup's own time, and the model's calls)
            k = len(draft.tokens)
            accepted = next((i for i, t in enumerate(draft.tokens) if t != answer[pos + 1 + i]), k)
            if k:
                drafter.accept(accepted)
                u = used.setdefault(getattr(draft, "source", "") or name, [0, 0, 0])
                u[0], u[1], u[2] = u[0] + 1, u[1] + k, u[2] + accepted
            verify_s, between_s = cost(rec.batch(k + 1)), cost(BETWEEN_S)
            control.record(draft, k, accepted, draft_s, verify_s, None if first else between_s)
            on += draft_s + verify_s + between_s
            pos, first = pos + accepted + 1, False
        off += sum(cost(rec.verify[1]) + cost(BETWEEN_S) for _ in range(len(answer) - 1))
    return off / on, used


class Code:
    """A checkout's modules the replay uses, imported afresh."""

    def __init__(self, path: Path):
        self.dc, _ = load_code(path)
        mods = sys.modules
        self.registry = mods["app.engine.drafters.registry"]
        self.chain = mods["app.engine.drafters.chain"]
        self.Draft = mods["app.engine.drafters.base"].Draft
        self.ModelDrafter = mods["app.engine.drafters.draft_model"].ModelDrafter
        self.NgramParams = mods["app.engine.drafters.ngram"].NgramParams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--drafters", nargs="+", default=["ngram-simple", "model", "model,ngram-simple"])
    ap.add_argument("--code", type=Path, nargs="+", default=[ROOT], help="checkouts to compare (default: this)")
    ap.add_argument("--draft-max", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sigma", type=float, default=0.05, help="log-normal noise on every operation's time")
    ap.add_argument("--draft-scale", type=float, default=1.0, help="scale the draft model's costs (another spell)")
    a, rest = ap.parse_known_args()
    flags = dict(zip(rest[::2], rest[1::2]))  # --spec-ngram-simple-size-n 2: NgramParams(simple_size_n=2)
    if len(rest) % 2 or not all(f.startswith("--spec-ngram-") for f in flags):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    settings = {f.removeprefix("--spec-ngram-").replace("-", "_"): int(v) for f, v in flags.items()}
    rec = Recording(a.recording, a.draft_scale)
    if "prompt" not in rec.answers[0]:
        ap.error(f"{a.recording} has no prompts: record it again with this checkout's replay_adaptive.py")
    for path in a.code:
        code = Code(path)
        params = code.dc.DraftParams(draft_max=a.draft_max, draft_p_min=rec.p_min, adaptive=True,
                                     ngram=code.NgramParams(**settings))
        for name in a.drafters:
            runs = [replay(rec, code, name, params, seed, a.sigma) for seed in range(a.seeds)]
            speedups = sorted(s for s, _ in runs)
            members = "; ".join(f"{m} {r} rounds, {acc}/{d} accepted" for m, (r, d, acc) in sorted(runs[0][1].items()))
            print(f"{path}: {name}: {statistics.median(speedups):.3f}x median of "
                  f"{' '.join(f'{s:.3f}' for s in speedups)} (seed 0: {members})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
