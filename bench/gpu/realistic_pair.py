"""Write a pair of realistic shape for bench/gpu/versus.py: a Qwen2.5-1.5B-shaped target (1,536 wide, 28 layers,
151,936 tokens; full-width K/V heads, so about 1.9B weights) quantized to Q4_K_M, and a 0.5B-shaped draft (896 wide,
24 layers) in Q8_0. Random weights: the draft and the target agree on nothing, the target drafting for itself on
everything. ``--tiny`` writes the same vocabulary at a few layers of 64, to try the run on a CPU. Prints the paths."""
import argparse
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "tests")]
from support.tiny_gguf import write_model  # noqa: E402
from app.engine.llama import quantize  # noqa: E402

SHAPES = {"target": dict(n_embd=1536, n_layer=28, n_head=12, n_ff=8960),
          "draft": dict(n_embd=896, n_layer=24, n_head=14, n_ff=4864)}
TINY = {"target": dict(n_embd=64, n_layer=4, n_head=4, n_ff=256), "draft": dict(n_embd=64, n_layer=2, n_head=4, n_ff=128)}

ap = argparse.ArgumentParser()
ap.add_argument("dir", type=Path)
ap.add_argument("--tiny", action="store_true")
a = ap.parse_args()
a.dir.mkdir(parents=True, exist_ok=True)
out = []
for (role, shape), (seed, quant) in zip((TINY if a.tiny else SHAPES).items(), ((1, "Q4_K_M"), (2, "Q8_0"))):
    src = write_model(a.dir / f"{role}-f32.gguf", seed=seed, n_ctx=4096, extra_words=151_936 - 288, **shape)
    quantize(src, out_path := a.dir / f"{role}-{quant.lower()}.gguf", quant)
    src.unlink()
    out.append(out_path)
print(*out)
