"""Benchmark (not a test): acceptance and tokens/s under sampling on the starter pair (T=0.8, the first 6 held-out
prompts x 2 seeds, 8-token drafts, 128 tokens), for the checkout at ROOT, so two versions can be run alternately:

    python bench/perf_sampled_acceptance.py [ROOT]
"""
import json
import sys
from pathlib import Path

root = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, root)
from app.models.loader import LoadSpec, load_engine, resolve  # noqa: E402
from app.engine import GenerationParams, SamplingParams, DraftParams  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402

spec = LoadSpec(pair="starter")
eng = load_engine(spec, resolve(spec))
lines = (Path(__file__).resolve().parent.parent / "tests/prompts/heldout.jsonl").read_text().splitlines()
prompts = [json.loads(line)["prompt"] for line in lines][:6]
acc = dr = tok = 0
secs = 0.0
for p in prompts:
    ids = chat_tokens(eng.model, [{"role": "user", "content": p}])
    for seed in (1, 2):
        sp = SamplingParams(temperature=0.8, seed=seed)
        params = GenerationParams(max_tokens=128, sampling=sp, draft=DraftParams(draft_max=8, draft_p_min=0.0))
        d = list(eng.generate(ids, params, "model"))[-1]
        acc, dr, tok = acc + d.stats.n_accepted, dr + d.stats.n_drafted, tok + d.stats.n_tokens
        secs += d.stats.decode_seconds
print(f"{root}: acceptance {acc / dr:.3f} ({acc}/{dr}), {tok / secs:.1f} tok/s")
