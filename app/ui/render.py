"""HTML for the UI, from the runtime's snapshots: pure functions, no Gradio, easy to test and restyle.
Styles live in assets/specchat.css."""
from __future__ import annotations

import html
import re
import time

from ..engine import OFF, Stats, method_name
from ..prompts import thinking
from .attachments import image_file
from .draft_colours import coloured_html


def pct(x: float) -> str:
    return f"{x:.1%}"


def rate(stats: Stats) -> str:
    """Tokens/s, or "—" until two tokens are timed (a rate cannot be measured from one)."""
    return f"{stats.tokens_per_second:.1f}" if stats.rate_measured else "—"


NOT_REPORTED = "not reported"


def figure(stats: Stats, name: str, text: str) -> str:
    """``text``, or "not reported" where a server does not report the figure (never a zero in its place)."""
    return text if stats.reported(name) else NOT_REPORTED


def acceptance(stats: Stats) -> str:
    """The acceptance rate; "—" while nothing was drafted (no 0% for drafts that never happened)."""
    return figure(stats, "acceptance_rate", pct(stats.acceptance_rate) if stats.n_drafted else "—")


def per_round(stats: Stats) -> str:
    """Draft tokens accepted per verification round; "—" before the first round."""
    return figure(stats, "mean_accepted_per_round", f"{stats.mean_accepted_per_round:.2f}" if stats.n_rounds else "—")


def stats_title(stats: Stats, finish: str | None) -> str:
    """The one-line summary each finished answer keeps."""
    end = {"stop": "", "length": " · hit the token limit", "cancelled": " · stopped",
           "interrupted": " · interrupted", "error": " · the stream stopped"}.get(finish or "", "")
    if stats.drafter == OFF:
        return f"⚡ {rate(stats)} tok/s · {stats.n_tokens} tokens · speculation off{end}"
    return (f"⚡ {rate(stats)} tok/s · acceptance {acceptance(stats)} · {per_round(stats)} accepted/round · "
            f"{stats.n_tokens} tokens{end}")


def sampling_words(stats: Stats) -> str:
    """How the answer was chosen: its seed where it was sampled (typed into Settings, it repeats the answer)."""
    return f"seed {stats.seed}" if stats.seed >= 0 else "greedy"


def stats_details(stats: Stats) -> str:
    busy = stats.draft_seconds + stats.verify_seconds
    split = (f"drafting {stats.draft_seconds / busy:.0%} / verifying {stats.verify_seconds / busy:.0%} of the time"
             if busy > 0 else "")
    if stats.unreported:  # a server: say what it reported, and that the rest was not
        rounds = f" in {stats.n_rounds} rounds" if stats.reported("n_rounds") else ""
        counts = (f"drafted {figure(stats, 'n_drafted', str(stats.n_drafted))}, accepted "
                  f"{figure(stats, 'n_accepted', str(stats.n_accepted))}{rounds}")
        server = f" · server says {stats.server_tokens_per_second:.1f} tok/s" if stats.server_tokens_per_second else ""
        error = f" · {stats.error}" if stats.error else ""
        return (f"{stats.method} · {counts} · first token {stats.time_to_first_token_s * 1000:.0f} ms{server} · "
                f"not reported by this server: {', '.join(stats.unreported)}{error}")
    return (f"{stats.method} · {sampling_words(stats)} · drafted {stats.n_drafted}, accepted {stats.n_accepted} in "
            f"{stats.n_rounds} rounds · first token {stats.time_to_first_token_s * 1000:.0f} ms · prompt "
            f"{stats.prompt_tokens} new + {stats.prompt_cached} cached tokens · {split}"
            + "".join(f" · {m}" for m in members(stats)))


def members(stats: Stats) -> list[str]:
    """Several drafters at once (a chain): what each drafted and had accepted, in words."""
    return [f"{method_name(name)}: {r} round{'s' * (r != 1)}, {a}/{d} accepted"
            for name, (r, d, a) in stats.by_drafter.items()]


def answer_html(segments: list[list], show_draft: bool) -> str:
    """The answer as chat content: Markdown as written, or, with the draft view on, the same Markdown rendered with
    the text the draft wrote highlighted (draft_colours)."""
    return coloured_html(segments) if show_draft else "".join(t for t, _ in segments)


