"""Write a Gemma-shaped tiny pair: a 512-wide 4-layer F16 target with a 262,144-token vocabulary, drafted by its
own Q8_0 and Q4_K_M (a draft's output layer costs about what the target's does). Prints the three paths."""
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "tests")]
from support.tiny_gguf import write_model  # noqa: E402
from app.engine.llama import quantize  # noqa: E402

d = Path(sys.argv[1])
d.mkdir(parents=True, exist_ok=True)
v = int(sys.argv[2]) if len(sys.argv) > 2 else 262_144
scale = float(sys.argv[3]) if len(sys.argv) > 3 else 16.0  # peaked: a draft gets past --draft-p-min
src = write_model(d / "src.gguf", seed=1, n_embd=512, n_layer=4, n_head=8, n_ff=1536, n_ctx=2048, extra_words=v - 288,
                  logit_scale=scale)
quantize(src, d / "target-f16.gguf", "F16")
quantize(src, d / "draft-q4_k_m.gguf", "Q4_K_M")
quantize(src, d / "draft-q8_0.gguf", "Q8_0")
src.unlink()
print(d / "target-f16.gguf", d / "draft-q8_0.gguf", d / "draft-q4_k_m.gguf")
