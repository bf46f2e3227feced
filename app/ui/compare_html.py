"""Compare's HTML: the summary (speedup, acceptance, the identical-output check, the ceiling, a busy machine), each
side's pane, the runs' table and chart. render.py draws the rest of the page."""
from __future__ import annotations

import html

from ..chat.machine_load import busy_warning
from ..engine import method_name
from .render import NOT_REPORTED, acceptance, pct, per_round, prompt_reading, rate

CHART_RUNS = 20  # the newest runs in Compare's chart (the table has them all)


def bar_chart(rows: list[dict], w: int = 420, h: int = 140) -> str:
    """Speedup of each of the newest comparison runs, labelled by run number, with the 1× line (no gain) named."""
    rows = rows[-CHART_RUNS:]
    if not rows:
        return ""
    values = [r["speedup"] for r in rows]
    top = max(max(values), 1.0) * 1.15
    bw = min(40.0, (w - 60) / len(values))
    base = h - 16
    bars, labels = [], []
    for i, (v, r) in enumerate(zip(values, rows)):
        bh = (base - 14) * v / top
        x = 10 + i * bw
        cls = "win" if v >= 1 else "loss"
        bars.append(f'<rect class="{cls}" x="{x + 3:.1f}" y="{base - bh:.1f}" width="{bw - 6:.1f}" height="{bh:.1f}"/>')
        labels.append(f'<text x="{x + bw / 2:.1f}" y="{base - bh - 3:.1f}" text-anchor="middle">{v:.2f}×</text>'
                      f'<text x="{x + bw / 2:.1f}" y="{h - 3}" text-anchor="middle" class="run">'
                      f'#{r.get("run", i + 1)}</text>')
    one = base - (base - 14) / top
    return (f'<svg class="spec-bars" viewBox="0 0 {w} {h}" role="img" aria-label="speedup per run">'
            f'{"".join(bars)}<line x1="6" x2="{w - 62}" y1="{one:.1f}" y2="{one:.1f}" class="one"/>'
            f'<text x="{w - 4}" y="{one + 3:.1f}" text-anchor="end" class="one">1× no gain</text>'
            f'{"".join(labels)}</svg>')


def compare_summary(cmp) -> str:
    """Speedup, acceptance, tokens/s of each run, and the identical-output check; a warning where other programs
    kept the machine busy, shown from the start and again with the results."""
    before = busy_warning(cmp.busy_before, None, cmp.cores)
    warn = f'<div class="busy" data-busy="{cmp.busy_before:.2f}">{html.escape(before)}</div>' if before else ""
    if cmp.phase == "ceiling":
        return f'<div class="spec-compare running">Timing what this pair can reach here…{warn}</div>'
    if cmp.phase != "done":
        live = getattr(cmp, cmp.phase)
        reading = prompt_reading(live.prompt) if not live.stats.n_tokens else ""
        return f'<div class="spec-compare running">Running speculation {cmp.phase}…{reading}{warn}</div>'
    if not cmp.finished:
        return '<div class="spec-compare">Stopped before both runs finished.</div>'
    unit = "character" if cmp.by_text else "token"
    if not cmp.same_tokens:
        check = '<span class="na">sampled (temperature &gt; 0) by a server: outputs follow the same distribution, ' \
                'not the same tokens</span>'
    else:
        diff = cmp.first_difference()
        check = (f'<span class="same">outputs identical{" (compared as text)" if cmp.by_text else ""}</span>'
                 if diff is None else f'<span class="differ">outputs differ at {unit} {diff}</span>')
    off, on = cmp.off.stats, cmp.on.stats
    note = f'<div class="note">{html.escape(cmp.note)}</div>' if cmp.note else ""
    if busy := busy_warning(cmp.busy_before, cmp.busy_during, cmp.cores):
        note += f'<div class="busy" data-busy="{max(cmp.busy_before or 0, cmp.busy_during or 0):.2f}">' \
                f'{html.escape(busy)}</div>'
    return (
        f'<div class="spec-compare" data-speedup="{cmp.speedup:.3f}">'
        f'<div class="speedup">{cmp.speedup:.2f}× <small>speedup</small></div>'
        f'<div class="row">off {off.tokens_per_second:.1f} tok/s → on {on.tokens_per_second:.1f} tok/s · '
        f'acceptance {acceptance(on)} · {per_round(on)} accepted/round · '
        f'{html.escape(method_name(cmp.drafter))}</div><div class="check">{check}</div>{_ceiling(cmp)}{note}</div>'
    )


