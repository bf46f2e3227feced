"""SpecChat against llama.cpp's own C++ loop on the same machine, files and prompts: plain and speculative tokens/s,
acceptance, whether each greedy speculative answer equals the same tool's plain one, and SpecChat's cost per token
outside llama.cpp. Both run the same llama.cpp build (SpecChat through LLAMA_CPP_LIB_PATH, or the one it was
installed with; llama.cpp's tools from BIN), greedy, the same draft settings, every layer on the GPU.

    python bench/gpu/versus.py --bin BUILD/bin --target T.gguf --draft D1.gguf [--draft D2.gguf] [-n 128]

llama.cpp's figures are its tools' own: llama-simple (plain) and llama-speculative-simple print tokens over the time
after the prompt (the latter may run a few tokens past -n: it counts whole accepted drafts); SpecChat's are its Stats
(the first token to the last). A draft that is the target itself gives every tool 100% acceptance: the most drafting
can give here. llama-simple takes no flags beyond -m -n -ngl: on a CPU it repacks weights and leaves flash attention
to llama.cpp, so there its plain answer can part from llama-speculative-simple's at a near-tie (with -ngl 999 every
weight it multiplies is on the GPU).
"""
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "tests"), str(root / "bench")]
from support.llama_tools import death_report, environment  # noqa: E402
from perf_loop_overhead import overhead_us  # noqa: E402
from app.engine import DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams  # noqa: E402

PROMPTS = ["The history of the printing press begins", "def quicksort(items):", "Dear team, the results of"]
DRAFT = dict(n_max=8, n_min=0, p_min=0.5)  # both loops: up to 8 draft tokens, greedy drafting stops under p 0.5


def tool(cmd: list[str]) -> tuple[str, str]:
    """(the text it wrote: the prompt and the answer, its log) of one run of a llama.cpp tool."""
    run = subprocess.run(cmd, capture_output=True, text=True, env=environment(), timeout=300)
    if run.returncode:
        raise SystemExit(death_report(Path(cmd[0]).name, run.returncode, run.stdout + run.stderr))
    return run.stdout.strip(), run.stderr


def llama_cpp(bin_dir: Path, target: Path, draft: Path | None, prompt: str, n: int, ngl: int) -> dict:
    if draft is None:  # (llama-simple: greedy, the prompt in one batch, -ngl)
        text, log = tool([str(bin_dir / "llama-simple"), "-m", str(target), "-n", str(n), "-ngl", str(ngl), prompt])
        speed = re.search(r"decoded (\d+) tokens in [\d.]+ s, speed: ([\d.]+) t/s", log)
        return {"tps": float(speed[2]), "text": text}
    text, log = tool([str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
                      "--spec-type", "draft-simple", "-p", prompt,
                      "-n", str(n), "-ngl", str(ngl), "-ngld", str(ngl), "--temp", "0", "-fa", "off", "-c", "2048",
                      "--spec-draft-n-max", str(DRAFT["n_max"]), "--spec-draft-n-min", str(DRAFT["n_min"]),
                      "--spec-draft-p-min", str(DRAFT["p_min"])])
    speed = re.search(r"decoded +(\d+) tokens in +[\d.]+ seconds, speed: +([\d.]+) t/s", log)
    drafted, accepted = (int(re.search(rf"{k} += (\d+)", log)[1]) for k in ("n_drafted", "n_accept"))
    return {"tps": float(speed[2]), "acc": accepted / max(drafted, 1), "text": text}


def same_text(a: str, b: str) -> bool:
    """Equal as far as both go (the tools may stop a token apart): a divergence before either ends is a difference."""
    k = min(len(a), len(b))
    return a[:k] == b[:k]


def specchat(engine: Engine, ids: list[int], drafter: str, n: int) -> dict:
    params = GenerationParams(max_tokens=n, sampling=SamplingParams(temperature=0.0),
                              draft=DraftParams(draft_max=DRAFT["n_max"], draft_min=DRAFT["n_min"],
                                                draft_p_min=DRAFT["p_min"], adaptive=False))
    engine.reset()
    done = list(engine.generate(ids, params, drafter))[-1]
    s = done.stats
    return {"tps": s.tokens_per_second, "acc": s.acceptance_rate, "ids": done.token_ids}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's built tools (llama-simple, ...)")
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, action="append", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-ngl", type=int, default=999)
    a = ap.parse_args()
    print(f"{'draft':<28}{'llama.cpp plain':>16}{'llama.cpp spec':>15}{'acc':>7}{'same':>6}"
          f"{'SpecChat plain':>16}{'SpecChat spec':>15}{'acc':>7}{'same':>6}{'ours/theirs':>12}{'µs/tok out':>11}")
    for draft in a.draft:
        engine = Engine(ModelSettings(a.target, n_ctx=2048, n_gpu_layers=a.ngl),
                        ModelSettings(draft, n_ctx=2048, n_gpu_layers=a.ngl))
        rows = []
        for prompt in PROMPTS:
            ids = engine.model.tokenize(prompt)  # as llama.cpp's tools tokenize it: BOS added, specials parsed
            theirs = llama_cpp(a.bin, a.target, None, prompt, a.n, a.ngl), \
                llama_cpp(a.bin, a.target, draft, prompt, a.n, a.ngl)
            ours = specchat(engine, ids, "none", a.n), specchat(engine, ids, "model", a.n)
            out_us = overhead_us(engine, ids, "model", 0.0, a.n)[0]
            rows.append((theirs[0]["tps"], theirs[1]["tps"], theirs[1]["acc"],
                         same_text(theirs[0]["text"], theirs[1]["text"]),
                         ours[0]["tps"], ours[1]["tps"], ours[1]["acc"], ours[0]["ids"] == ours[1]["ids"], out_us))
        engine.close()
        med = [statistics.median(r[i] for r in rows) for i in (0, 1, 2, 4, 5, 6, 8)]
        same_theirs, same_ours = sum(r[3] for r in rows), sum(r[7] for r in rows)
        print(f"{draft.name:<28}{med[0]:>16.1f}{med[1]:>15.1f}{med[2]:>7.1%}{f'{same_theirs}/{len(rows)}':>6}"
              f"{med[3]:>16.1f}{med[4]:>15.1f}{med[5]:>7.1%}{f'{same_ours}/{len(rows)}':>6}"
              f"{med[4] / med[1]:>11.2f}x{med[6]:>11.0f}")
    print(f"medians over {len(PROMPTS)} prompts, {a.n} tokens each; 'same': greedy speculative answers equal to the "
          "same tool's plain answer")


if __name__ == "__main__":
    main()
