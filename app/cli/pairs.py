"""``specchat list / pull / remove / check``: model pairs from the command line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..engine import DRAFT_MODEL, OFF, EngineError, method_name
from ..engine.drafters import registry
from ..models import downloads, hub
from ..models.catalog import get_pair


def cmd_list(args) -> int:
    rows = downloads.rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"Catalog: {hub_note()}")
    for r in rows:
        mark = "ready" if r["ready"] else "not downloaded"
        best = ", recommended for this machine" if r["recommended"] else ""
        print(f"\n{r['pair']}  [{r['use']}, {r['released'] or 'undated'}, {mark}{best}]  {r['description']}")
        for role in ("target", "draft"):
            quant, gb, state = r[role + "_quant"], r[role + "_gb"], r[role + "_status"]
            print(f"  {role:6} {r[role]}" + (f"  {quant}  ~{gb:.2f} GB  {state}" if quant else ""))
        print(f"  context {r['context']:,}  license: {r['license']}")
        if r["images"]:
            print(f"  images: {r['images']}")
        print(f"  this machine: {r['fit']}" + (f"; {r['expected']}" if r["expected"] else ""))
    print("\nDownload a pair with: specchat pull NAME")
    return 0


def hub_note() -> str:
    return f"downloads go to {hub.cache_dir()} (HF_HUB_CACHE / HF_HOME)"


def cmd_pull(args) -> int:
    mmproj = not args.no_mmproj
    if args.hf or args.hfd:
        if args.pair or args.repo or args.file:
            raise EngineError("Give a pair name, --repo and --file, or -hf / -hfd: one of them.")
        chosen = _hub_pair(args.hf, args.hfd, out=sys.stderr)[0]
        files = [(c.repo, c.file) for c in chosen]
        # (as llama.cpp's -hf, the target's)
        if args.hf and mmproj and (proj := downloads.hf_projector(chosen[0].repo, chosen[0].file)):
            _print_choice(proj, "projector")
            files.insert(1, (proj.repo, proj.file))
    elif args.repo or args.file:
        if args.pair or not (args.repo and args.file):
            raise EngineError("Give a pair name, or --repo and --file for one GGUF file.")
        files = [(args.repo, args.file)]
    elif args.pair:
        pair = get_pair(args.pair)
        if not downloads.hub_files(pair.sources):
            print(f"{args.pair} is built in: nothing to download.")
            return 0
        files = []
        for role, c in downloads.pull_plan(pair, mmproj):  # what each tag names today
            _print_choice(c, role)
            files.append((c.repo, c.file))
        files = list(dict.fromkeys(files))
    else:
        raise EngineError("Name a pair to pull (see specchat list), or give --repo and --file.")
    bars = {}
    try:
        paths = hub.pull_files(files, on_progress=lambda p: _show(bars, p))
    finally:
        for bar in bars.values():
            bar.close()
    for path in paths:
        print(path)
    return 0


def _show(bars: dict, p: hub.Progress) -> None:
    from huggingface_hub.utils import tqdm

    bar = bars.get(p.index)
    if bar is None and not p.total:  # still being looked up (a wait for a busy Hub): no size for a bar yet
        print(f"{p.file}: {p.note}", file=sys.stderr)
        return
    if bar is None:
        bar = bars[p.index] = tqdm(total=p.total, initial=p.done, unit="B", unit_scale=True, unit_divisor=1024,
                                   desc=f"[{p.index}/{p.count}] {p.file}", dynamic_ncols=True)
    bar.update(p.done - bar.n)
    if p.note:
        bar.write(f"{p.file}: {p.note}", file=sys.stderr)


def cmd_remove(args) -> int:
    pair = get_pair(args.pair)
    freed, removed, kept = downloads.remove(pair)
    if not removed and not kept:
        print(f"Nothing of {pair.name} is downloaded.")
        return 0
    print(f"Removed {len(removed)} file(s) of {pair.name}, {freed / 1e9:.2f} GB freed.")
    for name in kept:
        print(f"Kept {name}: another downloaded pair uses it.")
    return 0


def _hub_pair(hf: str | None, hfd: str | None, out=sys.stdout) -> tuple[list, object]:
    """The chosen Hub files (target, then draft) and, with both, the pairing advice from the files' headers
    (printed first, to ``out``; None with one file). A draft of another vocabulary is not refused: it drafts as
    text, and the advice says so."""
    from ..models import discover

    if not hf:
        return [discover.choose(hfd, "draft")], None
    target = discover.choose(hf, "target")
    if not hfd:
        return [target], None
    draft = discover.choose(hfd, "draft")
    advice = discover.advise(target, draft)
    _print_choice(target, "target")
    _print_choice(draft, "draft")
    for line in advice.lines:
        print(f"  {line}", file=out)
    return [target, draft], advice


def _print_choice(c, role: str) -> None:
    shards = f", {len(c.shards)} files" if len(c.shards) > 1 else ""
    print(f"{role}: {c.repo}/{c.file}  [{c.quantization or '?'}, {c.size / 1e9:.2f} GB{shards}]", file=sys.stderr)


def cmd_search(args) -> int:
    from ..models import discover

    hits = discover.search(args.query, limit=args.limit)
    if args.json:
        print(json.dumps([{**h.__dict__, "family": h.family} for h in hits], indent=2))
        return 0
    if not hits:
        print(f"No GGUF repos match {args.query!r}.")
    for h in hits:
        params = f"{h.parameters / 1e9:.1f}B params" if h.parameters else "size unknown"
        print(f"{h.repo:60s} {h.downloads:>10,} downloads  {h.architecture or '?':10s} {params}")
    return 0


def cmd_files(args) -> int:
    from ..models import discover, hf_files

    files = discover.list_gguf(args.repo)
    if args.json:
        print(json.dumps([{**c.__dict__, "shards": list(c.shards)} for c in files], indent=2))
        return 0
    if not files:
        print(f"{args.repo} has no GGUF model files.")
    for c, note in hf_files.listed(files):
        shards = f"  ({len(c.shards)} files)" if len(c.shards) > 1 else ""
        print(f"{c.quantization or '?':8s} {c.size / 1e9:8.2f} GB  {c.file}{shards}" + (f"  ({note})" if note else ""))
    return 0


def cmd_check(args) -> int:
    from ..models.check import check_files, describe
    from ..models.loader import LoadSpec, find_projector, resolve

    if args.hf or args.hfd:
        return _check_on_hub(args.hf, args.hfd)
    if args.ctx < 0:
        raise EngineError(f"Invalid --ctx {args.ctx}: use a positive number, or 0 for the default.")
    off = args.no_mmproj
    mmproj = None if off else args.mmproj
    if args.pair:
        r = resolve(LoadSpec(pair=args.pair, mmproj=str(mmproj) if mmproj else None, no_mmproj=off))
        target, draft, mmproj = r.target, r.draft, r.mmproj
    elif args.target:
        target, draft = args.target, args.draft
        mmproj = mmproj or (None if off else find_projector(Path(target).expanduser()))
    else:
        raise EngineError("Give --pair NAME, or --target PATH with an optional --draft PATH.")
    report = check_files(target, draft, args.ctx, args.ngl, args.ngld, mmproj)
    print("\n".join(describe(report)))
    if args.measure and report.fit.ok:
        print(_measure(Path(target), Path(draft) if draft else None, args), flush=True)
    return 0 if report.fit.ok else 1  # a draft of another vocabulary drafts as text


MEASURE_PROMPTS = [
    {"prompt": "Explain in a short paragraph why the sky is blue.", "category": "explain", "chat": True},
    {"prompt": "Write a Python function that returns the n-th Fibonacci number.", "category": "code", "chat": True},
    {"prompt": "List the planets of the solar system in order, one per line.", "category": "list", "chat": True},
]


def _measure(target: Path, draft: Path | None, args) -> str:
    """Load the pair and time every method it can draft with, and each model method chained with prompt lookup, as
    ``specchat bench --drafters`` does (greedy, all against the same speculation-off runs, interleaved), rank them,
    and remember the fastest for these files: loading them again drafts with it (``--drafter`` and the app's setting
    still choose another)."""
    from ..chat.method_ranking import remember
    from ..chat.worker import WorkerEngine
    from ..models.loader import LoadSpec, resolve
    from .bench import run_bench

    if args.measure < 1:
        raise EngineError("--measure N: N new tokens per prompt, at least 1.")
    spec = LoadSpec(target=str(target), draft=str(draft) if draft else None, ctx=args.ctx, ngl=args.ngl,
                    ngld=args.ngld)
    engine = WorkerEngine(spec, resolve(spec))  # (a load or decode that crashes llama.cpp is reported, not fatal)
    if engine.notice:
        print(f"specchat: note: {engine.notice}", file=sys.stderr)
    try:
        # (a head answers to "model" and to its own name)
        head = not engine.has_draft_context and engine.draft_model is not None
        # (not earlier answers: what it drafts from is what was said before, not the pair's)
        methods = [m for m in engine.drafters if m not in (OFF, registry.SUFFIX) and not (head and m == DRAFT_MODEL)]
        methods += registry.with_lookup(methods)
        print(f"measuring {', '.join(methods)}: {len(MEASURE_PROMPTS)} prompts, {args.measure} new tokens each, "
              "greedy, against the same speculation-off runs…", file=sys.stderr, flush=True)
        reports = run_bench(engine, methods, resolve(spec).draft_params, MEASURE_PROMPTS, args.measure)
        text = " (drafted as text)" if engine.cross_vocab and DRAFT_MODEL in methods else ""
    finally:
        engine.close()
    ranking = remember(target, draft, reports)
    lines = [f"measured, fastest first{text}:"]
    width = max(len(method_name(m["drafter"])) for m in ranking.methods)
    for m in ranking.methods:
        lines.append(f"  {method_name(m['drafter']):{width}} x{m['speedup']:.2f}  acceptance {m['acceptance']:.0%}  "
                     f"output {'identical' if m['identical'] else 'DIFFERENT'} with speculation off")
    return "\n".join(lines + [f"Loading these files drafts with {ranking.why()}; --drafter chooses another."])


def _check_on_hub(hf: str | None, hfd: str | None) -> int:
    """Pairing advice before downloading: the given draft, or drafts of the target's family found on the Hub (and,
    where none shares its tokens, the catalog's drafts of other families, drafted as text), each judged by
    llama.cpp's rule on the files' headers."""
    from ..models import discover

    if not hf:
        raise EngineError("Give the target with -hf REPO[:QUANT] (and a draft with -hfd, or none for suggestions).")
    if hfd:
        return 0 if _hub_pair(hf, hfd)[1].ok else 1
    from ..models.check import own_drafting

    target = discover.choose(hf, "target")
    _print_choice(target, "target")
    info = discover.remote_info(target)
    if own := own_drafting(info):
        print(own[0].upper() + own[1:] + ".")
    judged = discover.judged_drafts(target, info=info)
    if not judged:
        print("No draft found on the Hub for this model"
              + ("." if own else "; --drafter ngram speculates without one."))
        return 0 if own else 1
    print("drafts on the Hub, checked against the target's tokenizer (headers only, nothing downloaded; "
          "OK: same tokens, TXT: drafted as text):")
    for hit, choice, advice in judged:
        source = (f"{hit.downloads:,} downloads" if hit else "in the target's repo" if choice.repo == target.repo
                  else "from the catalog")
        print(f"  {advice.mark:3} {choice.repo}:{discover.ref_tag(choice)}  {choice.size / 1e9:.2f} GB, "
              f"{source} — {advice.lines[-1]}")
    return 0 if own or any(a.ok for _, _, a in judged) else 1
