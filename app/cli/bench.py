"""``specchat bench``: speculation off vs on, same engine, same prompts, interleaved, greedy.

Fairness rules: one warm-up generation per mode first; off and on alternate which goes first; both KV caches are
cleared before every run, so no run profits from a cache another run left behind. Every number is measured in
this run; ratios compare runs made minutes apart at most.

Between prompts it also times the operations a round is made of (``engine.costs``): the speedup they would allow
if every draft token were accepted says how much of the possible speedup the engine reached on this machine in
this run (the host's state moves that ceiling between runs).
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path
from typing import TextIO

from ..engine import DRAFT_MODEL, OFF, Costs, Done, DraftParams, Engine, EngineError, GenerationParams, SamplingParams
from ..engine.drafters import registry
from ..engine.grammar import Grammar
from ..prompts import chat_tokens, plain_tokens


def load_prompts(path: Path) -> list[dict]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EngineError(f"Cannot read the prompts file: {exc}") from exc
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise EngineError(f'{path}:{n}: each line needs a non-empty "prompt" string')
        grammar = None
        if row.get("json_schema") is not None:  # the answer must follow this schema (off and on alike)
            try:
                grammar = Grammar.json_schema(row["json_schema"])
            except EngineError as exc:
                raise EngineError(f"{path}:{n}: {exc}") from None
        prompts.append({"prompt": row["prompt"], "category": str(row.get("category", "default")),
                        "chat": bool(row.get("chat", True)), "grammar": grammar})
    if not prompts:
        raise EngineError(f"{path} holds no prompts")
    return prompts


def _run(engine: Engine, ids: list[int], drafter: str, params: GenerationParams, state: dict | None = None) -> Done:
    """One generation from empty caches; ``state`` accumulates what recurrent models spent keeping state exact."""
    engine.reset()
    before = engine.state_costs()
    done = None
    for ev in engine.generate(ids, params, drafter):
        if isinstance(ev, Done):
            done = ev
    if state is not None:
        for role, costs in engine.state_costs().items():
            acc = state.setdefault(role, dict.fromkeys(costs, 0))
            for k, v in costs.items():
                acc[k] = v if k == "bytes" else acc[k] + v - before[role][k]
    return done


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def encode_prompt(engine: Engine, p: dict) -> list[int]:
    """A benchmark prompt's tokens: the user's message in the model's chat template, or plain text for base models."""
    return (chat_tokens(engine.model, [{"role": "user", "content": p["prompt"]}]) if p["chat"]
            else plain_tokens(engine.model, p["prompt"]))


def run_bench(engine: Engine, drafter: str | list[str], dp: DraftParams, prompts: list[dict], max_tokens: int,
              repeats: int = 1, progress: TextIO | None = None) -> dict | list[dict]:
    """The report for ``drafter``; for a list of drafters, one report each, all against the same speculation-off
    runs (every mode interleaved, the first mode rotating), so their speedups compare within one run."""
    names = [drafter] if isinstance(drafter, str) else list(drafter)
    greedy = SamplingParams(temperature=0.0)
    # Not remembered: earlier answers (suffix) must not draft from the same prompt's speculation-off run
    dp = replace(dp, remember=False)
    on_params = GenerationParams(max_tokens=max_tokens, sampling=greedy, draft=dp)
    off_params = GenerationParams(max_tokens=max_tokens, sampling=greedy, draft=DraftParams(draft_max=0,
                                                                                              remember=False))
    encoded = [encode_prompt(engine, p) for p in prompts]
    warm = GenerationParams(max_tokens=16, sampling=greedy, draft=dp)
    for name in [OFF, *names]:
        _run(engine, encoded[0], name, warm)
    costs = []
    state: dict[str, dict] = {}  # recurrent models, speculation on: snapshots, saves, restores, replays
    modes = [OFF, *names]
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for i, (p, ids) in enumerate(zip(prompts, encoded)):
        runs: dict[str, list[Done]] = {mode: [] for mode in modes}
        grammar = p.get("grammar")  # a schema: plain constrained decoding against forced tokens + drafting
        for r in range(repeats):
            turn = (i + r) % len(modes)
            for mode in modes[turn:] + modes[:turn]:
                params = replace(off_params if mode == OFF else on_params, grammar=grammar)
                runs[mode].append(_run(engine, ids, mode, params, None if mode == OFF else state))
        for name in names:
            row = prompt_row(p, runs[OFF], runs[name])
            rows[name].append(row)
            if progress:
                progress.write(f"[{i + 1}/{len(prompts)}] {row['category']}{f' {name}' * (len(names) > 1)}: off "
                               f"{row['tps_off']:.1f} tok/s, on {row['tps_on']:.1f} tok/s, x{row['speedup']:.2f}, "
                               f"acceptance {row['acceptance']:.1%}, identical {row['identical']}\n")
                progress.flush()
        costs.append(engine.measure_costs(dp.draft_max, names[0]))
    others = tuple(f"{registry.label(m)} with --drafter {m}" for m in engine.alternatives())
    reports = [_report(name, dp, rows[name], Costs.mean(costs), max_tokens, repeats, state, others,
                       engine.started_from_kept(name)) for name in names]
    return reports[0] if isinstance(drafter, str) else reports


