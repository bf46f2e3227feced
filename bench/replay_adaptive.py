"""Benchmark tool (not a test): replay adaptive drafting on a recorded pair, without the host's noise.

Real runs of adaptive drafting on this 2-core host differ by more than most controller changes do: the starter's
ceiling moved between 1.08x and 1.67x across runs of one evening, and which of two versions won flipped with it.
This tool separates the two. ``record`` takes, for each prompt, the target's greedy answer and the draft model's
greedy chain of up to 16 tokens at every position of it (each token with its logit gap, the controller's signal,
and whether --draft-p-min lets it through), and times the round's operations once, as a round meets them
(verification batches of 1 to 17 tokens right after draft calls, a draft step, a round's first draft call catching
up on n tokens right after a batch; a plain step after a plain step). ``replay`` runs the real ``DraftLength`` of the
checkout given over that recording: every round drafts along the chain as ``ModelDrafter.propose`` does (the
controller takes, looks further, stops), the target accepts up to the first token off its answer, and each
operation costs its recorded time times seeded noise (--sigma). Answers follow one another with one ``Measured``,
as in ``specchat bench``. The same recording replayed by two checkouts compares their controllers on the same
text and costs; --draft-scale scales the draft's costs, to try a spell the host was not in, and --spell replays the
answers after such a spell has passed (whatever the controller carried from it, it carries into them).

It prints the ceiling (every draft token accepted, at the recorded costs), the speedup of each seed's replay and
their median share of the ceiling; with -v, each answer's speedup and a reference the controller cannot know in
advance: the best gap threshold and cap for the whole recording, chosen in hindsight. Claims still come from
measured runs (``specchat bench``, ``perf_adaptive_pairs.py``); this is for deciding what to measure.

    python bench/replay_adaptive.py record OUT.json [--pair starter | -m T.gguf -md D.gguf] [--prompts P] [-n 128]
                                                    [-t THREADS]
    python bench/replay_adaptive.py replay OUT.json [--code CHECKOUT] [--seeds 7] [--sigma 0.05]
                                                    [--draft-scale 1.0] [--spell S] [--relaunch] [-v] [--trace N]
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAIN = 16  # draft tokens recorded at each position: the longest round replayed
LONG_BATCHES = (24, 32, 48, 65)  # batches timed besides, for lookups' longer drafts (replay_chain.py)
BETWEEN_S = 0.0004  # the loop's own work between two rounds (draft_control's ``between``, about this on the starter)


def record(out: Path, model_args: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from perf_share_bound import greedy_answer

    from app.cli.bench import encode_prompt, load_prompts
    from app.cli.main import build_engine, build_parser
    from app.engine.drafters.draft_model import catch_up
    from app.engine.sampling import draft_pick

    args = build_parser().parse_args(["bench", *model_args])
    engine, _, dp = build_engine(args)
    draft = engine.draft.ctx
    answers = []
    for p in load_prompts(args.prompts):
        ids = encode_prompt(engine, p)
        engine.reset()
        answer = greedy_answer(engine, ids, args.max_tokens)
        chains = []
        for pos in range(len(answer)):  # the round after answer[pos] was chosen drafts from here
            catch_up(draft, ids + answer[: pos + 1])
            chain = []
            for i in range(CHAIN):
                token, passes, gap = draft_pick(draft.logits(-1), dp.draft_p_min)
                chain.append([int(token), bool(passes), round(float(gap), 4)])
                if i + 1 < CHAIN:
                    draft.decode([token], n_logits=1, n_speculative=1)
            chains.append(chain)
        answers.append({"category": p.get("category", ""), "prompt": ids, "answer": answer, "chains": chains})
        print(f"recorded {p.get('category', '')}: {len(answer)} tokens", file=sys.stderr, flush=True)
    engine.reset()
    costs = round_costs(engine.target.ctx, draft)
    engine.reset()
    out.write_text(json.dumps({"threads": engine.target.ctx.n_threads, "draft_p_min": dp.draft_p_min,
                               "answers": answers, **costs}))
    print(f"wrote {out}: plain step {costs['verify_s'][1] * 1e3:.1f} ms, draft step {costs['draft_s'] * 1e3:.1f} ms, "
          f"{engine.target.ctx.n_threads} threads", file=sys.stderr)


def round_costs(target, draft, reps: int = 5, position: int = 128) -> dict:
    """Each operation's median time as a speculative round meets it: a plain step after a plain step; a draft call
    catching up on n tokens; a draft call that follows one; a verification batch right after draft calls, and a
    round's first draft call right after a batch (each pays for its model's weights coming back into the caches:
    on the starter at one thread, 6 ms more for the first call than alone)."""
    scratch = [(7 + 13 * i) % min(target.model.n_vocab, draft.model.n_vocab) for i in range(position + 80)]
    for ctx in (target, draft):
        ctx.decode(scratch[ctx.reuse_prefix(scratch[:position]):position], n_logits=0)

    def timed(ctx, n: int) -> float:
        t0 = time.perf_counter()
        ctx.decode(scratch[position:position + n], n_logits=1, n_speculative=n)
        return time.perf_counter() - t0

    plain, step, catch, verify, first = [], [], {}, {}, []
    for _ in range(reps):
        for n in (1, 2, 4, 8, 16, 32, 64):  # the draft alone, warm: its catching up on n tokens
            timed(draft, n)
            draft.truncate(position)
            catch.setdefault(n, []).append(timed(draft, n))
            draft.truncate(position)
        timed(target, 1)
        target.truncate(position)
        plain.append(timed(target, 1))
        target.truncate(position)
        for n in range(2, CHAIN + 2):  # rounds: a first call, three more, then the batch
            first.append(timed(draft, 2))
            for i in range(3):
                t0 = time.perf_counter()
                draft.decode([scratch[position + 2 + i]], n_logits=1, n_speculative=1)
                step.append(time.perf_counter() - t0)
            draft.truncate(position)
            verify.setdefault(n, []).append(timed(target, n))
            target.truncate(position)
        for n in LONG_BATCHES:  # (after a draft call, as a round meets them)
            timed(draft, 2)
            draft.truncate(position)
            verify.setdefault(n, []).append(timed(target, n))
            target.truncate(position)
    med = statistics.median
    return {"verify_s": {1: med(plain), **{n: med(t) for n, t in verify.items()}}, "draft_s": med(step),
            "catch_up_s": {n: med(t) for n, t in catch.items()}, "first_extra_s": med(first) - med(catch[2])}


class Recording:
    def __init__(self, path: Path, draft_scale: float):
        r = json.loads(path.read_text())
        self.answers, self.p_min = r["answers"], r["draft_p_min"]
        self.verify = {int(n): s for n, s in r["verify_s"].items()}
        self._draft = r["draft_s"], r["catch_up_s"], r.get("first_extra_s", 0.0)
        self.scale_draft(draft_scale)

    def scale_draft(self, scale: float) -> None:
        """The draft's costs: as recorded times ``scale`` (a spell the host was not in)."""
        step, catch, first_extra = self._draft
        self.draft_scale = scale
        self.t_draft = step * scale
        self.catch = sorted((int(n), s * scale) for n, s in catch.items())
        self.first_extra = first_extra * scale  # a round's first call, after a batch

    def batch(self, n: int) -> float:
        """A verification batch of n tokens: as timed, or linear between the sizes timed."""
        if n in self.verify:
            return self.verify[n]
        sizes = sorted(self.verify)
        hi = next((m for m in sizes if m > n), sizes[-1])
        lo = max(m for m in sizes if m < hi)
        return self.verify[lo] + (self.verify[hi] - self.verify[lo]) * (n - lo) / (hi - lo)

    def catch_up(self, n: int) -> float:
        """A round's first draft call, evaluating n tokens: linear between the sizes timed, and past the last."""
        pts = self.catch
        i = next((j for j in range(1, len(pts)) if n <= pts[j][0]), len(pts) - 1)
        (n0, s0), (n1, s1) = pts[i - 1], pts[i]
        return (s0 + (s1 - s0) * (n - n0) / (n1 - n0) if n > n0 else s0) + self.first_extra

    def ceiling(self) -> float:
        plain = self.verify[1] + BETWEEN_S
        # (after a round accepted whole, the first call catches up on two tokens: the last draft token and the bonus)
        return max((k + 1) / (self.catch_up(2) + (k - 1) * self.t_draft + self.verify[k + 1] + BETWEEN_S)
                   for k in range(1, CHAIN + 1)) * plain