def _slice(segments: list[list], start: int) -> list[list]:
    """The text runs from character ``start`` on."""
    out, pos = [], 0
    for text, from_draft in segments:
        if pos + len(text) > start:
            out.append([text[max(0, start - pos):], from_draft])
        pos += len(text)
    return out


def _attribute(text: str) -> str:
    """``text`` as an HTML attribute's value on one line (in the chat's Markdown a blank line ends an HTML block)."""
    return html.escape(text).replace("\n", "&#10;")


def _answer(content: str, segments: list[list], show_draft: bool, streaming: bool, finish: str | None) -> list[dict]:
    """One answer as chat messages: its thinking (collapsed, titled) when it has some, then the answer itself."""
    parts = thinking.split(content)
    out = []
    if parts.thinking is not None:
        status = "done" if parts.thinking_done or not streaming else "pending"
        title = "Thinking…" if status == "pending" else "Thinking"
        out.append({"role": "assistant", "content": parts.thinking or "…",
                    "metadata": {"title": title, "status": status}})
    answer = _slice(segments, parts.answer_start)
    text = "".join(t for t, _ in answer)
    body = answer_html(answer, show_draft)
    if finish == "interrupted":
        body += ('\n\n<span class="interrupted">⚠ Interrupted: the app or its engine stopped while this answer was '
                 'written. Continue goes on from here; Regenerate answers again.</span>')
    if body != text:  # drawn with HTML of ours: the page's script gives Copy the answer's Markdown, kept here
        body += f'<span class="spec-source" title="{_attribute(text)}"></span>'
    if body or not out:
        out.append({"role": "assistant", "content": body or "…"})
    return out


def chat_messages(history: list[dict], show_draft: bool, live=None) -> list[dict]:
    """Chatbot messages: each answer, then its stats as a collapsed line; ``live`` is the answer streaming now."""
    out = []
    for m in history:
        if m["role"] == "user":  # its images (thumbnails, by the page's CSS), then its text
            pictures = [{"path": image_file(b), "alt_text": f"image {i + 1}"}
                        for i, b in enumerate(m.get("images", ()))]
            text = [m["content"]] if m["content"] else []  # (an image sent alone: no empty bubble under it)
            out.append({"role": "user", "content": [*pictures, *text] if pictures else m["content"]})
            continue
        out += _answer(m["content"], m.get("segments") or [[m["content"], False]], show_draft, False, m.get("finish"))
        if m.get("stats"):
            s = Stats.from_dict(m["stats"])
            out.append({"role": "assistant", "content": stats_details(s),
                        "metadata": {"title": stats_title(s, m.get("finish")), "status": "done"}})
    if live is not None:
        out += _answer(live.text, live.segments, show_draft, True, None)
    return out


def history_index(history: list[dict], shown: int | tuple | list, show_draft: bool) -> int | None:
    """The history entry behind the chat's message ``shown`` (an index into chat_messages, as Gradio's edit event
    gives it; a pair where a message has several parts): an answer shows as several messages, a question as one."""
    shown = shown[0] if isinstance(shown, (tuple, list)) else shown
    at = 0
    for k, m in enumerate(history):
        at += len(chat_messages([m], show_draft))
        if shown < at:
            return k
    return None


def _metric(value: str, label: str, key: str) -> str:
    return f'<div class="m" data-key="{key}"><span class="v">{value}</span><span class="k">{label}</span></div>'


# The live panel's figures: (label, key), in the order shown
FIGURES = (("acceptance", "acceptance"), ("tokens/s", "tps"), ("accepted / round", "per-round"),
           ("accepted / drafted", "counts"), ("first token", "ttft"), ("tokens", "tokens"))


def prompt_reading(prompt) -> str:
    """How far the reading of the prompt got (an engine PromptProgress), with a bar: what a long prompt shows before
    its first token. "" once nothing is left to read."""
    if prompt is None or prompt.processed >= prompt.total:
        return ""
    share = prompt.processed / prompt.total if prompt.total else 0.0
    cached = f", {prompt.cache:,} of them from the cache" if prompt.cache else ""
    return (f'<div class="spec-prompt" data-processed="{prompt.processed}" data-total="{prompt.total}">Reading the '
            f'prompt: {prompt.processed:,} of {prompt.total:,} tokens{cached}'
            f'<div class="spec-prompt-bar"><div style="width:{share:.1%}"></div></div></div>')


