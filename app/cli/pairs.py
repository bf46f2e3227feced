"""``specchat list / pull / remove / check``: model pairs from the command line."""
from __future__ import annotations

import json
import sys

from ..models import downloads, hub
from ..models.catalog import get_pair
from ..engine import EngineError


def cmd_list(args) -> int:
    rows = downloads.rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"Catalog: {hub_note()}")
    for r in rows:
        mark = "ready" if r["ready"] else "not downloaded"
        print(f"\n{r['pair']}  [{r['use']}, {mark}]  {r['description']}")
        for role in ("target", "draft"):
            print(f"  {role:6} {r[role]}  {r[role + '_quant']}  ~{r[role + '_gb']:.2f} GB  {r[role + '_status']}")
        print(f"  context {r['context']:,}  license: {r['license']}")
        print(f"  this machine: {r['fit']}")
    print("\nDownload a pair with: specchat pull NAME")
    return 0


def hub_note() -> str:
    return f"downloads go to {hub.cache_dir()} (HF_HUB_CACHE / HF_HOME)"


def cmd_pull(args) -> int:
    if args.repo or args.file:
        if args.pair or not (args.repo and args.file):
            raise EngineError("Give a pair name, or --repo and --file for one GGUF file.")
        files = [(args.repo, args.file)]
    elif args.pair:
        files = downloads.hub_files([(p := get_pair(args.pair)).target, p.draft])
        if not files:
            print(f"{args.pair} is built in: nothing to download.")
            return 0
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


def cmd_check(args) -> int:
    from ..models.loader import LoadSpec, resolve
    from ..models.check import check_files, describe

    if args.ctx < 0:
        raise EngineError(f"Invalid --ctx {args.ctx}: use a positive number, or 0 for the default.")
    if args.pair:
        r = resolve(LoadSpec(pair=args.pair))
        target, draft = r.target, r.draft
    elif args.target:
        target, draft = args.target, args.draft
    else:
        raise EngineError("Give --pair NAME, or --target PATH with an optional --draft PATH.")
    report = check_files(target, draft, args.ctx, args.ngl, args.ngld)
    print("\n".join(describe(report)))
    return 0 if report.compatible and report.fit.ok else 1