class FixedRule:
    """A draft-length policy without memory: draft while the logit gap is at least ``gap``, at most ``k_max`` tokens
    (the controller's interface: next, take, look_further, update)."""

    def __init__(self, gap: float, k_max: int):
        self.gap, self.k_max = gap, k_max

    def next(self, room: int | None = None) -> int:
        return self.k_max

    def take(self, signal: float) -> bool:
        return signal >= self.gap

    def look_further(self) -> bool:
        return True

    def update(self, *args, **kwargs) -> None:
        pass


def draft_along(rec: Recording, chain: list, n_max: int, n_first: int, gate, cost) -> tuple:
    """``ModelDrafter.propose``, greedy, along a recorded chain (gated where ``gate`` is given): the tokens taken,
    their signals, the draft calls made, the first call's seconds (catching up on ``n_first`` tokens) and all the
    calls' seconds, each at ``cost(recorded seconds)``, and whether it ended at a token --draft-p-min turned down."""
    first_s, evals, tokens, signals, unsure = cost(rec.catch_up(n_first)), 1, [], [], False
    for i, (token, passes, gap) in enumerate(chain[:n_max]):
        if not passes or (gate is not None and not gate.take(gap)):
            unsure = not passes
            break  # (the call that showed this token is paid)
        tokens.append(token)
        signals.append(gap)
        if i + 1 == n_max or (gate is not None and not gate.look_further()):
            break
        evals += 1
    return tokens, signals, evals, first_s, first_s + sum(cost(rec.t_draft) for _ in range(evals - 1)), unsure


