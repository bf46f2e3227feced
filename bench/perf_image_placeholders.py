"""Benchmark (not a test): what a drafter that reads text should see of an image in the prompt. The target reads the
image through its projector; a draft model or n-gram lookup cannot, so it reads the history with each image either
left out (SpecChat's choice), replaced by the media marker's tokens, or replaced by pad tokens as many as the image
takes positions.

Every variant is verified by the same target, so greedy outputs are identical (checked); what differs is
acceptance. Fixed drafts (no adaptive length) isolate how well the draft predicts. Without arguments it writes the
tests' tiny sets (tests/support/tiny_vision.py: a llava-type and a Qwen2-VL-type projector on random-weight
models); or give a real TARGET, DRAFT and MMPROJ and images.

    python bench/perf_image_placeholders.py [--target T --draft D --mmproj P --image I ...] [--tokens 120]

2026-11-25, the tiny sets, 4 images × 3 prompts × 120 tokens, accepted/drafted (left out / marker / pads):
llava-type: draft model 353/790 (44.7%) / 372/762 (48.8%) / 363/790 (45.9%); n-gram 394/1148 (34.3%) / the same /
394/1132 (34.8%). qwen2vl-type: draft model 310/908 (34.1%) / 302/979 (30.8%) / 320/836 (38.3%); n-gram 466/947
(49.2%) for all three. No variant wins on both sets (random weights give no reason to); leaving the image out costs
the draft nothing for its positions, so SpecChat does that. Real pairs may differ: run it on yours.
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from app.engine import DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams  # noqa: E402
from app.engine.images import TextOnly  # noqa: E402
from app.prompts import chat_tokens  # noqa: E402

TEXTS = ["the cat sat on the mat and", "I like code, you like the big red sun", "one two one two the dog ran to"]


def tiny_sets(d: Path) -> dict:
    from support.tiny_gguf import write_model
    from support.tiny_vision import png_bytes, write_projector, write_qwen2vl_projector

    images = [png_bytes(seed) for seed in range(4)]
    llava = (write_model(d / "t.gguf", seed=3), write_model(d / "d.gguf", seed=4, base_seed=3, noise=0.3),
             write_projector(d / "mm.gguf"))
    s = (2, 3, 3, 0)
    qwen = (write_model(d / "qt.gguf", seed=5, rope_sections=s),
            write_model(d / "qd.gguf", seed=6, base_seed=5, noise=0.3, rope_sections=s),
            write_qwen2vl_projector(d / "qmm.gguf"))
    return {"llava-type": (llava, images), "qwen2vl-type": (qwen, images)}


def measure(files, images, n_tokens: int) -> None:
    target, draft, mmproj = files
    e = Engine(ModelSettings(target), ModelSettings(draft), mmproj)
    params = GenerationParams(max_tokens=n_tokens, sampling=SamplingParams(temperature=0),
                              draft=DraftParams(adaptive=False))
    marker = tuple(e.model.tokenize(e.projector.marker, add_special=False))
    pad = e.model.tokenize(" w5", add_special=False)[-1:]
    for kind in ("model", "ngram"):
        for name, placeholder in (("left out", ()), ("marker", marker), ("pads", None)):
            drafted = accepted = 0
            for image in images:
                for text in TEXTS:
                    ids = chat_tokens(e.model, [{"role": "user", "content": [
                        {"type": "image", "image": image}, {"type": "text", "text": text}]}], e.projector)
                    e.reset()
                    plain = list(e.generate(ids, params, "none"))[-1]
                    e.reset()
                    ph = placeholder if placeholder is not None else tuple(pad) * e.projector.n_tokens(min(ids))
                    done = list(e.generate(ids, params, TextOnly(e.make_drafter(kind, params), ph)))[-1]
                    assert done.token_ids == plain.token_ids
                    drafted, accepted = drafted + done.stats.n_drafted, accepted + done.stats.n_accepted
            print(f"  {kind:6} {name:9} {accepted}/{drafted} accepted ({accepted / max(drafted, 1):.1%})")
    e.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--mmproj", type=Path)
    ap.add_argument("--image", type=Path, action="append", default=[])
    ap.add_argument("--tokens", type=int, default=120)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.target:
            sets = {args.target.name: ((args.target, args.draft, args.mmproj), [p.read_bytes() for p in args.image])}
        else:
            sets = tiny_sets(Path(tmp))
        for name, (files, images) in sets.items():
            print(name)
            measure(files, images, args.tokens)


if __name__ == "__main__":
    main()
