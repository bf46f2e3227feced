"""Benchmark tool (not a test): two versions of the adaptive controller on one loaded pair, in the same run.

The host moves a pair's speedup by more than most controller changes do (the starter's ceiling went from 1.52x to
1.25x within three passes of one process), so comparing two checkouts by separate runs says little. This loads the
pair once and, for each prompt, runs speculation off, this checkout's controller and the other's, in an order that
rotates, each from empty caches; each controller keeps its own measurements (``Measured``) from answer to answer,
as the engine does. Between prompts it times a round's operations (``Engine.measure_costs``), as ``specchat bench``
does, for the ceiling. It prints each repeat's speedups and shares of the ceiling, side by side, and their medians.

The other checkout's ``app/engine/draft_control.py`` and ``drafters/draft_model.py`` (its signal buckets) are loaded
beside this checkout's engine: the rest of the engine is this checkout's. ``--fixed GAP`` runs a rule without memory
instead (draft up to --draft-max tokens, each while the draft's logit gap is at least GAP): the best such rule chosen
in hindsight on a replay (``replay_adaptive.py -v``), run for real, tells what the host leaves of the replay's share.

    python bench/ab_adaptive.py [--other CHECKOUT]... [--fixed GAP]... [--repeats 3] [-n 128]
                                [--prompts tests/prompts/heldout.jsonl] [specchat bench's model options]
    (the model options default to --pair starter)
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from app.cli.bench import _run, encode_prompt, load_prompts  # noqa: E402
from app.cli.main import build_engine, build_parser  # noqa: E402
from app.engine import OFF, Costs, DraftParams, GenerationParams, SamplingParams, loop  # noqa: E402
from app.engine.drafters import ModelDrafter  # noqa: E402
from replay_adaptive import FixedRule as ReplayedRule  # noqa: E402


def sibling(module: str, path: Path):
    """Load ``path`` as ``module``, so that its relative imports find this checkout's modules."""
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    spec.loader.exec_module(mod)
    return mod


def roomy(control: type) -> type:
    """The controller class, or for an older checkout's, whose ``next`` takes no room, one that drops the loop's."""
    if isinstance(control, type) and not inspect.signature(control.next).parameters.keys() - {"self"}:
        class Older(control):
            def next(self, room=None) -> int:
                return super().next()
        return Older
    return control


class Controller:
    """One version of the controller: its class, its signal buckets, its measurements across answers."""

    def __init__(self, name: str, draft_length: type, drafter: type):
        self.name, self.draft_length = name, roomy(draft_length)
        self.edges, self.prior = drafter.SIGNAL_EDGES, drafter.SIGNAL_PRIOR
        self.measured: dict = {}

    def install(self, engine) -> None:
        loop.DraftLength = self.draft_length
        ModelDrafter.SIGNAL_EDGES, ModelDrafter.SIGNAL_PRIOR = self.edges, self.prior
        engine._measured = self.measured


class FixedRule(ReplayedRule):
    """The replay's fixed rule as the loop meets a controller: made per answer from its DraftParams (up to
    draft_max tokens), told of each round (``record``), asked the prices of a chain's members (none here)."""

    def __init__(self, gap: float):
        super().__init__(gap, 0)

    def __call__(self, params, *args):
        self.k_max = params.draft_max
        return self

    def prices(self) -> tuple[float, float]:
        return 0.0, 0.0

    def record(self, *args) -> None:
        pass


def tps(done) -> tuple[int, float]:
    return max(done.stats.n_tokens - 1, 0), done.stats.decode_seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, action="append", default=[],
                    help="a checkout whose controller runs beside this one (repeatable)")
    ap.add_argument("--fixed", type=float, metavar="GAP", action="append", default=[],
                    help="a fixed rule beside this checkout's controller (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=Path, default=ROOT / "tests/prompts/heldout.jsonl")
    ap.add_argument("-v", "--verbose", action="store_true", help="each prompt's speedups too")
    a, rest = ap.parse_known_args()
    if not a.other and not a.fixed:
        ap.error("give --other CHECKOUT or --fixed GAP")
    args = build_parser().parse_args(["bench", *(rest or ["--pair", "starter"]), "--adaptive",
                                      "--prompts", str(a.prompts)])
    engine, drafter, dp = build_engine(args)
    engine._memory = None  # (a profile kept from a launch would be one controller's: each starts from its priors)
    controllers = [Controller("this", loop.DraftLength, ModelDrafter)]
    for i, checkout in enumerate(a.other):
        other = checkout.resolve() / "app/engine"
        controllers.append(Controller(
            checkout.name, sibling(f"app.engine._ab_draft_control{i}", other / "draft_control.py").DraftLength,
            sibling(f"app.engine.drafters._ab_draft_model{i}", other / "drafters/draft_model.py").ModelDrafter))
    controllers += [Controller(f"gap>={gap}", FixedRule(gap), ModelDrafter) for gap in a.fixed]
    prompts = load_prompts(a.prompts)
    encoded = [encode_prompt(engine, p) for p in prompts]
    greedy = SamplingParams(temperature=0.0)
    on = GenerationParams(max_tokens=a.max_tokens, sampling=greedy, draft=dp)
    off = GenerationParams(max_tokens=a.max_tokens, sampling=greedy, draft=DraftParams(draft_max=0))
    modes = [None, *controllers]
    results = {c.name: [] for c in controllers}
    for r in range(a.repeats):
        totals = {m.name if m else OFF: [0, 0.0] for m in modes}
        identical, costs = True, []
        for i, ids in enumerate(encoded):
            turn = (r * len(encoded) + i) % len(modes)
            outputs, runs = [], {}
            for mode in modes[turn:] + modes[:turn]:
                if mode:
                    mode.install(engine)
                done = _run(engine, ids, drafter if mode else OFF, on if mode else off)
                n, s = tps(done)
                t = totals[mode.name if mode else OFF]
                t[0], t[1] = t[0] + n, t[1] + s
                runs[mode.name if mode else OFF] = n / s
                outputs.append(done.token_ids)
            identical &= all(o == outputs[0] for o in outputs)
            if a.verbose:
                print(f"  {prompts[i]['category']}: " + ", ".join(
                    f"{c.name} {runs[c.name] / runs[OFF]:.2f}x" for c in controllers), flush=True)
            costs.append(engine.measure_costs(dp.draft_max, drafter))
        ceiling = Costs.mean(costs).ceiling(dp.draft_max)[0]
        plain = totals[OFF][0] / totals[OFF][1]
        line = []
        for c in controllers:
            speedup = totals[c.name][0] / totals[c.name][1] / plain
            results[c.name].append((speedup, speedup / ceiling))
            line.append(f"{c.name} {speedup:.3f}x ({speedup / ceiling:.1%})")
        print(f"repeat {r + 1}: ceiling {ceiling:.2f}x; " + ", ".join(line) + f"; identical {identical}", flush=True)
    print("medians: " + ", ".join(
        f"{name} {statistics.median(s for s, _ in rows):.3f}x ({statistics.median(f for _, f in rows):.1%} of the "
        f"ceiling)" for name, rows in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