def takes_keyword(fn, name: str) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def ask(control, room: int) -> int:
    """``control.next``, told the answer's room where the checkout's takes it (older ones do not)."""
    return control.next(room) if inspect.signature(control.next).parameters else control.next()


class Clock:
    """The replay's time, for the controller's timers (``Measured.MEMORY_S``): the seconds its rounds took, and the
    plain runs beside them (as ``specchat bench`` interleaves them)."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def install(self, dc) -> None:
        """Be the clock of the checkout's ``draft_control`` (``dc``) and of the modules it times with."""
        for module in (dc, sys.modules.get("app.engine.measured")):
            if module is not None and hasattr(module, "time"):
                module.time = self


def run(rec: Recording, make_control, cost, clock: Clock | None = None) -> tuple[float, list[float]]:
    """One pass over the recorded answers, a control from ``make_control()`` per answer, each operation at
    ``cost(recorded seconds)``; returns the speedup over plain decoding at the same costs, overall and per answer.
    ``clock``, where given, advances by every round's seconds and each answer's plain run."""
    clock = clock or Clock()
    on = off = 0.0
    per = []
    for a in rec.answers:
        answer, chains = a["answer"], a["chains"]
        control = make_control()
        told = takes_keyword(control.update, "unsure")  # (older checkouts' controllers are not told)
        pos, cached, seconds, first_round = 0, 0, 0.0, True  # cached: answer tokens the draft context holds
        while pos + 1 < len(answer):
            room = len(answer) - 1 - pos
            n_max = min(ask(control, room), room)
            tokens, signals, evals, first_s, n_first, draft_s, unsure = [], [], 0, 0.0, 0, 0.0, False
            if n_max > 0:
                n_first = max(pos + 1 - cached, 1)  # catch_up: the tokens made since, or the last one again
                tokens, signals, evals, first_s, draft_s, unsure = draft_along(rec, chains[pos], n_max, n_first,
                                                                               control, cost)
            accepted = next((i for i, t in enumerate(tokens) if t != answer[pos + 1 + i]), len(tokens))
            if evals:  # the draft context keeps what it decoded that the target accepted
                cached = pos + 1 + min(accepted, evals - 1)
            verify_s, between_s = cost(rec.verify[len(tokens) + 1]), cost(BETWEEN_S)
            control.update(len(tokens), accepted, draft_s, verify_s, signals or None, evals, first_s, n_first,
                           None, None if first_round else between_s, **({"unsure": True} if unsure and told else {}))
            seconds += draft_s + verify_s + between_s
            clock.now += draft_s + verify_s + between_s
            pos, first_round = pos + accepted + 1, False
        plain = sum(cost(rec.verify[1]) + cost(BETWEEN_S) for _ in range(len(answer) - 1))
        clock.now += plain
        per.append(plain / seconds)
        on, off = on + seconds, off + plain
    return off / on, per


