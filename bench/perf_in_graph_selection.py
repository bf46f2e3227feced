"""Benchmark (not a test): picking the next token in llama.cpp's graph ("backend sampling") vs from the logits row.

SpecChat reads each output row of logits into numpy and picks there (argmax, or a sparse distribution from the
largest logits). llama.cpp can make the pick inside the decode's graph instead (``llama_context_params.samplers``
with a sampler chain per sequence, then ``llama_get_sampled_token_ith`` / ``_candidates_ith``), so that only a token
id, or a few candidates, leave the device. This times, per generated token and per verification batch, the decode
with the pick in each way, on tiny models with 2026-sized vocabularies (written here), and checks that both ways
pick the same tokens.

    python bench/perf_in_graph_selection.py [--ngl 999] [--vocab 151936 262144] [--tokens 64] [--batch 9]

Columns: µs per step (decode, wait, pick), median of ``--repeats``. "row + numpy argmax": SpecChat's greedy path;
"in graph, greedy": a greedy chain, one id out; "row + top-40 in numpy" vs "in graph, top-k 40": the candidates a
sampled token needs (the 40 largest logits and their ids).
"""
import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(root), str(root / "tests")]  # the tests' helpers: support.tiny_gguf
import llama_cpp.llama_cpp as ll  # noqa: E402

from app.engine.llama.backend import logits_row  # noqa: E402
from app.engine.llama.model import Model  # noqa: E402
from support.tiny_gguf import write_model  # noqa: E402

TOP_K = 40


class Ctx:
    """A one-sequence context, with a backend sampler chain (``chain``: "greedy", "top_k") or without (None)."""

    def __init__(self, model: Model, chain: str | None, n_ctx: int = 1024):
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, 512, 512, 1
        params.n_outputs_max = params.n_outputs_max_per_seq = 64  # a verification batch: one row per token
        params.no_perf = True
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as SpecChat's contexts
        self.chain = chain
        if chain:
            self.smpl = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(self.smpl, ll.llama_sampler_init_greedy() if chain == "greedy"
                                       else ll.llama_sampler_init_top_k(TOP_K))
            self.cfg = (ll.llama_sampler_seq_config * 1)()
            self.cfg[0].seq_id, self.cfg[0].sampler = 0, ctypes.cast(self.smpl, ctypes.c_void_p)
            params.samplers, params.n_samplers = self.cfg, 1
        self.ptr = ll.llama_init_from_model(model.ptr, params)
        assert self.ptr, "llama.cpp could not create the context"
        self.n_vocab = model.n_vocab
        self.batch = ll.llama_batch_init(512, 0, 1)
        self.n = 0

    def decode(self, ids: list[int]) -> None:
        b = self.batch
        b.n_tokens = len(ids)
        for i, t in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, self.n + i, 1, 0, True
        assert ll.llama_decode(self.ptr, b) == 0
        ll.llama_synchronize(self.ptr)
        self.n += len(ids)

    def rewind(self, n: int) -> None:
        ll.llama_memory_seq_rm(ll.llama_get_memory(self.ptr), 0, n, -1)
        self.n = n

    def picks(self, rows: int) -> list:
        """Per output row: the greedy token, or the top-k candidates as (ids, logits) sorted by id."""
        out = []
        for i in range(rows):
            if self.chain == "greedy":
                out.append(int(ll.llama_get_sampled_token_ith(self.ptr, i)))
            elif self.chain == "top_k":
                n = ll.llama_get_sampled_candidates_count_ith(self.ptr, i)
                ids = np.ctypeslib.as_array(ll.llama_get_sampled_candidates_ith(self.ptr, i), (n,)).copy()
                lg = np.ctypeslib.as_array(ll.llama_get_sampled_logits_ith(self.ptr, i), (n,)).copy()
                order = np.argsort(ids)
                out.append((ids[order], lg[order]))
            else:
                out.append(logits_row(self.ptr, i, self.n_vocab))
        return out

    def close(self):
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ptr)
        if self.chain:
            ll.llama_sampler_free(self.smpl)


