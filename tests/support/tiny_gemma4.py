"""Write a tiny Gemma 4 target and its assistant (``gemma4-assistant``) as GGUF files llama.cpp loads in milliseconds.

The target: a few layers, sliding-window then full attention (as Gemma 4 ends), no per-layer embeddings, MoE or
shared-KV layers. The assistant: Q-only attention over the target's cache, a projection from (token embedding,
target hidden state) in and back out, its token embeddings as its output head.

Random weights draft nothing the target accepts, so ``context`` makes a pair that partly agrees: the target's
token embeddings live in the first ``a_embd`` dimensions and its attention and FFN branches are scaled by
``context`` (Gemma norms each branch's output, so the post-norm weights carry the scale); the target is then a bigram
model plus ``context`` times what the context adds, and the assistant is an exact copy of that bigram model. At 0
every draft is accepted, and fewer as it grows. The vocabulary is tiny_gguf's (the same tokenizer as its models).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .tiny_recurrent import _EOG_ROWS, _add_vocab
from .tiny_gguf import vocab


def _keys(w: GGUFWriter, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, hd, hd_swa, window, pattern) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_key_length_swa(hd_swa)
    w.add_value_length_swa(hd_swa)
    w.add_rope_dimension_count(hd)
    w.add_rope_dimension_count_swa(hd_swa)
    w.add_rope_freq_base(1_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern(pattern)  # True: sliding-window layer
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)


def _done(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma4_pair(folder: Path, seed: int = 0, context: float = 0.3, n_embd: int = 64, n_layer: int = 3,
                      a_embd: int = 32, a_layer: int = 2, n_head: int = 2, n_head_kv: int = 1, hd: int = 32,
                      hd_swa: int = 16, window: int = 8, n_ctx: int = 1024, a_hd: int | None = None,
                      a_target_embd: int | None = None) -> tuple[Path, Path]:
    """(target, assistant) paths. ``a_hd``, ``a_target_embd``: an assistant made for another target (its key length,
    the hidden size it expects), to test the refusals."""
    rng = np.random.default_rng(seed)

    def rand(*shape, scale=None):
        return (rng.standard_normal(shape) * (shape[-1] ** -0.5 if scale is None else scale)).astype(np.float32)

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    toks = vocab()
    n_vocab = len(toks)
    pattern = [True] * (n_layer - 1) + [False]
    rope_freqs = np.ones(hd // 2, dtype=np.float32)

    target = folder / "tiny-gemma4.gguf"
    w = GGUFWriter(str(target), "gemma4")
    _keys(w, n_ctx, n_embd, n_layer, 128, n_head, n_head_kv, hd, hd_swa, window, pattern)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    _add_vocab(w, toks)
    emb = rand(n_vocab, n_embd, scale=1.0)
    emb[:, a_embd:] = 0.0
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("rope_freqs.weight", rope_freqs)
    for i in range(n_layer):
        d, p = hd_swa if pattern[i] else hd, f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(n_embd))
        w.add_tensor(p + "attn_q.weight", rand(d * n_head, n_embd))
        w.add_tensor(p + "attn_k.weight", rand(d * n_head_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", rand(d * n_head_kv, n_embd))
        w.add_tensor(p + "attn_output.weight", rand(n_embd, d * n_head))
        w.add_tensor(p + "attn_q_norm.weight", ones(d))
        w.add_tensor(p + "attn_k_norm.weight", ones(d))
        w.add_tensor(p + "post_attention_norm.weight", context * ones(n_embd))
        w.add_tensor(p + "ffn_norm.weight", ones(n_embd))
        w.add_tensor(p + "ffn_gate.weight", rand(128, n_embd))
        w.add_tensor(p + "ffn_up.weight", rand(128, n_embd))
        w.add_tensor(p + "ffn_down.weight", rand(n_embd, 128))
        w.add_tensor(p + "post_ffw_norm.weight", context * ones(n_embd))
        w.add_tensor(p + "layer_output_scale.weight", ones(1))
    w.add_tensor("output_norm.weight", ones(n_embd))
    out = rand(n_vocab, n_embd, scale=4 * n_embd ** -0.5)
    out[_EOG_ROWS] = 0.0  # (so a sampled run does not stop early)
    w.add_tensor("output.weight", out)
    _done(w)

    a_hd = a_hd or hd
    a_pattern = [True] * (a_layer - 1) + [False]
    assistant = folder / "tiny-gemma4-assistant.gguf"
    w = GGUFWriter(str(assistant), "gemma4-assistant")
    _keys(w, n_ctx, a_embd, a_layer, 64, n_head, n_head_kv, a_hd, hd_swa, window, a_pattern)
    w.add_embedding_length_out(a_target_embd or n_embd)  # the target's hidden size
    w.add_nextn_predict_layers(a_layer)  # every layer is a next-token-prediction layer
    _add_vocab(w, toks)
    w.add_tensor("token_embd.weight", out[:, :a_embd].copy())  # also its output head: the target's bigram head
    w.add_tensor("output_norm.weight", ones(a_embd))
    pre = np.zeros((a_embd, 2 * (a_target_embd or n_embd)), dtype=np.float32)
    pre[:, :a_embd] = np.eye(a_embd, dtype=np.float32)  # the token's embedding in, the hidden state ignored
    w.add_tensor("nextn.pre_projection.weight", pre)
    w.add_tensor("nextn.post_projection.weight", rand(a_target_embd or n_embd, a_embd))
    w.add_tensor("rope_freqs.weight", np.ones(a_hd // 2, dtype=np.float32))
    for i in range(a_layer):
        d, p = hd_swa if a_pattern[i] else a_hd, f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(a_embd))
        w.add_tensor(p + "attn_q.weight", rand(d * n_head, a_embd))
        w.add_tensor(p + "attn_output.weight", np.zeros((a_embd, d * n_head), dtype=np.float32))
        w.add_tensor(p + "attn_q_norm.weight", ones(d))
        w.add_tensor(p + "post_attention_norm.weight", ones(a_embd))
        w.add_tensor(p + "ffn_norm.weight", ones(a_embd))
        w.add_tensor(p + "ffn_gate.weight", rand(64, a_embd))
        w.add_tensor(p + "ffn_up.weight", rand(64, a_embd))
        w.add_tensor(p + "ffn_down.weight", np.zeros((a_embd, 64), dtype=np.float32))
        w.add_tensor(p + "post_ffw_norm.weight", ones(a_embd))
        w.add_tensor(p + "layer_output_scale.weight", ones(1))
    _done(w)
    return target, assistant