def live_panel(stats: Stats | None, points: list, state: str, prompt=None) -> str:
    """Acceptance, tokens/s and friends for the answer streaming now (or the last one), with a small chart;
    ``stats`` None, or an answer with no token yet: nothing measured. ``prompt``: how far the reading of the prompt
    got (PromptProgress), shown until the first token."""
    if stats is not None and not stats.n_tokens and state in ("queued", "running"):
        stats = None
    s = stats or Stats()
    busy = s.draft_seconds + s.verify_seconds
    d = s.draft_seconds / busy if busy else 0.0
    counts = f"{s.n_accepted}/{s.n_drafted}" if s.reported("n_drafted") else \
        f"{s.n_accepted}/—" if s.reported("n_accepted") else NOT_REPORTED
    # Nothing measured yet: every figure "—" (no 0% acceptance that never happened)
    values = ["—"] * len(FIGURES) if stats is None else [
        acceptance(s), rate(s), per_round(s), counts,
        f"{s.time_to_first_token_s * 1000:.0f} ms", str(s.n_tokens)]
    metrics = "".join(_metric(v, label + (" measured here" if key == "tps" and s.unreported else ""), key)
                      for v, (label, key) in zip(values, FIGURES))
    if s.server_tokens_per_second:
        metrics += _metric(f"{s.server_tokens_per_second:.1f}", "tokens/s the server says", "server-tps")
    # The corner names the drafter that wrote the answer shown ("drafted by ..."): a bare "off" read as a switch.
    corner = "" if stats is None else ("speculation off" if s.drafter == OFF else f"drafted by {s.method}") + (
        "" if s.unreported else f" · {sampling_words(s)}")
    # The chart, or where it will be; not for a finished answer restored without its series (a reload)
    chart = line_chart(points) if len(points) >= 2 or stats is None or state in ("queued", "running") else ""
    if stats is None:
        split = ""
    elif s.reported("draft_seconds"):
        split = (f'<div class="spec-split" title="time spent drafting vs verifying">'
                 f'<div class="draft" style="width:{d:.1%}"></div>'
                 f'<div class="verify" style="width:{1 - d if busy else 0:.1%}"></div>'
                 f'</div><div class="spec-split-legend"><span class="draft">drafting {d:.0%}</span>'
                 f'<span class="verify">verifying {1 - d if busy else 0:.0%}</span></div>')
    else:
        split = '<div class="spec-unreported">Drafting / verifying time: not reported by this server.</div>'
    error = (f'<div class="spec-error">{html.escape(in_page_words(s.error))}: the partial answer is kept.</div>'
             if s.error else "")
    return (
        f'<div class="spec-live" data-state="{state}" '
        f'data-acceptance="{f"{s.acceptance_rate:.4f}" if stats and s.reported("acceptance_rate") else ""}" '
        f'data-tps="{f"{s.tokens_per_second:.2f}" if s.rate_measured else ""}" data-tokens="{s.n_tokens}">'
        f'<div class="spec-live-head"><span class="dot {state}"></span>{html.escape(_STATE_TEXT.get(state, state))}'
        f'<span class="drafter">{html.escape(corner)}</span></div>'
        f'{prompt_reading(prompt) if stats is None else ""}<div class="spec-metrics">{metrics}</div>{split}{error}'
        + "".join(f'<div class="spec-member">{html.escape(m)}</div>' for m in members(s))
        + f'{chart}</div>'
    )


_STATE_TEXT = {"idle": "Ready", "running": "Generating…", "done": "Finished", "cancelled": "Stopped",
               "error": "Error", "queued": "Waiting for the engine…", "interrupted": "Interrupted"}
FINISH_STATE = {"cancelled": "cancelled", "interrupted": "interrupted"}  # an answer's finish → the panel's state


