"""Benchmark (not a test): plain decoding through SpecChat's engine vs llama-cpp-python's high-level ``Llama``.

Same model file, same prompt, greedy, same threads and context; the two alternate over several rounds and the
script prints the tokens/s of each and their ratio, all measured in this one run.

    python bench/perf_plain_vs_llama.py [--model PATH] [--tokens 192] [--rounds 4]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings  # noqa: E402
from app.engine.llama import default_threads  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402

PROMPT = "Explain how a hash map works, with an example in Python."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.model is None:
        from app.models import starter

        args.model = starter.target_path()
    from llama_cpp import Llama

    threads, n_ctx = default_threads(), 2048
    engine = Engine(ModelSettings(args.model, n_ctx=n_ctx, n_threads=threads))
    llm = Llama(str(args.model), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                flash_attn=False)
    messages = [{"role": "user", "content": PROMPT}]
    ids = chat_tokens(engine.model, messages)
    params = GenerationParams(max_tokens=args.tokens, draft=DraftParams(draft_max=0))

    def ours() -> float:
        engine.reset()
        done = list(engine.generate(ids, params, "none"))[-1]
        assert isinstance(done, Done)
        return done.stats.tokens_per_second

    def reference() -> float:
        # Same accounting as ours: time from the first token to the last, over the tokens after the first.
        llm.reset()
        stamps = []
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == args.tokens:
                break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    ours(), reference()  # warm-up
    a, b = [], []
    for r in range(args.rounds):
        for fn, sink in ((ours, a), (reference, b)) if r % 2 == 0 else ((reference, b), (ours, a)):
            sink.append(fn())
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"model {args.model.name}, {args.tokens} tokens, {threads} threads, {args.rounds} alternating rounds")
    print(f"specchat engine (drafter none): {ma:.1f} tok/s  {[round(x, 1) for x in a]}")
    print(f"llama-cpp-python Llama:         {mb:.1f} tok/s  {[round(x, 1) for x in b]}")
    print(f"ratio engine / Llama: {ma / mb:.3f}")


if __name__ == "__main__":
    main()
