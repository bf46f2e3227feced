"""The hidden-state head drafters the tests run (MTP layers, EAGLE-3 heads, Gemma 4's assistant, DFlash and DSpark
block drafts), each with the tiny models it drafts for, and ``run``: one generation to its ``Done``. test_heads.py runs the checks every head must pass
for each of them; each head's own test file, what it alone does."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams

from .tiny_block import write_block_pair, write_dspark_pair
from .tiny_eagle3 import write_eagle3_pair
from .tiny_gemma4 import write_gemma4_pair
from .tiny_recurrent import write_recurrent


@dataclass(frozen=True)
class Head:
    name: str
    drafter: str  # the drafter the shared checks ask for
    write: Callable[[Path], tuple[Path, Path | None]]  # folder -> (target, head file; None: the target carries it)


HEADS = {h.name: h for h in [
    # a tiny Qwen3.5 (hybrid: gated DeltaNet + attention) carrying one MTP layer
    Head("mtp", "mtp", lambda folder: (write_recurrent(folder / "qwen35-mtp.gguf", "qwen35", seed=3, mtp=1), None)),
    # the same model converted without its MTP layer, and that layer in a side file (convert_hf_to_gguf.py --mtp)
    Head("mtp-file", "mtp", lambda folder: write_mtp_split(folder)),
    # a tiny llama and an eagle3 GGUF that reads three of its layers
    Head("eagle3", "eagle3", write_eagle3_pair),
    # a tiny Gemma 4 and its gemma4-assistant, which reads the target's cache (context 0.3 loops on a long second turn)
    Head("gemma4", "model", lambda folder: write_gemma4_pair(folder, context=0.2)),
    # a tiny llama and block drafts reading two of its layers' inputs (tiny_block says how they agree with it)
    Head("dflash", "dflash", write_block_pair),
    Head("dflash2", "dflash", lambda folder: write_block_pair(folder, selector_top_k=4)),
    Head("dspark", "dspark", write_dspark_pair),
]}


def write_mtp_split(folder: Path, seed: int = 3) -> tuple[Path, Path]:
    """(trunk, side file): the tiny Qwen3.5 of the "mtp" head, split as llama.cpp's converter splits it."""
    return tuple(write_recurrent(folder / name, "qwen35", seed=seed, mtp=1, part=part)
                 for name, part in (("qwen35-trunk.gguf", "trunk"), ("mtp-qwen35.gguf", "mtp")))


def run(engine: Engine, ids, drafter: str, max_tokens: int = 200, temperature: float = 0.0, grammar=None,
        **draft) -> Done:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=temperature, seed=1),
                              draft=DraftParams(**draft), grammar=grammar)
    events = list(engine.generate(ids, params, drafter))
    assert isinstance(events[-1], Done)
    return events[-1]


def drafted(target: Path, file: Path, drafter: str) -> int:
    """How many tokens a pair loaded afresh drafts in a short answer (closed after): that it still loads and drafts
    after refusals."""
    e = Engine(ModelSettings(target, n_ctx=256), ModelSettings(file, n_ctx=256))
    try:
        return run(e, [1, 300, 301], drafter, max_tokens=8).stats.n_drafted
    finally:
        e.close()