def line_chart(points: list, w: int = 300, h: int = 110) -> str:
    """Tokens/s (left scale) and acceptance (0-100%, right scale) over the answer's tokens."""
    if len(points) < 2:
        return f'<svg class="spec-chart" viewBox="0 0 {w} {h}"><text x="{w / 2}" y="{h / 2}" text-anchor="middle" ' \
               f'class="empty">tokens/s and acceptance appear here</text></svg>'
    pad = 6
    n_max = max(p[0] for p in points)
    n_min = min(p[0] for p in points)
    tps_max = max(p[1] for p in points) * 1.15 or 1.0
    x = lambda n: pad + (w - 2 * pad) * (n - n_min) / max(n_max - n_min, 1)  # noqa: E731
    y = lambda v, top: h - pad - (h - 2 * pad - 12) * v / top  # noqa: E731
    tps = " ".join(f"{x(n):.1f},{y(t, tps_max):.1f}" for n, t, _ in points)
    acc = " ".join(f"{x(n):.1f},{y(a, 1.0):.1f}" for n, _, a in points)
    return (
        f'<svg class="spec-chart" viewBox="0 0 {w} {h}" role="img" aria-label="tokens per second and acceptance">'
        f'<polyline class="tps" points="{tps}"/><polyline class="acc" points="{acc}"/>'
        f'<text x="{pad}" y="11" class="tps">tok/s (max {tps_max / 1.15:.0f})</text>'
        f'<text x="{w - pad}" y="11" text-anchor="end" class="acc">acceptance</text></svg>'
    )


def hardware_panel(hw: dict, loaded: dict) -> str:
    gib = 1024**3
    rows = [
        ("CPU", f"{html.escape(hw['cpu'])} — {hw['cores_physical']} cores / {hw['cores_logical']} threads, "
                f"{hw['cpu_percent']:.0f}% busy"),
        ("RAM", f"{hw['ram_used'] / gib:.1f} GiB used, {hw['ram_available'] / gib:.1f} GiB free of "
                f"{hw['ram_total'] / gib:.1f} GiB"),
        ("SpecChat process", f"{hw['process_rss'] / gib:.2f} GiB resident"),
        ("GPU offload", "yes — this llama.cpp build can offload layers (-ngl / -ngld)" if loaded["gpu_offload"]
         else f"no — {html.escape(loaded['gpu_advice'])}" if loaded.get("gpu_advice")
         else "no — this machine has no GPU that llama.cpp could use: everything runs on the CPU"),
        *([("GPU", _gpu_row(hw))] if hw.get("gpus") else []),
        ("Loaded pair", html.escape(loaded["pair"] or "none")),
    ]
    if server := loaded.get("server"):  # the models run there: nothing of theirs in this machine's memory
        rows += [("Server", html.escape(f"{server['engine']} at {server['url']}, model {server['model']}")),
                 ("Speculation", html.escape(server["method"] + (f"; off side from {server['off']}"
                                                                 if server["off"] else "")))]
    else:
        rows += [
            ("Target / draft", html.escape(f"{loaded['target']} / {loaded['draft'] or '—'}") if loaded["target"]
             else "—"),
            ("Pair memory", f"{loaded['memory_bytes'] / gib:.2f} GiB (weights + KV cache at {loaded['n_ctx']} tokens"
             + "".join(f"; recurrent state {r['bytes'] / 2**20:.1f} MiB: {r['snapshots']} snapshots, "
                       f"{r['saved']} saved states" for r in loaded.get("recurrent", [])) + ")"
             if loaded["target"] else "—"),
        ]
        if (offload := loaded.get("offload")) and loaded["gpu_offload"]:
            rows.append(("GPU layers", _offload_row(offload)))
        if worker := loaded.get("worker"):
            rows.append(("Engine worker", _worker_row(worker)))
        if threads := loaded.get("threads"):
            rows.append(("Threads", html.escape("; ".join(f"{role} {t['n_threads']} ({t['why']})"
                                                          for role, t in threads.items()))))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="spec-hw">{body}</table>'


def _gpu_row(hw: dict) -> str:
    """Each GPU's free memory, and the speeds of plain decoding measured on them (the latest few): what the Models
    view's GPU rows are priced by."""
    gib = 1024**3
    devices = "; ".join(f"{g['name']} — {g['free'] / gib:.1f} GiB free of {g['total'] / gib:.1f} GiB"
                        for g in hw["gpus"])
    measured = ", ".join(f"{m['model']} {m['tokens_per_second']:.0f} tok/s" for m in hw.get("gpu_measured", [])[:3])
    return html.escape(devices + (f" — measured here before speculation: {measured}" if measured else
                                  " — no speed measured here yet (an answer with speculation off measures it)"))


