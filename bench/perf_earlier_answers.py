"""Benchmark (not a test): drafting from earlier answers (``suffix``) on traces replayed in order, each timed against
speculation off in the same run, with the n-gram lookup (``ngram``) beside them:

- ``regenerate``: one question answered, then regenerated four times at temperature 0.7, a new seed each time
  (as the chat's Regenerate);
- ``regenerate-same-seed``: the same, each answer with the first one's seed (a seed typed back in);
- ``edit``: a question asked, then asked again with one word changed, greedy;
- ``agent``: an agent loop of 8 turns: each a request with the whole conversation so far, the model's answer and
  a tool result in the same JSON shape appended for the next, greedy;
- ``agent-api``: the same loop as an agent runs it, 8 ``/v1/messages`` requests to ``specchat serve`` (started here,
  adaptive drafting, draft max 12), each run under its own API key so that it starts from an empty memory (a key's
  requests draft only from that key's); speeds from each answer's ``timings``, outputs compared as text.

Each trace starts from an empty memory (``forget_answers``) for each drafter; the modes are interleaved, the first
rotating with each repeat. Printed: each trace's tokens/s over all its answers (decode time, the first tokens'
excluded as the bench's are), the ratio to speculation off, tokens drafted and accepted, and whether every answer
had speculation off's tokens. Also the costs of a plain step and of a 16-token verification, from which the bound
with every position drafted and accepted is computed as docs/benchmarks/ngram.md does.

    python bench/perf_earlier_answers.py [-n 128] [--repeats 2] [specchat bench's model options]
    (the model options default to --pair starter)
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine import Done, DraftParams, GenerationParams, SamplingParams  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402

QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."
EDITED = ("Explain in a few sentences why the sky is blue during the day.",
          "Explain in a few sentences why the sky is red during the day.")
TOOL = {"name": "read_file", "arguments": {"path": "src/app.py"}}
MODES = ("none", "suffix", "ngram")


def _turns(kind: str) -> list:
    """The trace's requests, as (messages or a callable of the answers so far, sampling)."""
    if kind.startswith("regenerate"):
        same = kind.endswith("same-seed")
        return [([{"role": "user", "content": QUESTION}], SamplingParams(temperature=0.7, seed=1 if same else 1 + i))
                for i in range(5)]
    if kind == "edit":
        return [([{"role": "user", "content": q}], SamplingParams()) for q in EDITED]
    return [(lambda answers, i=i: _agent_messages(answers, i), SamplingParams()) for i in range(8)]


def _agent_messages(answers: list[str], turn: int) -> list[dict]:
    """The agent loop's request at ``turn``: the task, then each earlier answer with a tool result in one shape."""
    msgs = [{"role": "system", "content": "You are a coding agent. To read a file, answer with one JSON object: "
             + json.dumps(TOOL) + ". Then explain what you found."},
            {"role": "user", "content": "Find where the app reads its settings and explain it."}]
    for i, answer in enumerate(answers[:turn]):
        msgs.append({"role": "assistant", "content": answer})
        result = {"tool": "read_file", "path": f"src/module_{i}.py", "ok": True,
                  "content": f"def load_settings_{i}(path):\n    with open(path) as f:\n        return json.load(f)\n"}
        msgs.append({"role": "user", "content": "Tool result: " + json.dumps(result)})
    return msgs


def _trace(engine, kind: str, mode: str, n: int) -> dict:
    engine.forget_answers()
    tokens, seconds, drafted, accepted, outputs, answers = 0, 0.0, 0, 0, [], []
    for messages, sampling in _turns(kind):
        msgs = messages(answers) if callable(messages) else messages
        engine.reset()
        params = GenerationParams(max_tokens=n, sampling=sampling, draft=DraftParams(draft_max=12, adaptive=True))
        done = list(engine.generate(chat_tokens(engine.model, msgs), params, mode))[-1]
        assert isinstance(done, Done)
        s = done.stats
        tokens, seconds = tokens + max(s.n_tokens - 1, 0), seconds + s.decode_seconds
        drafted, accepted = drafted + s.n_drafted, accepted + s.n_accepted
        outputs.append(done.token_ids)
        answers.append(done.text)
    return {"tps": tokens / seconds if seconds else 0.0, "drafted": drafted, "accepted": accepted,
            "outputs": outputs}


