"""Write tiny but real llama-architecture GGUF models (random weights) that llama.cpp loads in milliseconds; or
gemma3-architecture ones (``sliding_window``: llama.cpp's SWA cache, as Gemma 3 uses it).

The vocabulary is SentencePiece-style: <unk> <s> </s>, 256 byte tokens (so any text tokenizes via byte
fallback), then word pieces. Options make variants that differ in exactly one way llama.cpp's pair rule checks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

WORDS = ["▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁and", "▁ran", "▁to", "▁big", "▁red", "▁sun",
         "▁is", "▁hot", "▁it", "▁was", "▁day", "▁one", "▁two", ".", ",", "▁I", "▁you", "▁we", "▁like", "▁code"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EOG_IDS = [2, 260]  # "</s>" and "<|im_end|>": where vocab() puts them


def vocab(extra_words: int = 40, rename: dict[int, str] | None = None) -> list[tuple[str, int]]:
    toks = [("<unk>", TokenType.UNKNOWN), ("<s>", TokenType.CONTROL), ("</s>", TokenType.CONTROL)]
    toks += [(f"<0x{b:02X}>", TokenType.BYTE) for b in range(256)]
    toks += [("<|im_start|>", TokenType.CONTROL), ("<|im_end|>", TokenType.CONTROL)]
    words = WORDS + [f"▁w{i}" for i in range(extra_words)]
    toks += [(w, TokenType.NORMAL) for w in words]
    for i, text in (rename or {}).items():
        toks[i] = (text, toks[i][1])
    return toks


def write_model(
    path: Path,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    n_ctx: int = 512,
    extra_words: int = 40,
    rename: dict[int, str] | None = None,
    bos: int | None = 1,  # None: no tokenizer.ggml.bos_token_id key (llama.cpp then assumes its default id)
    eos: int = 2,
    add_bos: bool = True,
    vocab_model: str = "llama",
    base_seed: int | None = None,
    noise: float = 0.0,
    logit_scale: float = 4.0,
    split_max_tensors: int = 0,
    chat_template: str = CHATML,
    sliding_window: int = 0,
    permute_seed: int | None = None,
    extra_pieces: tuple[str, ...] = (),
    user_defined: tuple[str, ...] = (),
    control: tuple[str, ...] = (),
    context: float = 1.0,
    rope_sections: tuple[int, ...] = (),
) -> Path:
    """Write a model. ``base_seed`` + ``noise``: weights = weights(base_seed) + noise * N(0, 1), so a draft can be
    a perturbed copy of a target (partial acceptance, exercising both accept and reject paths).
    ``split_max_tensors``: write a split GGUF (``name-0000k-of-0000N.gguf`` beside ``path``) as llama.cpp's
    gguf-split does; returns the first shard.
    ``permute_seed``: the word tokens (and their weight rows and scores) at other ids, so the model computes the
    same text function in another vocabulary (a cross-vocabulary draft). ``extra_pieces``: pieces appended to the
    vocabulary with the best scores (different merges), their weights fresh. ``context``: scales what attention and
    the feed-forward add to each position in a llama model (small: nearly a bigram model of its token embeddings).
    ``rope_sections``: a qwen2vl model (llama's tensors, M-RoPE positions in these sections), as Qwen2-VL's."""
    toks = vocab(extra_words, rename)
    n_base = len(toks)
    scores = [0.0] * 3 + [0.0] * 256 + [0.0, 0.0] + [-float(i) for i in range(n_base - 261)]
    order = np.arange(n_base)
    if permute_seed is not None:
        order[261:] = 261 + np.random.default_rng(permute_seed).permutation(n_base - 261)
        toks = [toks[i] for i in order]
        scores = [scores[i] for i in order]
    toks += [(piece, TokenType.NORMAL) for piece in extra_pieces]
    toks += [(piece, TokenType.USER_DEFINED) for piece in user_defined]  # (as Qwen's <tool_call>)
    toks += [(piece, TokenType.CONTROL) for piece in control]  # (as Mistral's [TOOL_CALLS])
    extra_pieces = (*extra_pieces, *user_defined, *control)
    scores += [1.0] * len(extra_pieces)
    gemma = sliding_window > 0
    arch = "gemma3" if gemma else "qwen2vl" if rope_sections else "llama"
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if rope_sections:
        w.add_array(f"{arch}.rope.dimension_sections", list(rope_sections))
    if gemma:
        w.add_sliding_window(sliding_window)
        w.add_key_length(n_embd // n_head)
        w.add_value_length(n_embd // n_head)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model(vocab_model)
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in toks])
    w.add_token_scores(scores)
    w.add_token_types([int(k) for _, k in toks])
    if vocab_model == "gpt2":
        w.add_token_merges(["▁ t", "h e"])
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    w.add_chat_template(chat_template)

    rng = np.random.default_rng(seed if base_seed is None else base_seed)
    noise_rng = np.random.default_rng(seed + 10_000)

    def t(*shape, scale=None):
        a = rng.standard_normal(shape).astype(np.float32) * (scale if scale is not None else shape[-1] ** -0.5)
        if noise:
            a += noise_rng.standard_normal(shape).astype(np.float32) * noise * (shape[-1] ** -0.5)
        return a

    def rows(a: np.ndarray) -> np.ndarray:  # the base vocabulary's rows in this vocabulary's order, then extras
        extra = np.random.default_rng(seed + 20_000).standard_normal((len(extra_pieces), a.shape[1]))
        return np.concatenate([a[order], (extra * a.std()).astype(np.float32)])

    w.add_tensor("token_embd.weight", rows(t(n_base, n_embd, scale=1.0)))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", t(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", t(n_embd, n_embd))
        w.add_tensor(p + "attn_v.weight", t(n_embd, n_embd))
        w.add_tensor(p + "attn_output.weight", t(n_embd, n_embd) * context)
        if gemma:  # Gemma's extra norms: on q and k per head, and after attention and after the feed-forward
            for name, size in (("attn_q_norm", n_embd // n_head), ("attn_k_norm", n_embd // n_head),
                               ("post_attention_norm", n_embd), ("post_ffw_norm", n_embd)):
                w.add_tensor(p + name + ".weight", np.ones(size, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", t(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", t(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", t(n_embd, n_ff) * context)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    out = t(n_base, n_embd, scale=logit_scale * n_embd ** -0.5)
    out[EOG_IDS] = 0.0  # "</s>", "<|im_end|>" score 0, far below the top: outputs run long unless a test sets EOS
    w.add_tensor("output.weight", rows(out))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path