def _offload_row(offload: dict) -> str:
    """The layers each model put on the GPU, and why (the fit to the GPU's free memory, or as asked)."""
    count = lambda m: m["n_layers"] if m["n_gpu_layers"] < 0 else min(m["n_gpu_layers"], m["n_layers"])  # noqa: E731
    layers = "; ".join(f"{role} {count(m)} of {m['n_layers']}" for role, m in offload.items())
    whys = list(dict.fromkeys(m["why"] for m in offload.values() if m["why"]))
    return html.escape(layers + (f" — {'; '.join(whys)}" if whys else ""))


def _worker_row(worker: dict) -> str:
    """The engine worker process: its pid, state and memory, what happened to it, and where its log is."""
    state = {"ready": "running", "restarting": "loading the pair again after a crash", "loading": "loading",
             "failed": "stopped", "closed": "stopped"}.get(worker["state"], worker["state"])
    rss = f", {worker['rss_bytes'] / 1024**3:.2f} GiB resident" if worker.get("rss_bytes") else ""
    restarts = f"; restarted {worker['restarts']}×" if worker.get("restarts") else ""
    notice = f"<br>{html.escape(worker['notice'])}" if worker.get("notice") else ""
    return (f"pid {worker['pid']}, {state}{rss}{restarts}; log: <code>{html.escape(worker['log'])}</code>"
            + notice)


def _client(base: str, key: bool, *imports: str) -> list[str]:
    """The lines every API example starts with: its imports, and an OpenAI client for this server."""
    names = [*imports, *(["os"] if key else [])]
    api_key = 'os.environ["SPECCHAT_API_KEY"]' if key else '"none"'
    return [*([f"import {', '.join(names)}"] if names else []), "from openai import OpenAI",
            f'client = OpenAI(base_url="{base}", api_key={api_key})']


def schema_example(base: str, model: str, key: bool) -> str:
    """Python asking for an answer that follows a JSON schema (OpenAI's response_format)."""
    return "\n".join([
        *_client(base, key, "json"),
        'schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},',
        '          "country": {"type": "string", "maxLength": 40}},',
        '          "required": ["city", "country"], "additionalProperties": False}',
        f'r = client.chat.completions.create(model="{model}", max_tokens=200,',
        '    messages=[{"role": "user", "content": "Name a big city and its country, as JSON."}],',
        '    response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})',
        'print(json.loads(r.choices[0].message.content), r.model_extra["timings"]["draft_n_forced"])',
    ])


def tools_example(base: str, model: str, key: bool) -> str:
    """Python offering the model a tool (OpenAI's tools) and reading the call it makes."""
    return "\n".join([
        *_client(base, key),
        'weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",',
        '    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},',
        '                   "required": ["city"], "additionalProperties": False}}}',
        f'r = client.chat.completions.create(model="{model}", tools=[weather], tool_choice="required",',
        '    messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=200)',
        "for call in r.choices[0].message.tool_calls:",
        "    print(call.function.name, call.function.arguments)",
    ])