def _api_trace(base: str, mode: str, n: int) -> dict:
    """The agent loop through /v1/messages, under a key of its own (a fresh memory for ``suffix``)."""
    import httpx

    headers = {"x-api-key": "bench-" + uuid.uuid4().hex, "anthropic-version": "2023-06-01"}
    tokens, seconds, drafted, accepted, outputs, answers = 0, 0.0, 0, 0, [], []
    for turn in range(8):
        system, *msgs = _agent_messages(answers, turn)
        body = {"model": "local", "max_tokens": n, "temperature": 0, "system": system["content"], "messages": msgs,
                "drafter": mode}
        r = httpx.post(base + "/v1/messages", json=body, headers=headers, timeout=600)
        r.raise_for_status()
        out = r.json()
        t = out["timings"]
        tokens, seconds = tokens + max(t["predicted_n"] - 1, 0), seconds + t["predicted_ms"] / 1000
        drafted, accepted = drafted + t["draft_n"], accepted + t["draft_n_accepted"]
        answers.append("".join(b.get("text", "") for b in out["content"]))
        outputs.append(answers[-1])
    return {"tps": tokens / seconds if seconds else 0.0, "drafted": drafted, "accepted": accepted,
            "outputs": outputs}


def _serve(args) -> tuple[subprocess.Popen, str]:
    """``specchat serve`` on a free port with the bench's pair, once it answers."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pair = ["--pair", args.pair or "starter"] if not args.target else \
        ["--target", str(args.target)] + (["--draft", str(args.draft)] if args.draft else [])
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", *pair, "--port", str(port), "--adaptive",
                             "--draft-max", "12"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("specchat serve did not start")


def main() -> None:
    from app.cli.flags import model_flags
    from app.models.loader import LoadSpec, load_engine

    ap = argparse.ArgumentParser()
    model_flags(ap)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=list(MODES[1:]),
                    help="drafters timed against speculation off (chains too: model,suffix)")
    ap.add_argument("--traces", nargs="+", default=["regenerate", "regenerate-same-seed", "edit", "agent", "agent-api"])
    args = ap.parse_args()
    spec = LoadSpec(pair=args.pair or ("starter" if not args.target else None),
                    target=str(args.target) if args.target else None, draft=str(args.draft) if args.draft else None)
    engine = load_engine(spec)
    server = _serve(args) if "agent-api" in args.traces else None
    modes = ["none", *args.modes]
    for kind in args.traces:
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                runs[mode].append(_api_trace(server[1], mode, args.max_tokens) if kind == "agent-api" and server
                                  else _trace(engine, kind, mode, args.max_tokens))
        off = sum(x["tps"] for x in runs["none"]) / len(runs["none"])
        print(f"{kind}: speculation off {off:.1f} tok/s")
        for mode in modes[1:]:
            tps = sum(x["tps"] for x in runs[mode]) / len(runs[mode])
            same = all(a["outputs"] == b["outputs"] for a, b in zip(runs[mode], runs["none"]))
            d, a = sum(x["drafted"] for x in runs[mode]), sum(x["accepted"] for x in runs[mode])
            print(f"  {mode:12s} {tps:7.1f} tok/s  {tps / off:5.2f}x  drafted {d}, accepted {a}  identical {same}")
    c = engine.measure_costs(16, "suffix")  # (a lookup's costs: the target's batches alone)
    step, batch = c.verify(1), c.verify(17)  # a round verifies the last token and 16 drafted
    print(f"costs: plain step {step * 1000:.1f} ms; verifying 17 tokens {batch * 1000:.1f} ms ({batch / step:.1f} "
          f"steps): with every position drafted and accepted, 16 a round, at most {17 / (batch / step):.2f}x")
    engine.close()
    if server:
        server[0].terminate()
        server[0].wait(timeout=30)


if __name__ == "__main__":
    main()