def _report(drafter: str, dp: DraftParams, rows: list[dict], mean_costs: Costs, max_tokens: int, repeats: int,
            state: dict, others: tuple[str, ...] = (), kept: bool = False) -> dict:
    by_cat = defaultdict(list)
    for row in rows:
        by_cat[row["category"]].append(row)
    overall = _aggregate(rows)
    ceiling = None
    if drafter == DRAFT_MODEL:  # n-gram proposals come and go with the text: its ceiling is not a round's cost
        c = mean_costs.ceiling_of(dp.draft_max)
        ceiling = {"speedup": c.speedup, "draft_length": c.draft_length, "reached": overall["speedup"] / c.speedup,
                   "draft_cost": c.draft_cost, "position_cost": c.position_cost, "explanation": c.explain(others)}
    return {
        "drafter": drafter,
        "draft": {"draft_max": dp.draft_max, "draft_min": dp.draft_min, "draft_p_min": dp.draft_p_min,
                  "adaptive": dp.adaptive, "ngram": asdict(dp.ngram),
                  "started_from_kept": kept},  # (adaptive: from how its tokens fared in an earlier launch)
        "max_tokens": max_tokens,
        "repeats": repeats,
        "prompts": rows,
        "categories": {c: _aggregate(rs) for c, rs in by_cat.items()},
        "overall": overall,
        "costs": mean_costs.as_dict(),
        "ceiling": ceiling,
        "recurrent_state": _per_round(state, sum(r["_counts"][2] for r in rows)),
    }


def _per_round(state: dict[str, dict], rounds: int) -> dict | None:
    """What recurrent state cost the runs with speculation on, per round (None for attention-only pairs)."""
    if not state or not rounds:
        return None
    return {role: {"rollbacks": c["rollbacks"] / rounds, "saves": c["saves"] / rounds,
                   "restores": c["restores"] / rounds, "replayed_tokens": c["replayed"] / rounds,
                   "ms": 1e3 * c["seconds"] / rounds, "state_mib": c["bytes"] / 2**20} for role, c in state.items()}


def prompt_row(p: dict, off: list[Done], on: list[Done]) -> dict:
    """One prompt's row of a bench report: speculation off and on, their tokens/s, speedup and acceptance."""
    def tps(runs):  # total decode tokens over total decode time
        tokens = sum(max(d.stats.n_tokens - 1, 0) for d in runs)
        secs = sum(d.stats.decode_seconds for d in runs)
        return tokens / secs if secs else 0.0

    drafted = sum(d.stats.n_drafted for d in on)
    accepted = sum(d.stats.n_accepted for d in on)
    rounds = sum(d.stats.n_rounds for d in on)
    # Identity on token ids; on the text where a server reports no ids.
    diffs = [_first_difference(a.token_ids or a.text, b.token_ids or b.text) for a in off for b in on]
    first_diff = next((d for d in diffs if d is not None), None)
    return {
        "category": p["category"],
        "prompt": p["prompt"][:80],
        "n_tokens": on[0].stats.n_tokens,
        "tps_off": tps(off),
        "tps_on": tps(on),
        "speedup": tps(on) / tps(off) if tps(off) else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "mean_accepted_per_round": accepted / rounds if rounds else 0.0,
        "identical": first_diff is None,
        "first_difference_at": first_diff,
        "_decode_tokens": [sum(max(d.stats.n_tokens - 1, 0) for d in r) for r in (off, on)],
        "_runs": [len(off), len(on)],
        "_decode_seconds": [sum(d.stats.decode_seconds for d in r) for r in (off, on)],
        "_counts": [drafted, accepted, rounds],
        "_forced": [sum(d.stats.n_forced for d in on), sum(d.stats.n_forced_accepted for d in on)],
        "_grammar_seconds": [sum(d.stats.grammar_seconds for d in r) for r in (off, on)],
        "_split": [sum(d.stats.draft_seconds for d in on), sum(d.stats.verify_seconds for d in on)],
        "_reported": [all(d.stats.reported(f) for d in on) for f in ("n_drafted", "n_rounds")],
        "by_drafter": _by_drafter([d.stats.by_drafter for d in on]),
    }


