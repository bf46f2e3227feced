"""Benchmark (not a test): what the speculative loop itself costs per generated token, outside llama.cpp.

A timer wraps every ``llama_decode``; the loop's own cost is the time from the first token to the last spent
outside it, per token after the first. On a GPU a target token costs a few milliseconds, so this is what decides
whether speculation pays there. Tiny models with 2026-sized vocabularies (written here: 151,936 tokens like
Qwen's, 262,144 like Gemma's) keep the compute small so the loop's cost shows; the starter pair (49,152) too.

    python tests/perf_loop_overhead.py [--tokens 128] [--vocab 151936 262144] [--no-starter]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp.llama_cpp as ll  # noqa: E402

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams  # noqa: E402
from tiny_gguf import write_model  # noqa: E402

MODES = [("greedy, draft model", "model", 0.0), ("sampled T=0.8, draft model", "model", 0.8),
         ("sampled, no draft", "none", 0.8), ("greedy, no draft", "none", 0.0), ("greedy, n-gram", "ngram", 0.0)]


class DecodeTimer:
    """Replaces llama_decode (as the engine calls it) with a timed call."""

    def __init__(self):
        self.seconds = 0.0
        self._real = ll.llama_decode

    def __enter__(self):
        def timed(ctx, batch):
            t0 = time.perf_counter()
            try:
                return self._real(ctx, batch)
            finally:
                self.seconds += time.perf_counter() - t0

        ll.llama_decode = timed
        return self

    def __exit__(self, *exc):
        ll.llama_decode = self._real


def overhead_us(engine: Engine, ids: list[int], drafter: str, temperature: float, tokens: int) -> float:
    params = GenerationParams(max_tokens=tokens, sampling=SamplingParams(temperature=temperature, seed=1),
                              draft=DraftParams(draft_max=8, draft_p_min=0.5 if temperature == 0 else 0.0))
    engine.reset()
    timer = DecodeTimer()
    t_first = None
    with timer:
        for ev in engine.generate(ids, params, drafter):
            if t_first is None and getattr(ev, "token_ids", None):
                t_first, decode_at_first = time.perf_counter(), timer.seconds
            if isinstance(ev, Done):
                done, t_end = ev, time.perf_counter()
    n = done.stats.n_tokens - 1
    return 1e6 * ((t_end - t_first) - (timer.seconds - decode_at_first)) / max(n, 1)


def pairs(vocabs: list[int], starter: bool, tmp: Path):
    for v in vocabs:
        extra = v - 288  # tiny_gguf's fixed tokens: 3 specials, 256 bytes, 2 chat markers, 27 words
        t = write_model(tmp / f"t{v}.gguf", seed=1, extra_words=extra, n_embd=64, n_layer=2)
        d = write_model(tmp / f"d{v}.gguf", seed=2, base_seed=1, noise=0.1, extra_words=extra, n_embd=64, n_layer=2)
        yield f"tiny, {v:,}-token vocabulary", t, d
    if starter:
        from app.models import starter as s

        yield "starter (SmolLM2-135M), 49,152", s.target_path(), s.draft_path()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, nargs="*", default=[151_936, 262_144])
    ap.add_argument("--no-starter", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"µs per token outside llama_decode (median of {args.repeats}), {args.tokens} tokens")
        print(f"{'pair':38}" + "".join(f"{m[0]:>28}" for m in MODES))
        for name, target, draft in pairs(args.vocab, not args.no_starter, Path(tmp)):
            engine = Engine(ModelSettings(target, n_ctx=1024), ModelSettings(draft, n_ctx=1024))
            ids = engine.chat_tokens([{"role": "user", "content": "Write a short story about a cat and a dog."}])
            cells = []
            for _, drafter, temperature in MODES:
                runs = [overhead_us(engine, ids, drafter, temperature, args.tokens) for _ in range(args.repeats)]
                cells.append(statistics.median(runs))
            engine.close()
            print(f"{name:38}" + "".join(f"{c:28.0f}" for c in cells))


if __name__ == "__main__":
    main()
