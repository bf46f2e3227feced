"""Benchmark (not a test): the Models view's expected speed against plain decoding measured here, in one run.

For each model (default: the starter's F32 target and its Q4_1 draft, as targets of their own), it measures the
memory bandwidth as app/models/expected_speed.py does, decodes greedily without a draft, and prints the measured
tokens/s, the estimate, and the share of the bandwidth bound decoding reached (what EFFICIENCY stands for), with
the median over the rounds. The bandwidth is measured again before each round, beside the decode it explains.

    python bench/expected_speed.py [--model PATH]... [--tokens 128] [--rounds 3]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings  # noqa: E402
from app.models import expected_speed  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402

PROMPT = "Explain how a hash map works, with an example in Python."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, action="append")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not args.model:
        from app.models import starter

        args.model = [starter.target_path(), starter.draft_path()]
    print(f"EFFICIENCY in app/models/expected_speed.py: {expected_speed.EFFICIENCY} (the quantization from the name)")
    for path in args.model:
        engine = Engine(ModelSettings(path, n_ctx=1024))
        ids = chat_tokens(engine.model, [{"role": "user", "content": PROMPT}])
        params = GenerationParams(max_tokens=args.tokens, draft=DraftParams(draft_max=0))
        gb = path.stat().st_size / 1e9  # (the weights decoding reads: about the file)
        quantization = path.stem.rsplit(".", 1)[-1]  # (the starter's files end in .F32 / .Q4_1)
        shares = []
        for r in range(args.rounds + 1):
            expected_speed.ram_bandwidth.cache_clear()
            bandwidth = expected_speed.ram_bandwidth()
            engine.reset()
            done = list(engine.generate(ids, params, "none"))[-1]
            assert isinstance(done, Done)
            tps = done.stats.tokens_per_second
            if r == 0:
                continue  # (a warm-up: the first answer pays for page faults and cold caches)
            share = tps * gb * 1e9 / bandwidth
            shares.append(share)
            print(f"{path.name}: {gb:.2f} GB, copy bandwidth {bandwidth / 1e9:.1f} GB/s, measured {tps:.1f} tok/s, "
                  f"estimated {expected_speed.cpu_tps(gb, quantization):.1f} tok/s, share of the bound {share:.2f}")
        print(f"{path.name}: median share {statistics.median(shares):.2f} over {len(shares)} rounds")
        engine.close()


if __name__ == "__main__":
    main()