def replay(rec: Recording, dc, drafter, seed: int, sigma: float, trace: int | None = None,
           spell: float | None = None, relaunch: bool = False, measured=None) -> tuple[float, list[float]]:
    """The checkout's adaptive controller over the recording, one ``Measured`` for every answer, each operation's
    time with seeded log-normal noise; the rounds of answer ``trace`` (its index) printed. With ``spell``, the
    answers are first replayed with the draft's costs times ``spell``, and what follows that spell is returned; with
    ``relaunch``, what follows a launch that answered them all: a fresh ``Measured`` from that launch's kept
    profile, as the app's next launch starts (``Measured.adopt``)."""
    rng = random.Random(seed)
    measured = measured or dc.Measured()
    if relaunch:
        replay(rec, dc, drafter, seed + 1000, sigma, spell=spell, measured=(first := dc.Measured()))
        measured.adopt(json.loads(json.dumps(first.profile())))
        spell = None
    params = dc.DraftParams(draft_max=CHAIN, draft_p_min=rec.p_min, adaptive=True)
    answer = iter(range(len(rec.answers)))
    kinds = {trace: traced(dc.DraftLength)}
    cost = lambda s: s * math.exp(rng.gauss(0.0, sigma))  # noqa: E731
    clock = Clock()
    clock.install(dc)
    if spell is not None:
        scale = rec.draft_scale
        rec.scale_draft(scale * spell)
        run(rec, lambda: dc.DraftLength(params, drafter.SIGNAL_EDGES, drafter.SIGNAL_PRIOR, measured), cost, clock)
        rec.scale_draft(scale)
    return run(rec, lambda: kinds.get(next(answer), dc.DraftLength)(params, drafter.SIGNAL_EDGES,
                                                                     drafter.SIGNAL_PRIOR, measured), cost, clock)


def traced(control: type) -> type:
    """A controller class that prints each round it controls: the most tokens it asked for, those drafted and
    accepted, the round's milliseconds, what kind of round (a measure, a long look, a probe: the controller's own
    flags, where the checkout has them) and the drafted tokens' signals."""
    class Traced(control):
        def next(self, *room) -> int:
            self.asked = ask(super(), *room) if room else super().next()
            return self.asked

        def update(self, n_drafted, n_accepted, draft_s, verify_s, signals=None, *rest, **kw) -> None:
            mode = getattr(getattr(self, "_mode", None), "value", None)  # (Round; older checkouts: four flags)
            flag = lambda name: getattr(self, name, False)  # noqa: E731
            kind = ({"probe": "probe", "long look": "look", "measure": "measure", "recheck": "measure"}.get(mode, "")
                    if mode else "probe" if flag("_probing") else "look" if flag("_looking")
                    else "measure" * flag("_measuring"))
            print(f"  {self.asked:2} asked, {n_drafted:2} drafted, {n_accepted:2} accepted, "
                  f"{(draft_s + verify_s) * 1e3:6.1f} ms {kind:7} " + " ".join(f"{g:.1f}" for g in signals or []))
            super().update(n_drafted, n_accepted, draft_s, verify_s, signals, *rest, **kw)
    return Traced