def _by_drafter(parts: list[dict]) -> dict:
    """A chain's members over several runs: rounds each drafted, its tokens verified and accepted."""
    out: dict[str, dict] = {}
    for part in parts:
        for name, counts in part.items():
            acc = out.setdefault(name, {"rounds": 0, "drafted": 0, "accepted": 0})
            for key, v in zip(acc, counts.values() if isinstance(counts, dict) else counts):
                acc[key] += v
    return out


def remote_report(table: list[dict], max_tokens: int, repeats: int, where: dict) -> dict:
    """The report of a bench against servers from its rows (``prompt_row`` per prompt). No costs or ceiling (the
    server's internals are not timed from here); acceptance and rounds only where the server reported them (None,
    not 0, where it did not: llama-server reports no rounds, TGI no drafted count). ``method`` (the server's, or the
    person's label) keeps reports of different methods apart."""
    by_cat = defaultdict(list)
    for row in table:
        by_cat[row["category"]].append(row)
    categories = {c: _aggregate(rs) for c, rs in by_cat.items()}
    overall = _aggregate(table)
    reported = {"acceptance": all(r["_reported"][0] for r in table),
                "mean_accepted_per_round": all(r["_reported"][1] for r in table)}
    for figures in (*table, *categories.values(), overall):
        figures.update({k: None for k, ok in reported.items() if not ok})
    return {"drafter": "server", "method": where["method"], "server": where, "draft": None, "max_tokens": max_tokens,
            "repeats": repeats, "prompts": table, "categories": categories, "overall": overall, "costs": None,
            "ceiling": None}


def _aggregate(rows: list[dict]) -> dict:
    tok_off = sum(r["_decode_tokens"][0] for r in rows)
    tok_on = sum(r["_decode_tokens"][1] for r in rows)
    s_off = sum(r["_decode_seconds"][0] for r in rows)
    s_on = sum(r["_decode_seconds"][1] for r in rows)
    drafted = sum(r["_counts"][0] for r in rows)
    accepted = sum(r["_counts"][1] for r in rows)
    rounds = sum(r["_counts"][2] for r in rows)
    tps_off = tok_off / s_off if s_off else 0.0
    tps_on = tok_on / s_on if s_on else 0.0
    ms = 1e3 / tok_on if tok_on else 0.0  # per decoded token of the runs with speculation on
    return {
        "n_prompts": len(rows),
        "tps_off": tps_off,
        "tps_on": tps_on,
        "speedup": tps_on / tps_off if tps_off else 0.0,
        "min_speedup": min(r["speedup"] for r in rows),
        "acceptance": accepted / drafted if drafted else 0.0,
        "mean_accepted_per_round": accepted / rounds if rounds else 0.0,
        "all_identical": all(r["identical"] for r in rows),
        "ms_per_token_off": 1e3 / tps_off if tps_off else 0.0,
        "ms_per_token_on": 1e3 / tps_on if tps_on else 0.0,
        "draft_ms_per_token": ms * sum(r["_split"][0] for r in rows),
        "verify_ms_per_token": ms * sum(r["_split"][1] for r in rows),
        # under a schema: draft tokens the grammar forced, and the time in the grammar per token made
        "forced": sum(r["_forced"][0] for r in rows),
        "forced_accepted": sum(r["_forced"][1] for r in rows),
        "grammar_us_per_token_off": _per_token_us(rows, 0),
        "grammar_us_per_token_on": _per_token_us(rows, 1),
        "by_drafter": _by_drafter([r.get("by_drafter") or {} for r in rows]),
    }


def _per_token_us(rows: list[dict], mode: int) -> float:
    tokens = sum(r["_decode_tokens"][mode] + r["_runs"][mode] for r in rows)
    secs = sum(r["_grammar_seconds"][mode] for r in rows)
    return 1e6 * secs / tokens if tokens else 0.0


