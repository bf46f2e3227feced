"""Benchmark (not a test): what a draft of another vocabulary should read, the target's rendered text or the
conversation in the draft's own chat template.

Both variants draft through text and are verified by the same target, so their greedy outputs are identical (checked);
what differs is acceptance. Fixed drafts (8 tokens, no --draft-p-min, no adaptive length) isolate how well the draft
predicts. SpecChat's TextDrafter reads the target's text; the other variant is written here.

    python bench/perf_cross_vocab_template.py TARGET.gguf DRAFT.gguf [--prompts tests/prompts/heldout.jsonl]
        [--template NAME_PART FILE.jinja]   # a chat template for a GGUF without one (a base model), by file name

2026-11-24, Gemma 3 270M Q4_K_M (base, given Gemma 2's template) and SmolLM2-135M-Instruct, 8 held-out prompts,
96 tokens: Gemma target, SmolLM2 draft: target's text 78.2% accepted (4.80 per round), own template 66.9% (3.97);
SmolLM2 F32 target, Gemma draft: 21.0% (1.47) vs 18.9% (1.42). The target's text wins both ways.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings, SamplingParams  # noqa: E402
from app.engine.llama import Model  # noqa: E402
from app.engine.drafters import TextDrafter  # noqa: E402
from app.prompts import chat_prompt, chat_tokens  # noqa: E402


class OwnTemplateDrafter(TextDrafter):
    """The prompt rendered with the draft's own chat template, then the answer so far as the target wrote it."""

    def __init__(self, ctx, target: Model, messages: list[dict], n_prompt: int):
        super().__init__(ctx, target)
        self.head = chat_prompt(self.draft, messages).encode()
        self.n_prompt = n_prompt - 1 if target.add_bos else n_prompt  # TextDrafter leaves a leading BOS out

    def _draft_ids(self) -> list[int]:
        answer = self._text[self._ends[self.n_prompt - 1]:] if self.n_prompt > 0 else self._text
        bos = self.draft.piece_special(self.draft.bos).encode() if self.draft.bos >= 0 else b""
        add = self.draft.add_bos and not (bos and self.head.startswith(bos))
        return self.draft.tokenize(self.head + answer, add_special=add, parse_special=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--prompts", default=str(ROOT / "tests" / "prompts" / "heldout.jsonl"))
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--template", nargs=2, action="append", default=[], metavar=("NAME_PART", "FILE"))
    args = ap.parse_args()
    overrides = [(part, Path(f).read_text()) for part, f in args.template]
    own = Model.chat_template
    Model.chat_template = lambda self: next((t for part, t in overrides if part in self.path.name), None) or own(self)

    prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()]
    engine = Engine(ModelSettings(args.target, n_ctx=2048), ModelSettings(args.draft, n_ctx=2048))
    if not engine.cross_vocab:
        sys.exit("The two models share a vocabulary: nothing to compare.")
    params = GenerationParams(max_tokens=args.tokens, sampling=SamplingParams(temperature=0.0),
                              draft=DraftParams(draft_max=8, draft_p_min=0.0, adaptive=False))
    totals = {"target's text": [0, 0, 0], "own template": [0, 0, 0]}
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        ids = chat_tokens(engine.model, messages)
        outputs = []
        for name in totals:
            drafter = (TextDrafter(engine.draft.ctx, engine.target.model) if name == "target's text"
                       else OwnTemplateDrafter(engine.draft.ctx, engine.target.model, messages, len(ids)))
            engine.reset()
            done = [ev for ev in engine.generate(ids, params, drafter) if isinstance(ev, Done)][0]
            s = done.stats
            outputs.append(done.token_ids)
            for i, v in enumerate((s.n_drafted, s.n_accepted, s.n_rounds)):
                totals[name][i] += v
        if outputs[0] != outputs[1]:
            sys.exit(f"Outputs differ for {prompt!r}: a bug.")
    for name, (drafted, accepted, rounds) in totals.items():
        print(f"{name:15} acceptance {accepted / max(drafted, 1):.1%}, "
              f"{accepted / max(rounds, 1):.2f} accepted per round")


if __name__ == "__main__":
    main()