def ceiling_shown(cmp) -> float | None:
    """The ceiling Compare shows: the estimate from costs timed after the runs, never below the speedup the runs
    measured (a measured speedup is reachable by definition; an estimate under it was timed on a slower moment)."""
    return None if cmp.ceiling is None else max(cmp.ceiling.speedup, cmp.speedup)


def _ceiling(cmp) -> str:
    """What the pair can reach here, timed after the runs, and the share of it this comparison reached; where the
    runs beat the estimate, that, and why, instead of a bound the same page contradicts."""
    c = cmp.ceiling
    if c is None:
        return ""
    if cmp.speedup > c.speedup:
        estimate = f"at most {c.speedup:.2f}x" if c.pays else "no gain"
        return (f'<div class="ceiling beaten" data-ceiling="{ceiling_shown(cmp):.3f}">This comparison measured '
                f'{cmp.speedup:.2f}x, more than the costs timed just after it allow ({estimate}: '
                f'{html.escape(c.why)}). Those costs were timed on a slower or busier moment than the runs had: '
                'the measured speedup is the one to go by.</div>')
    if not c.pays:
        advice = html.escape(c.explain(cmp.others)) + " (Drafter, in the Settings tab)"
        return f'<div class="ceiling cannot" data-ceiling="{c.speedup:.3f}">{advice}</div>'
    return (f'<div class="ceiling" data-ceiling="{c.speedup:.3f}">{html.escape(c.explain())} This comparison '
            f'reached {cmp.speedup / c.speedup:.0%} of it.</div>')


def compare_pane(cmp, side: str) -> str:
    """One side of Compare as markdown: its title with tokens/s (live while it runs), then its output; where the two
    should be the same (greedy, or sampled with one seed), the first token where they part is marked on both sides."""
    live = getattr(cmp, side)
    title = "Speculation off" if side == "off" else f"Speculation on ({html.escape(method_name(cmp.drafter))})"
    if live.stats.n_tokens:
        title += f" — {rate(live.stats)} tok/s"
    text = live.text
    span = cmp.diff_spans[0 if side == "off" else 1] if cmp.diff_spans else None
    if span:
        a, b = span
        text = (text[:a] + f'<mark class="first-diff" title="first token that differs">'
                f'{html.escape(text[a:b]) or "⏎"}</mark>' + text[b:])
    return f"**{title}**\n\n{text}"


COMPARE_COLUMNS = ["run", "backend", "prompt", "drafter", "tokens", "tok/s off", "tok/s on", "speedup", "ceiling",
                   "acceptance", "identical"]
COMPARE_WIDTHS = ["5%", "9%", "24%", "11%", "6%", "7%", "7%", "7%", "7%", "9%", "8%"]


def compare_table(rows: list[dict]) -> list[list]:
    """The runs as Compare's table shows them, in the page's formats (speedups as 1.11×, shares as 98.9%); the
    exports keep the numbers."""
    def cell(key: str, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return f"{v:.2f}×" if key in ("speedup", "ceiling") else pct(v) if key == "acceptance" else \
            f"{v:.1f}" if key.startswith("tok/s") else v
    return [[cell(k, r.get(k, "")) for k in COMPARE_COLUMNS] for r in rows]


def compare_row(cmp, n: int, backend: str) -> dict:
    """One line of Compare's history. ``backend`` (the pair, or model @ server) and the drafter (for a server, its
    method) keep results of different methods apart."""
    diff = cmp.first_difference() if cmp.same_tokens else None
    on = cmp.on.stats
    unit = "character" if cmp.by_text else "token"
    return {
        "run": n, "backend": backend, "prompt": cmp.prompt[:80], "drafter": method_name(cmp.drafter),
        "tokens": on.n_tokens, "tok/s off": round(cmp.off.stats.tokens_per_second, 2),
        "tok/s on": round(on.tokens_per_second, 2), "speedup": round(cmp.speedup, 3),
        "ceiling": round(shown, 3) if (shown := ceiling_shown(cmp)) is not None else "n/a",  # (a draft model only)
        "acceptance": round(on.acceptance_rate, 4) if on.reported("acceptance_rate") else NOT_REPORTED,
        "identical": ("yes" if diff is None else f"no ({unit} {diff})") if cmp.same_tokens else "n/a (sampled)",
    }
