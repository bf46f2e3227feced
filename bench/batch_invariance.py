"""Benchmark (not a test): are a token's logits the same decoded alone and inside a verification batch?

    python bench/batch_invariance.py [--ngl 999]

Greedy exactness of speculation rests on it: the target verifies k draft tokens in one batch, while plain decoding
feeds one token at a time. On the CPU SpecChat's build makes the two bit-identical; GPU backends choose kernels by
batch size (docs/benchmarks.md, "On a GPU"). Writes a random 4-layer, 512-wide model and its F16, Q8_0 and Q4_K_M
conversions; prints, per weight type and batch size, the largest logit difference and how many argmax picks moved.
"""
import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(root), str(root / "tests")]  # the tests' helpers: support.tiny_gguf
from support.tiny_gguf import write_model  # noqa: E402
from app.engine.llama import Context, Model, quantize  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("-ngl", "--ngl", type=int, default=0, help="layers on the GPU (999: all)")
ngl = ap.parse_args().ngl
d = Path(tempfile.mkdtemp())
src = write_model(d / "F32.gguf", seed=1, n_embd=512, n_layer=4, n_head=8, n_ff=1536, n_ctx=1024, extra_words=4000)
rng = np.random.default_rng(0)
for ftype in ["F32", "F16", "Q8_0", "Q4_K_M"]:
    path = src if ftype == "F32" else d / f"{ftype}.gguf"
    if ftype != "F32":
        quantize(src, path, ftype)
    m = Model(path, n_gpu_layers=ngl)
    ctx = Context(m, n_ctx=1024, n_threads=4, n_outputs_max=64)
    prompt = [int(t) for t in rng.integers(261, m.n_vocab, 200)]
    cont = [int(t) for t in rng.integers(261, m.n_vocab, 33)]
    ctx.decode(prompt)
    n = len(prompt)
    ref = []
    for t in cont:
        ctx.decode([t])
        ref.append(ctx.logits(-1).copy())
    out = []
    for k in [1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 32]:
        ctx.truncate(n)
        ctx.decode(cont[:k], n_logits=k)
        rows = [ctx.logits(i).copy() for i in range(k)]
        diff = max(float(np.max(np.abs(r - q))) for r, q in zip(rows, ref))
        moved = sum(int(np.argmax(r) != np.argmax(q)) for r, q in zip(rows, ref))
        out.append(f"k={k}: max|d|={diff:.2e} argmax moved {moved}/{k}")
    print(f"[ngl={ngl}] {ftype} n_vocab={m.n_vocab}: " + "; ".join(out), flush=True)
    ctx.close()