def hindsight(rec: Recording) -> tuple[float, float | None, int]:
    """(speedup, gap threshold, cap) of the best fixed rule (FixedRule), or of never drafting (G None), chosen
    knowing the whole recording, at its costs without noise."""
    best: tuple[float, float | None, int] = (1.0, None, 0)
    for g in (0.0, 0.1, 0.15, 0.25, 0.3, 0.5, 1.0, 2.0):  # (the draft model's signal bucket edges among them)
        for k_max in (4, 8, 12, 16):
            speedup, _ = run(rec, lambda: FixedRule(g, k_max), lambda s: s)
            if speedup > best[0]:
                best = (speedup, g, k_max)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record a pair's chains and costs (other options as specchat bench takes them)")
    r.add_argument("out", type=Path)
    p = sub.add_parser("replay", help="replay a checkout's controller on a recording")
    p.add_argument("recording", type=Path)
    p.add_argument("--code", type=Path, default=ROOT, help="the checkout whose draft_control replays (default: this)")
    p.add_argument("--seeds", type=int, default=7)
    p.add_argument("--sigma", type=float, default=0.05, help="log-normal noise on every operation's time")
    p.add_argument("--draft-scale", type=float, default=1.0, help="scale the draft's costs (another spell)")
    p.add_argument("--spell", type=float, metavar="S",
                   help="replay the answers after a spell: first with the draft's costs x S, one Measured throughout")
    p.add_argument("--relaunch", action="store_true",
                   help="replay the answers in a second launch, from what the first kept (the app's next launch)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--trace", type=int, metavar="N", help="print each round of answer N (from 0) in the first seed")
    a, rest = ap.parse_known_args()
    if a.cmd == "record":
        record(a.out, rest or ["--pair", "starter", "--prompts", str(ROOT / "tests/prompts/heldout.jsonl")])
        return 0
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    sys.path.insert(0, str(a.code.resolve()))
    dc = importlib.import_module("app.engine.draft_control")
    drafter = importlib.import_module("app.engine.drafters.draft_model").ModelDrafter
    rec = Recording(a.recording, a.draft_scale)
    ceiling = rec.ceiling()
    if a.trace is not None:
        print(f"answer {a.trace} ({rec.answers[a.trace]['category']}), seed 0: each round")
    runs = [replay(rec, dc, drafter, seed, a.sigma, a.trace if seed == 0 else None, a.spell, a.relaunch)
            for seed in range(a.seeds)]
    speedups = sorted(s for s, _ in runs)
    median = statistics.median(speedups)
    print(f"{a.code}: ceiling {ceiling:.3f}x; adaptive {' '.join(f'{s:.3f}' for s in speedups)}x; "
          f"median {median:.3f}x, {median / ceiling:.1%} of the ceiling")
    if a.verbose:
        cats = [x["category"][:8] for x in rec.answers]
        for seed, (_, per) in enumerate(runs):
            print(f"  seed {seed}: " + " ".join(f"{c} {s:.2f}" for c, s in zip(cats, per)))
        s, g, k = hindsight(rec)
        rule = "never draft" if g is None else f"draft while the gap is at least {g} (at most {k} tokens)"
        print(f"  in hindsight, the best fixed rule: {rule}: {s:.3f}x, {s / ceiling:.1%} of the ceiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