def numpy_pick(row: np.ndarray, how: str):
    if how == "greedy":
        return int(np.argmax(row))
    ids = np.sort(np.argpartition(row, -TOP_K)[-TOP_K:])
    return ids, row[ids].copy()


def run(ctx: Ctx, prompt: list[int], how: str, tokens: int, batch: list[int]) -> tuple[float, float, list, list]:
    """µs per generated token, µs per verification batch; the greedy tokens generated; the batch's picks."""
    ctx.rewind(0)
    ctx.decode(prompt)
    t, gen, steps = prompt[-1], [], []
    for _ in range(tokens):
        t0 = time.perf_counter()
        ctx.decode([t])
        p = ctx.picks(1)[0]
        p = numpy_pick(p, how) if ctx.chain is None else p
        steps.append(time.perf_counter() - t0)
        t = p if how == "greedy" else int(p[0][np.argmax(p[1])])
        gen.append(t)
    base, spans = ctx.n, []
    for _ in range(tokens // 4):
        ctx.rewind(base)
        t0 = time.perf_counter()
        ctx.decode(batch)
        picks = ctx.picks(len(batch))
        picks = [numpy_pick(r, how) for r in picks] if ctx.chain is None else picks
        spans.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(steps), 1e6 * statistics.median(spans), gen, picks


def same(a, b) -> bool:
    if isinstance(a, int):
        return a == b
    return np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], rtol=0, atol=1e-4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-ngl", "--ngl", type=int, default=0, help="layers on the GPU (999: all)")
    ap.add_argument("--vocab", type=int, nargs="*", default=[151_936, 262_144])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"µs per step (decode, wait, pick), median of {args.tokens} steps, best of {args.repeats} repeats; "
          f"-ngl {args.ngl}; GPU offload {'supported' if ll.llama_supports_gpu_offload() else 'not in this build'}")
    head = ["one token: row + argmax", "in graph, greedy", "row + top-40", "in graph, top-k 40",
            f"{args.batch}-token batch: rows + argmax", "in graph, greedy", "rows + top-40", "in graph, top-k 40"]
    print(f"{'vocabulary':>12}" + "".join(f"{h:>{max(len(h) + 2, 12)}}" for h in head) + "  same picks")
    with tempfile.TemporaryDirectory() as tmp:
        for v in args.vocab:
            path = write_model(Path(tmp) / f"t{v}.gguf", seed=1, extra_words=v - 288, n_embd=64, n_layer=2)
            model = Model(path, n_gpu_layers=args.ngl)
            rng = np.random.default_rng(v)
            prompt = [int(x) for x in rng.integers(300, v, 48)]
            batch = [int(x) for x in rng.integers(300, v, args.batch)]
            cells, agree = {}, True
            for how in ("greedy", "top_k"):
                results = {}
                for chain in (None, how):
                    ctx = Ctx(model, chain)
                    runs = [run(ctx, prompt, how, args.tokens, batch) for _ in range(args.repeats)]
                    ctx.close()
                    results[chain] = (min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2], runs[0][3])
                a, b = results[None], results[how]
                agree &= a[2] == b[2] and all(same(x, y) for x, y in zip(a[3], b[3]))
                cells[how] = (a[0], b[0], a[1], b[1])
            row = [cells["greedy"][0], cells["greedy"][1], cells["top_k"][0], cells["top_k"][1],
                   cells["greedy"][2], cells["greedy"][3], cells["top_k"][2], cells["top_k"][3]]
            print(f"{v:>12,}" + "".join(f"{c:>{max(len(h) + 2, 12)},.0f}" for c, h in zip(row, head))
                  + f"  {'yes' if agree else 'NO'}")
            model.close()


if __name__ == "__main__":
    main()
