"""Can this draft model share the target's token ids? llama.cpp's rule (common/speculative.cpp), in plain words.
A pair that cannot drafts as text (``drafters.cross_vocab``)."""
from __future__ import annotations

from .llama import Model

VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
AS_TEXT = "different vocabularies: drafted as text (slower per token, usually lower acceptance)"
_VOCAB_TYPES = {0: "none", 1: "SentencePiece (SPM)", 2: "byte-level BPE", 3: "WordPiece", 4: "Unigram", 5: "RWKV",
                6: "PLaMo-2"}


def compatibility_problems(target: Model, draft: Model) -> list[str]:
    """Every reason the pair cannot share token ids; empty when it can."""
    t, d = target, draft
    problems = []
    if t.vocab_type != d.vocab_type:
        problems.append(
            f"they use different tokenizer types ({_VOCAB_TYPES.get(t.vocab_type, t.vocab_type)} vs "
            f"{_VOCAB_TYPES.get(d.vocab_type, d.vocab_type)})"
        )
    # A file without tokenizer.ggml.bos_token_id (several public Qwen3.5 GGUFs) gets llama.cpp's default id, which
    # says nothing of its tokenizer: when both add a BOS, the ids are compared only where both files name one, and the
    # token texts below decide (a same-vocabulary draft is fed the target's ids, BOS included).
    if t.add_bos != d.add_bos or (t.add_bos and t.bos != d.bos and t.bos_named and d.bos_named):
        problems.append(f"they start text differently (BOS token {t.bos if t.add_bos else 'none'} vs "
                        f"{d.bos if d.add_bos else 'none'})")
    if t.add_eos != d.add_eos or (t.add_eos and t.eos != d.eos):
        problems.append(f"they end text differently (EOS token {t.eos if t.add_eos else 'none'} vs "
                        f"{d.eos if d.add_eos else 'none'})")
    diff = abs(t.n_vocab - d.n_vocab)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        problems.append(
            f"their vocabularies differ in size by {diff} tokens ({t.n_vocab} vs {d.n_vocab}; at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} is allowed)"
        )
    elif not problems:
        for i in range(VOCAB_CHECK_START_TOKEN_ID, min(t.n_vocab, d.n_vocab)):
            if t.token_text(i) != d.token_text(i):
                problems.append(
                    f"token {i} means {t.token_text(i).decode('utf-8', 'replace')!r} to the target but "
                    f"{d.token_text(i).decode('utf-8', 'replace')!r} to the draft"
                )
                break
    return problems