def print_report(report: dict) -> None:
    d = report["draft"]
    if d:
        print(f"drafter {report['drafter']}, draft-max {d['draft_max']}, draft-min {d['draft_min']}, "
              f"draft-p-min {d['draft_p_min']}, adaptive {d['adaptive']}, {report['max_tokens']} new tokens, greedy")
        if d["adaptive"] and d.get("started_from_kept"):
            print("adaptive drafting started from how this drafter's tokens fared on this pair in earlier launches "
                  "(acceptance.json in the data folder; without it, from the drafter's priors)")
    else:
        w = report["server"]
        print(f"server {w['on']} ({w['engine']}, model {w['model']}, speculation {w['method']}), speculation off: "
              f"{w['off']}; {report['max_tokens']} new tokens, greedy; acceptance from the server's figures, tokens/s "
              "measured here, identity on the text")
    header = f"{'':28} {'tok/s off':>9} {'tok/s on':>9} {'speedup':>8} {'accept':>7} {'acc/rnd':>7}  identical"
    print(header)
    line = "{:28.28} {:9.1f} {:9.1f} {:7.2f}x {:>7} {:>7}  {}"
    accept = lambda v: "—" if v is None else f"{v:.1%}"  # noqa: E731  — : not reported by the server
    per_round = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for r in report["prompts"]:
        unit = "character" if report["drafter"] == "server" else "token"
        ident = "yes" if r["identical"] else f"NO ({unit} {r['first_difference_at']})"
        print(line.format(r["category"] + ": " + r["prompt"], r["tps_off"], r["tps_on"], r["speedup"],
                          accept(r["acceptance"]), per_round(r["mean_accepted_per_round"]), ident))
    print("per category:")
    for name, c in list(report["categories"].items()) + [("OVERALL", report["overall"])]:
        print(line.format(f"{name} ({c['n_prompts']})", c["tps_off"], c["tps_on"], c["speedup"],
                          accept(c["acceptance"]), per_round(c["mean_accepted_per_round"]),
                          "yes" if c["all_identical"] else "NO") + f"   min speedup {c['min_speedup']:.2f}x")
    o = report["overall"]
    for name, c in (o.get("by_drafter") or {}).items():
        print(f"  {name}: drafted in {c['rounds']} rounds, {c['accepted']} of its {c['drafted']} tokens accepted")
    if not report["costs"]:
        print(f"time per token: off {o['ms_per_token_off']:.1f} ms; on {o['ms_per_token_on']:.1f} ms")
        return
    print(f"time per token: off {o['ms_per_token_off']:.1f} ms; on {o['ms_per_token_on']:.1f} ms "
          f"(drafting {o['draft_ms_per_token']:.1f}, verifying {o['verify_ms_per_token']:.1f})")
    verify, draft = report["costs"]["verify_ms"], report["costs"].get("draft_ms")
    batches = [n for n in verify if n > 1]
    line = (f"costs timed between prompts: plain step {verify[1]:.1f} ms; verifying "
            + "/".join(map(str, batches)) + " tokens " + "/".join(f"{verify[n]:.1f}" for n in batches) + " ms")
    if draft:
        line += f"; drafting 1/2 tokens {draft[1]:.1f}/{draft[2]:.1f} ms"
    print(line)
    if o.get("grammar_us_per_token_off"):
        print(f"under the schemas: {o['forced']} of the draft tokens forced by the grammar ({o['forced_accepted']} "
              f"accepted); time in the grammar {o['grammar_us_per_token_off']:.0f} µs a token off, "
              f"{o['grammar_us_per_token_on']:.0f} µs on (masks, checks, forced tokens)")
    if report["ceiling"]:
        cl = report["ceiling"]
        print(f"ceiling if every draft token were accepted: {cl['speedup']:.2f}x with {cl['draft_length']} draft "
              f"tokens per round; this run reached {cl['reached']:.0%} of it")
        print(cl["explanation"])
    for role, c in (report.get("recurrent_state") or {}).items():
        print(f"recurrent state of the {role} ({c['state_mib']:.2f} MiB), per round: {c['rollbacks']:.2f} snapshot "
              f"rollbacks, {c['saves']:.2f} saves, {c['restores']:.2f} restores, {c['replayed_tokens']:.2f} tokens "
              f"replayed, {c['ms']:.3f} ms copying state")


def print_comparison(reports: list[dict]) -> None:
    """Several drafters benched against the same speculation-off runs: their speedups side by side."""
    cats = list(reports[0]["categories"])
    print("\ncompared within this run (the same speculation-off runs for all):")
    print(f"{'drafter':32} {'overall':>8} {'min':>6} " + " ".join(f"{c[:10]:>10}" for c in cats) + "  identical")
    for r in reports:
        o = r["overall"]
        print(f"{r['drafter'][:32]:32} {o['speedup']:7.2f}x {o['min_speedup']:5.2f}x "
              + " ".join(f"{r['categories'][c]['speedup']:9.2f}x" for c in cats)
              + f"  {'yes' if o['all_identical'] else 'NO'}")


def summary_line(stats) -> str:
    """One answer's figures on a line: tokens, tokens/s, the drafter, acceptance, first token, a chain's members."""
    return (
        f"[{stats.n_tokens} tokens, {stats.tokens_per_second:.1f} tok/s, drafter {stats.drafter}, "
        f"acceptance {stats.acceptance_rate:.1%} ({stats.n_accepted}/{stats.n_drafted}), "
        f"{stats.mean_accepted_per_round:.2f} accepted/round, first token {stats.time_to_first_token_s * 1000:.0f} ms"
        + (f", {stats.n_forced} forced by the grammar" if stats.n_forced else "") + by_drafter(stats) + "]"
    )


def by_drafter(stats) -> str:
    """A chain's members: the rounds each drafted and the tokens each had accepted."""
    return "".join(f"; {name}: {r} rounds, {a}/{d} accepted" for name, (r, d, a) in stats.by_drafter.items())
