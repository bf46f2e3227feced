"""Benchmark (not a test): what the speculative loop itself costs per generated token, outside llama.cpp.

A timer wraps every ``llama_decode`` and the wait for it to finish; the loop's own cost is the time from the first
token to the last spent outside them, per token after the first (printed with the whole time per token). On a GPU
a target token costs a few milliseconds, so this is what decides whether speculation pays there. Tiny models with
2026-sized vocabularies (written here: 151,936 tokens like Qwen's, 262,144 like Gemma's) keep the compute small so
the loop's cost shows; the starter pair (49,152) too; real pairs with --pair.

Mode 5 (`--modes 5`, "greedy, adaptive") is adaptive drafting: on a pair where drafting cannot pay, what staying
off costs.

    python bench/perf_loop_overhead.py [--tokens 128] [--vocab 151936 262144] [--no-starter]
                                       [--pair TARGET.gguf DRAFT.gguf] [--modes 0 1 ...]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers: support.tiny_gguf

import llama_cpp.llama_cpp as ll  # noqa: E402
import numpy as np  # noqa: E402

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402
from support.tiny_gguf import write_model  # noqa: E402

MODES = [("greedy, draft model", "model", 0.0), ("sampled T=0.8, draft model", "model", 0.8),
         ("sampled, no draft", "none", 0.8), ("greedy, no draft", "none", 0.0), ("greedy, n-gram", "ngram", 0.0),
         ("greedy, adaptive", "model", 0.0, True)]  # (where drafting cannot pay: what staying off costs)


class DecodeTimer:
    """Times llama.cpp's work as the engine calls it: llama_decode, and llama_synchronize, which waits for what
    llama_decode left running (a GPU's queue, the copy of the outputs to the host)."""

    NAMES = ("llama_decode", "llama_synchronize")

    def __init__(self):
        self.seconds = 0.0
        self._real = {name: getattr(ll, name) for name in self.NAMES}

    def __enter__(self):
        def timed(real):
            def call(*args):
                t0 = time.perf_counter()
                try:
                    return real(*args)
                finally:
                    self.seconds += time.perf_counter() - t0
            return call

        for name, real in self._real.items():
            setattr(ll, name, timed(real))
        return self

    def __exit__(self, *exc):
        for name, real in self._real.items():
            setattr(ll, name, real)


def overhead_us(engine: Engine, ids: list[int], drafter: str, temperature: float, tokens: int,
                adaptive: bool = False) -> tuple[float, float]:
    """µs per token outside llama.cpp, and µs per token in all."""
    params = GenerationParams(max_tokens=tokens, sampling=SamplingParams(temperature=temperature, seed=1),
                              draft=DraftParams(draft_max=8, draft_p_min=0.5 if temperature == 0 else 0.0,
                                                adaptive=adaptive))
    engine.reset()
    timer = DecodeTimer()
    t_first = None
    with timer:
        for ev in engine.generate(ids, params, drafter):
            if t_first is None and getattr(ev, "token_ids", None):
                t_first, decode_at_first = time.perf_counter(), timer.seconds
            if isinstance(ev, Done):
                done, t_end = ev, time.perf_counter()
    n = max(done.stats.n_tokens - 1, 1)
    return 1e6 * ((t_end - t_first) - (timer.seconds - decode_at_first)) / n, 1e6 * (t_end - t_first) / n


def fresh_row_us(engine: Engine, ids: list[int], work, reps: int = 21) -> float:
    """This host's floor: ``work`` on a row of logits llama.cpp has just written (after a decode has streamed the
    weights through the caches, every read of the row misses), median µs."""
    ctx = engine.target.ctx
    engine.reset()
    ctx.decode(ids[:-1], n_logits=0)
    times = []
    for _ in range(reps):
        ctx.truncate(len(ids) - 1)
        ctx.decode(ids[-1:], n_logits=1)
        t0 = time.perf_counter()
        work(ctx.logits(-1))
        times.append(time.perf_counter() - t0)
    engine.reset()
    return 1e6 * statistics.median(times)


def row_scan_us(engine: Engine, ids: list[int]) -> float:
    """One np.argmax over the row: every generated token needs at least one such pass over the target's row and,
    with a draft model, one over the draft's."""
    return fresh_row_us(engine, ids, np.argmax)


def row_distribution_us(engine: Engine, ids: list[int]) -> float:
    """One sampled distribution (T=0.8, the default top-k/top-p/min-p) from the row: a sampled token with a draft
    model needs at least two, the draft's q and the target's p."""
    from app.engine.sampling import distribution

    sp = SamplingParams(temperature=0.8)
    return fresh_row_us(engine, ids, lambda row: distribution(row, sp))


def pairs(vocabs: list[int], starter: bool, tmp: Path, real: list[list[str]]):
    for target, draft in real:
        yield f"{Path(target).stem} + {Path(draft).stem}", Path(target), Path(draft)
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
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("TARGET", "DRAFT"),
                    help="a real pair of GGUF files (repeatable)")
    ap.add_argument("--modes", type=int, nargs="*", help="which columns (0-based), default all")
    args = ap.parse_args()
    modes = [MODES[i] for i in args.modes] if args.modes else MODES
    with tempfile.TemporaryDirectory() as tmp:
        print(f"µs per token outside llama_decode (of all µs per token), median of {args.repeats}, "
              f"{args.tokens} tokens")
        print(f"{'pair':38}" + "".join(f"{m[0]:>28}" for m in modes) + f"{'one row scan':>14}"
              + f"{'one distribution':>18}")
        for name, target, draft in pairs(args.vocab, not args.no_starter, Path(tmp), args.pair):
            engine = Engine(ModelSettings(target, n_ctx=1024), ModelSettings(draft, n_ctx=1024))
            ids = chat_tokens(engine.model, [{"role": "user", "content": "Write a short story about a cat and a dog."}])
            cells = []
            for _, drafter, temperature, *adaptive in modes:
                runs = [overhead_us(engine, ids, drafter, temperature, args.tokens, *adaptive)
                        for _ in range(args.repeats)]
                loop, total = (statistics.median(r) for r in zip(*runs))
                cells.append(f"{loop:,.0f} (of {total:,.0f})")
            scan, dist = row_scan_us(engine, ids), row_distribution_us(engine, ids)
            engine.close()
            print(f"{name:38}" + "".join(f"{c:>28}" for c in cells) + f"{scan:>14,.0f}" + f"{dist:>18,.0f}")


if __name__ == "__main__":
    main()
