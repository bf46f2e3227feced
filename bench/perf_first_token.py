"""Benchmark (not a test): time to the first token of a long prompt with the draft model against speculation off,
and what reading the prompt on while the target answers (app/engine/drafters/draft_model.py: READ_AT_ONCE,
READ_PIECE) costs in acceptance and speed against a draft that reads it all before the first token, in one run.

Three ways, interleaved, each from empty caches: ``none`` (speculation off), ``on`` (the draft model as the app runs
it: a long prompt read a piece a round while the target answers plainly) and ``first`` (the draft reads the whole
prompt before the first token, as before). The prompt is the prompt files' texts joined into one document to
summarize, about --prompt-tokens tokens. It prints each run's time to the first token, tokens/s, acceptance and the
time to the whole answer, then the medians and the ratios: the first token with the draft over without (the goal: at
most 1.15x), acceptance against reading first (at most 2 points lower).

    python bench/perf_first_token.py [--prompt-tokens 1700] [-n 128] [--repeats 2] [specchat bench's model options]
    (the model options default to --pair starter)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine import Done, DraftParams, GenerationParams  # noqa: E402
from app.engine.drafters import draft_model  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402


def long_prompt(model, n_tokens: int) -> list[int]:
    """A document of about ``n_tokens`` tokens (the prompt files' texts, in order) and a request to summarize it."""
    texts = [json.loads(line)["prompt"] for f in sorted((ROOT / "tests" / "prompts").glob("*.jsonl"))
             for line in f.read_text().splitlines() if line.strip()]
    doc, i = "", 0
    while len(chat_tokens(model, [{"role": "user", "content": doc}])) < n_tokens:
        doc += texts[i % len(texts)] + "\n\n"
        i += 1
    return chat_tokens(model, [{"role": "user", "content": "Summarize this text in a few sentences.\n\n" + doc}])


def main() -> None:
    from app.cli.flags import model_flags
    from app.models.loader import LoadSpec, load_engine

    ap = argparse.ArgumentParser()
    model_flags(ap)
    ap.add_argument("--prompt-tokens", type=int, default=1700)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    spec = LoadSpec(pair=args.pair or ("starter" if not args.target else None),
                    target=str(args.target) if args.target else None, draft=str(args.draft) if args.draft else None)
    engine = load_engine(spec)
    ids = long_prompt(engine.model, args.prompt_tokens)
    print(f"prompt: {len(ids)} tokens; read at once up to {draft_model.READ_AT_ONCE}, else {draft_model.READ_PIECE} "
          "a round")
    params = GenerationParams(max_tokens=args.max_tokens, draft=DraftParams(draft_max=8, draft_p_min=0.0))
    runs: dict[str, list] = {"none": [], "on": [], "first": []}
    at_once = draft_model.READ_AT_ONCE
    for r in range(args.repeats):
        for way in (("none", "on", "first") if r % 2 == 0 else ("first", "on", "none")):
            draft_model.READ_AT_ONCE = 10**9 if way == "first" else at_once
            engine.reset()
            done = list(engine.generate(ids, params, "none" if way == "none" else "model"))[-1]
            assert isinstance(done, Done)
            s = done.stats
            runs[way].append(s)
            total = s.time_to_first_token_s + s.decode_seconds
            print(f"{way:6}  first token {s.time_to_first_token_s:6.2f} s  {s.tokens_per_second:6.1f} tok/s  "
                  f"acceptance {s.acceptance_rate:6.1%}  tokens {s.n_tokens}  answer in {total:6.2f} s", flush=True)
    draft_model.READ_AT_ONCE = at_once
    med = {w: (statistics.median(s.time_to_first_token_s for s in runs[w]),
               statistics.median(s.acceptance_rate for s in runs[w]),
               statistics.median(s.tokens_per_second for s in runs[w]),
               statistics.median(s.time_to_first_token_s + s.decode_seconds for s in runs[w])) for w in runs}
    for w, (ttft, acc, tps, total) in med.items():
        print(f"median {w:6}  first token {ttft:6.2f} s  {tps:6.1f} tok/s  acceptance {acc:6.1%}  answer {total:.2f} s")
    print(f"first token over speculation off: reading on {med['on'][0] / med['none'][0]:.2f}x, reading first "
          f"{med['first'][0] / med['none'][0]:.2f}x")
    print(f"acceptance, reading on minus reading first: {100 * (med['on'][1] - med['first'][1]):+.1f} points; the "
          f"whole answer over speculation off: reading on {med['on'][3] / med['none'][3]:.2f}x, reading first "
          f"{med['first'][3] / med['none'][3]:.2f}x")
    engine.close()


if __name__ == "__main__":
    main()
