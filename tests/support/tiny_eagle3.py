"""Write a tiny llama target and an EAGLE-3 head for it (``general.architecture = eagle3``) as GGUF files.

Random weights draft nothing the target accepts, so the pair is made to partly agree: the target is nearly a bigram
model (``context`` scales what its attention and feed-forward add, see tiny_gguf), and the head computes that bigram
model: its attention looks at its own row (queries and keys are a large multiple of the token's normed embedding)
and passes the embedding on, scaled by ``gain`` so the target's feature g, added as the residual, only perturbs it;
its output head and token embeddings are the target's (borrowed through llama.cpp's ``ctx_other``, as heads trained
for Llama 3.1 8B do) or copies (with ``draft_vocab``: a smaller draft vocabulary mapped to target ids by ``d2t``, as
most published heads have). The vocabulary is tiny_gguf's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .tiny_gguf import EOG_IDS, vocab, write_model


def write_eagle3_pair(folder: Path, seed: int = 0, context: float = 0.2, n_layer: int = 3, **head) -> tuple[Path, Path]:
    """(target, head) paths: a tiny llama target, nearly a bigram model, and a head for it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = write_model(folder / "tiny-eagle3-target.gguf", seed=seed, n_layer=n_layer, context=context)
    name = f"tiny-eagle3-head{'-d2t' if head.get('draft_vocab') else ''}.gguf"
    return target, write_eagle3_head(folder / name, target, seed=seed, **head)


def write_eagle3_head(head: Path, target: Path, seed: int = 0, gain: float = 10.0, layers=(0, 1, 2),
                      draft_vocab: int = 0, n_head: int = 4, target_hidden: int | None = None) -> Path:
    """An EAGLE-3 head for ``target`` (a tiny_gguf or tiny_recurrent model) that computes its bigram model.
    ``target_hidden``: the hidden size it claims to be made for (a head for another model, to test refusals)."""
    from gguf import GGUFReader

    tensors = {t.name: np.array(t.data) for t in GGUFReader(str(target)).tensors}
    n_embd = tensors["token_embd.weight"].shape[1]
    toks = vocab()
    n_vocab = len(toks)
    w = GGUFWriter(str(head), "eagle3")
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_array("eagle3.target_layers", list(layers))
    w.add_uint32("eagle3.target_hidden_size", target_hidden or n_embd)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in toks])
    w.add_token_scores([0.0] * 261 + [-float(i) for i in range(n_vocab - 261)])
    w.add_token_types([int(k) for _, k in toks])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(seed + 1)
    eye = np.eye(n_embd, dtype=np.float32)
    zeros = np.zeros((n_embd, n_embd), dtype=np.float32)
    token_part = np.concatenate([eye, zeros], axis=1)  # from (normed embedding, normed g): the embedding
    n_feat = 3 * (target_hidden or n_embd)
    w.add_tensor("fc.weight", (rng.standard_normal((n_embd, n_feat)) * n_feat ** -0.5).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if draft_vocab:  # some of the target's ids (never its end-of-generation ones) and their output rows
        d2t = np.sort(rng.choice(np.setdiff1d(np.arange(3, n_vocab), EOG_IDS), draft_vocab, replace=False))
        w.add_tensor("output.weight", tensors["output.weight"][d2t])
        w.add_tensor("d2t", d2t.astype(np.int64))
        w.add_tensor("token_embd.weight", tensors["token_embd.weight"])
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor(p + "attn_norm_2.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor(p + "attn_q.weight", 4 * token_part)
    w.add_tensor(p + "attn_k.weight", 4 * token_part)
    w.add_tensor(p + "attn_v.weight", token_part)
    w.add_tensor(p + "attn_output.weight", gain * eye)
    w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor(p + "ffn_gate.weight", (rng.standard_normal((64, n_embd)) * n_embd ** -0.5).astype(np.float32))
    w.add_tensor(p + "ffn_up.weight", (rng.standard_normal((64, n_embd)) * n_embd ** -0.5).astype(np.float32))
    w.add_tensor(p + "ffn_down.weight", np.zeros((n_embd, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return head