def api_panel(info: dict, pair: str | None) -> str:
    """Where the OpenAI-compatible API is, how to call it, and the requests it served."""
    base = info["base_url"]
    key = ' -H "Authorization: Bearer $SPECCHAT_API_KEY"' if info["key"] else ""
    model = pair or "MODEL"
    curl = (f"curl {base}/chat/completions{key} -H 'Content-Type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")
    py = "\n".join([
        *_client(base, info["key"]),
        f'r = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello"}}])',
        'print(r.choices[0].message.content, r.model_extra["timings"])  # draft_n, draft_n_accepted, ...',
    ])
    schema = schema_example(base, model, info["key"])
    tools = tools_example(base, model, info["key"])
    rows = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(r.when))}</td><td>{html.escape(r.endpoint)}</td>"
        f"<td>{r.tokens}</td><td>{'—' if r.tokens_per_second is None else f'{r.tokens_per_second:.1f}'}</td>"
        f"<td>{'—' if r.acceptance is None else pct(r.acceptance)}</td><td>{html.escape(r.drafter)}</td>"
        f"<td>{html.escape(r.finish)}</td></tr>" for r in info["served"])
    return (
        f'<div class="spec-api"><p>Base URL <code>{html.escape(base)}</code> — point any OpenAI client at it '
        f'(<code>OPENAI_BASE_URL={html.escape(base)}</code>). '
        f'{"A key is required." if info["key"] else "No key is required (loopback only unless <code>--listen</code>)."}'
        f'</p><h4>curl</h4><pre><code>{html.escape(curl)}</code></pre>'
        f'<h4>Python</h4><pre><code>{html.escape(py)}</code></pre>'
        f'<h4>Structured output</h4><p>The answer follows a JSON schema (exact under speculation; the keys and '
        f'punctuation the schema forces are drafted free, <code>draft_n_forced</code>).</p>'
        f'<pre><code>{html.escape(schema)}</code></pre>'
        f'<h4>Tools</h4><p>Calls the model makes come back as <code>tool_calls</code> (valid for the tools\' '
        f'schemas).</p><pre><code>{html.escape(tools)}</code></pre>'
        f'<h4>Requests served</h4><table class="spec-api-served"><thead><tr><th>time</th><th>endpoint</th>'
        f'<th>tokens</th><th>tok/s</th>'
        f'<th>acceptance</th><th>drafter</th><th>finish</th></tr></thead><tbody>'
        f'{rows or "<tr><td colspan=7>No requests yet.</td></tr>"}</tbody></table></div>'
    )


# The engine's messages name the command line's flags, which the CLI keeps; the page names its own fields.
FIELDS = {"--max-tokens": "Max tokens", "--draft-max": "Draft max", "--draft-min": "Draft min",
          "--draft-p-min": "Draft p-min", "--ctx": "Context size", "--n-gpu-layers": "GPU layers"}
PHRASES = {"run the pull again": "press Download again (Models tab)"}


def in_page_words(text: str) -> str:
    """``text`` with the flags it names as the Settings tab's fields, and the CLI's commands as the page's buttons."""
    text = re.sub(r"(?<![\w-])--[a-z][a-z-]*[a-z]", lambda m: FIELDS.get(m[0], m[0]), text)
    for cli, page in PHRASES.items():
        text = text.replace(cli, page)
    return text


def notice(text: str | None, kind: str = "error") -> str:
    return f'<div class="spec-notice {kind}">{html.escape(in_page_words(text))}</div>' if text else ""


def header(pair: str | None, logo_svg: str = "", ready: bool = True) -> str:
    """``ready`` False: the page as first served, before its load event filled in the session (data-ready)."""
    badge = html.escape(pair) if pair else "no pair loaded"
    return (f'<div class="spec-header" data-ready="{str(ready).lower()}"><span class="logo">{logo_svg}</span>'
            f'<span class="name">SpecChat</span><span class="tag">same output, faster</span>'
            f'<span class="pair" title="loaded pair">{badge}</span></div>')


# --- models view --------------------------------------------------------------------------------------------
def models_table(rows: list[dict]) -> str:
    """The catalog, newest families first: one row per pair with what is on disk, whether it fits this machine and
    how fast it would run here, the recommended pair marked. Each row carries its uses (vision where the target
    reads images) and whether it runs well here, for the filters above the table."""
    e = html.escape
    body = []
    for r in rows:
        state = "ready" if r["ready"] else "partial" if "partly" in r["target_status"] + r["draft_status"] else "none"
        label = {"ready": "ready", "partial": "partly downloaded", "none": "not downloaded"}[state]
        uses = r["use"] + (" vision" if r["vision"] else "")
        badge = '<br><span class="recommended">★ recommended for this machine</span>' if r["recommended"] else ""
        here = e(r["fit"]) + (f'<br><span class="expected">{e(r["expected"])}</span>' if r["expected"] else "")
        # Per file only where the pair is partly on disk (the On disk column says the rest); the projector once the
        # pair's weights are here (before that, the Use column's "vision" says it)
        target_disk, draft_disk = ((f'<br><small>{e(r[k])}</small>' if state == "partial" else "")
                                   for k in ("target_status", "draft_status"))
        images = f'<br><small>{e(r["images"])}</small>' if r.get("images") and state != "none" else ""
        body.append(
            f'<tr data-pair="{e(r["pair"])}" data-state="{state}" data-use="{uses}" '
            f'data-well="{"yes" if r["runs_well"] else "no"}" tabindex="0"'
            f'{" data-recommended" if r["recommended"] else ""}><td><b>{e(r["pair"])}</b>{badge}<br>'
            f'<small>{e(r["description"])}</small></td><td>{e(uses.replace(" ", ", "))}</td>'
            f'<td>{e(r["released"]) or "—"}</td>'
            f'<td>{e(r["target_quant"])} · {r["target_gb"]:.2f} GB{target_disk}{images}</td>'
            + (f'<td>{e(r["draft_quant"])} · {r["draft_gb"]:.2f} GB{draft_disk}</td>'
               if r["draft_quant"] else f'<td><small>{e(r["draft"])}</small></td>')
            + f'<td>{r["context"]:,}</td><td class="state {state}">{label}</td><td><small>{here}</small></td>'
            f'<td><small>{e(r["license"])}</small></td></tr>')
    best = next((r for r in rows if r["recommended"]), None)
    lead = (f'<div class="spec-recommended">★ For this machine: <b>{e(best["pair"])}</b> — {e(best["expected"])}. '
            'Click a row to pick its pair.</div>') if best else ""
    return (lead + '<table class="spec-models"><thead><tr><th>Pair</th><th>Use</th><th>Released</th><th>Target</th>'
            '<th>Draft</th><th>Context</th><th>On disk</th><th>This machine</th><th>License</th></tr></thead><tbody>'
            + "".join(body) + "</tbody></table>")


