"""``specchat generate --server URL`` and ``specchat bench --server URL [--server-off URL2]``: the same commands, with
the models and the speculation on another server (see app/chat/remote_server.py)."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from ..chat.remote_server import RemoteError, RemoteServer, ServerSpec
from ..engine import OFF, Done, GenerationParams, SamplingParams, TextDelta

# `specchat generate --json` fields, in a local run's order; None where the server reports nothing.
JSON_FIELDS = ("text", "token_ids", "n_tokens", "n_drafted", "n_accepted", "acceptance_rate", "tokens_per_second",
               "time_to_first_token_s", "decode_seconds", "finish_reason", "drafter", "n_rounds",
               "mean_accepted_per_round", "draft_seconds", "verify_seconds", "prompt_tokens", "draft_flags",
               "batch_invariant")


def _server(args, url: str | None = None) -> RemoteServer:
    return RemoteServer(ServerSpec(url or args.server, args.server_api_key or None, args.model, args.method))


def _messages(args, prompt: str | list[dict]) -> list[dict]:
    """One user turn (text, or text and image parts), after --system where given."""
    system = getattr(args, "system", None)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def _params(args) -> GenerationParams:
    """generate's sampling flags; bench has none (it is greedy)."""
    flags = ("temperature", "top_k", "top_p", "min_p", "seed")
    sampling = SamplingParams(*(getattr(args, f) for f in flags)) if hasattr(args, "temperature") else \
        SamplingParams(temperature=0.0)
    return GenerationParams(max_tokens=args.max_tokens, stop=tuple(getattr(args, "stop", ()) or ()),
                            sampling=sampling)


def _answer(server: RemoteServer, messages, params, speculate: bool, stream_to=None) -> Done:
    done = None
    for ev in server.generate(messages, params, speculate):
        if isinstance(ev, TextDelta) and stream_to:
            stream_to.write(ev.text)
            stream_to.flush()
        elif isinstance(ev, Done):
            done = ev
    return done


def generate_remote(args, prompt: str | list[dict]) -> int:
    """One prompt as one user turn (the server applies its chat template); --drafter none asks for no drafting."""
    server = _server(args)
    try:
        engine = server.identify()
        done = _answer(server, _messages(args, prompt), _params(args), args.drafter != OFF,
                       None if args.json else sys.stdout)
    finally:
        server.close()
    s = done.stats
    figures = s.as_dict()
    row = {"text": done.text, "finish_reason": done.finish_reason, "drafter": s.drafter,
           "token_ids": None, "draft_flags": None, "batch_invariant": None}
    row.update({k: figures.get(k) for k in JSON_FIELDS if k not in row})
    row.update(server=server.base, engine=engine, method=server.method(), model=server.model,
               unreported=list(s.unreported),
               server_tokens_per_second=s.server_tokens_per_second, error=s.error or None)
    if args.json:
        print(json.dumps(row))
    else:
        print("\n" + remote_summary(s))
    if s.error:
        print(f"specchat: {s.error}; the partial answer is above.", file=sys.stderr)
        return 1
    return 0


def remote_summary(s) -> str:
    speculation = (f"acceptance {s.acceptance_rate:.1%} ({s.n_accepted}/{s.n_drafted})" if s.reported("n_drafted")
                   else "drafting not reported by this server")
    server_rate = f", server says {s.server_tokens_per_second:.1f}" if s.server_tokens_per_second else ""
    return (f"[{s.n_tokens} tokens, {s.tokens_per_second:.1f} tok/s measured here{server_rate}, {speculation}, "
            f"first token {s.time_to_first_token_s * 1000:.0f} ms]")


def bench_remote(args, prompts: list[dict]) -> int:
    from .bench import print_report, prompt_row, remote_report

    if not args.server:
        raise RemoteError("--server-off needs --server (the server that speculates).")
    on = _server(args)
    off = _server(args, args.server_off) if args.server_off else on
    greedy = _params(args)
    try:
        _answer(on, _messages(args, prompts[0]["prompt"]), replace(greedy, max_tokens=16), True)  # warm-up
        if off is not on:
            _answer(off, _messages(args, prompts[0]["prompt"]), replace(greedy, max_tokens=16), True)
        rows = []
        for i, p in enumerate(prompts):
            runs = {"off": [], "on": []}
            for r in range(args.repeats):
                order = ("off", "on") if (i + r) % 2 == 0 else ("on", "off")
                for mode in order:
                    server = off if mode == "off" else on
                    done = _answer(server, _messages(args, p["prompt"]), greedy, mode == "on" or off is not on)
                    if done.stats.error:
                        raise RemoteError(f"{server.base}: {done.stats.error}")
                    if mode == "off" and done.stats.reported("n_drafted") and done.stats.n_drafted:
                        raise RemoteError(
                            f"{off.base} kept drafting ({done.stats.n_drafted} draft tokens) with speculation off "
                            "requested: it does not turn speculation off per request (llama-server does not). Serve "
                            "the same model without a draft model and pass it with --server-off URL.")
                    runs[mode].append(done)
            row = prompt_row(p, runs["off"], runs["on"])
            rows.append(row)
            if not args.json:
                print(f"[{i + 1}/{len(prompts)}] {row['category']}: off {row['tps_off']:.1f} tok/s, on "
                      f"{row['tps_on']:.1f} tok/s, x{row['speedup']:.2f}, identical {row['identical']}",
                      file=sys.stderr)
        where = {"on": on.base, "off": off.base if off is not on else f"{on.base} (speculative.n_max 0)",
                 "model": on.model, "engine": on.identify(), "method": on.method()}
        report = remote_report(rows, args.max_tokens, args.repeats, where)
    finally:
        on.close()
        if off is not on:
            off.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    if not any(r["_counts"][0] for r in report["prompts"]):
        print("note: the server reported no draft tokens: is it speculating (a draft model, -md)?", file=sys.stderr)
    return 0
