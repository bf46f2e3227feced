"""What exactness costs on a K-quant model: llama.cpp's CPU batch paths (weights repacked for batched kernels, ggml's
tiled K-quant matmul) on, as llama.cpp ships them, vs off, as SpecChat loads models (they round a batch differently
from one token; see ``app.engine.llama.batch_invariant``).

    python bench/perf_batch_paths.py MODEL.gguf [--runs 3]

Each run times, in a fresh process per setting (ggml reads GGML_CPU_TILED_MM once), a 256-token prompt, 32
one-token decodes and 8 verification batches of 9 tokens; settings interleave, and the medians and their ratios
print at the end. Compare only within one run: this host's speed varies 2-4x.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(path: str, batch_paths: bool) -> dict:
    import llama_cpp as ll

    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.use_extra_bufts = batch_paths
    model = ll.llama_model_load_from_file(path.encode(), mp)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 1024, 512, 2, 2
    cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the engine runs
    ctx = ll.llama_init_from_model(model, cp)

    def decode(tokens: list[int], pos: int) -> None:
        b = ll.llama_batch_init(len(tokens), 0, 1)
        for j, t in enumerate(tokens):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = t, pos + j, 1, 1
            b.seq_id[j][0] = 0
        b.n_tokens = len(tokens)
        assert ll.llama_decode(ctx, b) == 0
        ll.llama_batch_free(b)

    t = time.perf_counter()
    decode([100 + i for i in range(256)], 0)
    prompt = 256 / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(32):
        decode([500 + i], 256 + i)
    one = 32 / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(8):
        decode([600 + j for j in range(9)], 288 + 9 * i)
    verify = (time.perf_counter() - t) / 8 * 1000
    return {"prompt_tok_s": prompt, "one_token_tok_s": one, "verify9_ms": verify}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.model, a.child == "on")))
        return 0
    got: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(a.runs):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            env = {**os.environ, "GGML_CPU_TILED_MM": "1" if mode == "on" else "0"}
            out = subprocess.run([sys.executable, __file__, a.model, "--child", mode], env=env, check=True,
                                 capture_output=True, text=True).stdout
            got[mode].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'':22} {'batch paths on':>15} {'off (SpecChat)':>15} {'off / on':>9}")
    for key in ("prompt_tok_s", "one_token_tok_s", "verify9_ms"):
        on, off = (statistics.median(x[key] for x in got[m]) for m in ("on", "off"))
        print(f"{key:22} {on:15.1f} {off:15.1f} {off / on:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