def download_progress(files: list, state: str, message: str = "") -> str:
    """Per-file progress bars; ``files`` are app.hub.Progress snapshots (one per file seen so far)."""
    e = html.escape
    bars = []
    for p in files:
        frac = p.done / p.total if p.total else 0.0
        # (no size yet: the Hub is still being asked where the file is)
        where = f"{p.done / 1e6:,.1f} of {p.total / 1e6:,.1f} MB ({frac:.0%})" if p.total else "looking it up"
        bars.append(f'<div class="spec-dl-file" data-file="{e(p.file)}" data-done="{p.done}" data-total="{p.total}">'
                    f'<div class="spec-dl-label">[{p.index}/{p.count}] {e(p.file)} — {where}'
                    f'{" — " + e(p.note) if p.note else ""}</div>'
                    f'<div class="spec-dl-bar"><div style="width:{frac * 100:.1f}%"></div></div></div>')
    note = f'<div class="spec-dl-note">{e(in_page_words(message))}</div>' if message else ""
    return f'<div class="spec-download" data-state="{state}">{"".join(bars)}{note}</div>'


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 100e6 else f"{n / 1e6:.1f} MB"


def hub_drafts(target: str, rows: list[tuple], own: str = "") -> str:
    """Drafts found for ``target``: (mark, repo, quantization, bytes, downloads or None, advice) per candidate;
    mark as ``discover.Advice.mark`` (OK: the target's tokens, TXT: drafted as text). ``own``: how the target
    drafts by itself (its MTP heads), said first."""
    e = html.escape
    own = notice(own[0].upper() + own[1:] + ".", "info") if own else ""
    if not rows:
        return own + notice(f"No draft found for {target} on the Hub; " + (
            "none is needed." if own else "the n-gram drafter needs none."), "info")
    symbol = {"OK": "✓", "TXT": "≈ as text", "NO": "✗", "?": "?"}
    body = "".join(f'<tr data-mark="{e(mark)}"><td>{symbol[mark]}</td><td>{e(repo)}</td>'
                   f'<td>{e(quant)}</td><td>{size(n)}</td><td>{"catalog" if downloads is None else f"{downloads:,}"}'
                   f'</td><td>{e(line)}</td></tr>'
                   for mark, repo, quant, n, downloads, line in rows)
    return own + (f'<table class="spec-hub-drafts"><caption>Drafts for {e(target)}</caption><thead><tr><th></th>'
            '<th>Repo</th><th>Quant</th><th>Size</th><th>Downloads</th><th>Tokenizer</th></tr></thead><tbody>'
            + body + "</tbody></table>")


def pair_report(lines: list[str], ok: bool) -> str:
    """app.models.check's report, one line per fact."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f'<div class="spec-notice {"info" if ok else "warning"}" id="pair-report-body"><ul>{items}</ul></div>'
