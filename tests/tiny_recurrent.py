"""Write tiny random-weight GGUF models of llama.cpp's recurrent and hybrid architectures, for tests.

Same vocabulary, tokenizer and ChatML template as ``tiny_gguf`` (so prompts, chat templates and draft/target pair
checks behave the same), F32 weights, a few layers of width 64: a one-token decode takes about a millisecond.

Architectures (llama.cpp's names) and what they exercise:

- ``lfm2``: LiquidAI LFM2, short convolution + attention. Supports recurrent-state rollback (``n_rs_seq``).
- ``qwen35``: Qwen3.5, gated DeltaNet + gated attention. Supports rollback.
- ``nemotron_h``: NVIDIA Nemotron-H, Mamba2 + attention + FFN-only layers. Supports rollback.
- ``granitehybrid``: IBM Granite 4.0-H, Mamba2 + attention. Hybrid *without* rollback support.
- ``mamba2`` and ``mamba``: pure recurrent, no rollback support.

``shape`` overrides the per-arch defaults of ``DEFAULTS``; ``pattern`` spells the layer stack, one letter a layer:
``R`` recurrent (conv / DeltaNet / Mamba), ``A`` attention, ``F`` feed-forward only (Nemotron-H).

Tensor shapes follow llama.cpp's loaders (``src/models/<arch>.cpp``), whose dims are ggml's ``ne`` order: numpy
arrays here are the reverse, (rows = outputs, columns = inputs).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tiny_gguf import CHATML, vocab

ARCHS = ("lfm2", "qwen35", "nemotron_h", "granitehybrid", "mamba2", "mamba")
ROLLBACK_ARCHS = ("lfm2", "qwen35", "nemotron_h")  # llm_arch_supports_rs_rollback() in this llama.cpp
HYBRID_ARCHS = ("lfm2", "qwen35", "nemotron_h", "granitehybrid")

_BASE = dict(n_embd=64, extra_words=40, logit_scale=4.0)  # extra_words, logit_scale: as in tiny_gguf
_COMMON = dict(_BASE, n_head=4, n_head_kv=2, n_ff=128)  # attention (GQA) and SwiGLU FFN of the hybrids
DEFAULTS: dict[str, dict] = {
    "lfm2": dict(_COMMON, pattern="RARA", l_cache=3),
    # DeltaNet: n_group key heads and n_ssm_head value heads of d_state each; attention heads of head_dim
    "qwen35": dict(_COMMON, pattern="RARA", head_dim=16, n_rot=16, d_conv=4, d_state=16, n_group=2, n_ssm_head=4),
    # Mamba2 mixers: d_inner = 2 * n_embd split into n_ssm_head heads; B and C shared by n_group groups
    "nemotron_h": dict(_COMMON, pattern="RARF", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    "granitehybrid": dict(_COMMON, pattern="RARA", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    "mamba2": dict(_BASE, pattern="RR", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    # Mamba 1: per-channel states of d_state; dt through a rank-dt_rank projection
    "mamba": dict(_BASE, pattern="RR", d_conv=4, d_state=16, dt_rank=4, d_inner=128),
}

_EOG_ROWS = [2, 260]  # "</s>", "<|im_end|>": see tiny_gguf (answers run long unless a test sets EOS itself)


class _Weights:
    """Random tensors drawn in a fixed order, so a draft (``base_seed`` = the target's seed, ``noise`` > 0) gets
    exactly its target's weights plus ``noise * N(0, 1)`` scaled like tiny_gguf (by ``fan_in ** -0.5``).

    Norm weights and the skip term D stay exact copies: they are structure, not something to perturb."""

    def __init__(self, seed: int, base_seed: int | None, noise: float):
        self.rng = np.random.default_rng(seed if base_seed is None else base_seed)
        self.noise_rng = np.random.default_rng(seed + 10_000)
        self.noise = noise

    def rand(self, *shape: int, scale: float | None = None) -> np.ndarray:
        a = self.rng.standard_normal(shape).astype(np.float32) * (scale if scale is not None else shape[-1] ** -0.5)
        if self.noise:
            a += self.noise_rng.standard_normal(shape).astype(np.float32) * self.noise * (shape[-1] ** -0.5)
        return a

    def decay(self, *shape: int) -> np.ndarray:
        """Mamba-style A (or -exp(A_log)): must be negative so the state decays instead of blowing up. Magnitudes
        in about [0.2, 2] keep a few tokens of memory at softplus(dt) ~ 0.1..1."""
        return -(0.2 + np.abs(self.rand(*shape, scale=1.0)))

    @staticmethod
    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)


def write_recurrent(
    path: Path,
    arch: str,
    seed: int = 0,
    base_seed: int | None = None,
    noise: float = 0.0,
    n_ctx: int = 4096,
    **shape,
) -> Path:
    """Write a tiny ``arch`` model to ``path``. ``base_seed`` + ``noise``: a draft that is a perturbed copy of the
    target written with ``seed=base_seed`` (same arch and shape). Deterministic: same arguments, same bytes."""
    if arch not in DEFAULTS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")
    unknown = set(shape) - set(DEFAULTS[arch])
    if unknown:
        raise TypeError(f"{arch} has no shape option(s) {sorted(unknown)}; it takes {sorted(DEFAULTS[arch])}")
    s = {**DEFAULTS[arch], **shape}
    pattern = s["pattern"]
    if set(pattern) - set("RAF" if arch == "nemotron_h" else "RA") or (arch in HYBRID_ARCHS) != ("A" in pattern):
        raise ValueError(f"bad layer pattern {pattern!r} for {arch}")

    toks = vocab(s["extra_words"])
    n_vocab, n_embd = len(toks), s["n_embd"]
    w = GGUFWriter(str(path), arch)
    _add_vocab(w, toks)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(pattern))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32

    r = _Weights(seed, base_seed, noise)
    w.add_tensor("token_embd.weight", r.rand(n_vocab, n_embd, scale=1.0))
    _LAYERS[arch](w, r, s)
    # LFM2's final norm goes by the name "token_embd_norm" (a historical misnaming llama.cpp keeps)
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", r.ones(n_embd))
    out = r.rand(n_vocab, n_embd, scale=s["logit_scale"] * n_embd ** -0.5)
    out[_EOG_ROWS] = 0.0
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_vocab(w: GGUFWriter, toks) -> None:
    """tiny_gguf's SentencePiece-style vocabulary, exactly (so tiny_gguf models and these share a tokenizer)."""
    n_vocab = len(toks)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in toks])
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [0.0, 0.0] + [-float(i) for i in range(n_vocab - 261)])
    w.add_token_types([int(k) for _, k in toks])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)


def _ffn(w: GGUFWriter, r: _Weights, p: str, n_embd: int, n_ff: int, norm: bool = True) -> None:
    """SwiGLU feed-forward; ``norm``: its own ffn_norm (Qwen3.5 norms with post_attention_norm instead)."""
    if norm:
        w.add_tensor(p + "ffn_norm.weight", r.ones(n_embd))
    w.add_tensor(p + "ffn_gate.weight", r.rand(n_ff, n_embd))
    w.add_tensor(p + "ffn_up.weight", r.rand(n_ff, n_embd))
    w.add_tensor(p + "ffn_down.weight", r.rand(n_embd, n_ff))


def _attn(w: GGUFWriter, r: _Weights, p: str, n_embd: int, n_q: int, n_kv: int, n_out: int | None = None) -> None:
    """Separate q/k/v/output projections: ``n_q``, ``n_kv`` output widths; ``n_out`` the output's input width."""
    w.add_tensor(p + "attn_q.weight", r.rand(n_q, n_embd))
    w.add_tensor(p + "attn_k.weight", r.rand(n_kv, n_embd))
    w.add_tensor(p + "attn_v.weight", r.rand(n_kv, n_embd))
    w.add_tensor(p + "attn_output.weight", r.rand(n_embd, n_out or n_q))


def _head_kv_per_layer(s: dict) -> list[int]:
    # LFM2, Granite-H and Nemotron-H tell a recurrent layer by head_count_kv == 0 (Nemotron-H also by n_ff == 0)
    return [s["n_head_kv"] if c == "A" else 0 for c in s["pattern"]]


# --- LFM2 (src/models/lfm2.cpp) ---------------------------------------------------------------------------------
def _lfm2(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_kv = s["n_embd"], s["n_head"], s["n_head_kv"]
    head_dim = n_embd // n_head
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(_head_kv_per_layer(s))
    w.add_shortconv_l_cache(s["l_cache"])  # conv kernel width; the state keeps l_cache - 1 columns
    for i, kind in enumerate(s["pattern"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))  # the "operator norm", before conv or attention
        if kind == "A":
            w.add_tensor(p + "attn_q_norm.weight", r.ones(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", r.ones(head_dim))
            _attn(w, r, p, n_embd, n_embd, head_dim * n_kv)
        else:
            # in_proj yields B, C, x (n_embd each): y = C * conv(B * x)
            w.add_tensor(p + "shortconv.in_proj.weight", r.rand(3 * n_embd, n_embd))
            w.add_tensor(p + "shortconv.conv.weight", r.rand(n_embd, s["l_cache"]))
            w.add_tensor(p + "shortconv.out_proj.weight", r.rand(n_embd, n_embd))
        _ffn(w, r, p, n_embd, s["n_ff"])


# --- Qwen3.5 (src/models/qwen35.cpp, delta-net-base.cpp) -----------------------------------------------------
def _qwen35(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_kv, head_dim = s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"]
    pattern = s["pattern"]
    # Qwen3.5 marks layers by full_attention_interval: layer i attends iff (i + 1) % interval == 0
    interval = pattern.index("A") + 1
    if pattern != ("R" * (interval - 1) + "A") * (len(pattern) // interval) + "R" * (len(pattern) % interval):
        raise ValueError(f"qwen35 layers must repeat R..RA (full_attention_interval), not {pattern!r}")
    d_state, n_k_heads, n_v_heads = s["d_state"], s["n_group"], s["n_ssm_head"]
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(s["n_rot"])
    # interleaved M-RoPE: the sections (in rotary pairs) cover n_rot / 2; text positions make them all alike
    n_pairs = s["n_rot"] // 2
    w.add_rope_dimension_sections([n_pairs - 2 * (n_pairs // 4), n_pairs // 4, n_pairs // 4, 0])
    w.add_full_attention_interval(interval)
    w.add_ssm_conv_kernel(s["d_conv"])
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)
    for i, kind in enumerate(pattern):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        w.add_tensor(p + "post_attention_norm.weight", r.ones(n_embd))  # the FFN's input norm
        if kind == "A":
            # q projects to query + output gate (2 x head_dim per head)
            _attn(w, r, p, n_embd, 2 * head_dim * n_head, head_dim * n_kv, n_out=head_dim * n_head)
            w.add_tensor(p + "attn_q_norm.weight", r.ones(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", r.ones(head_dim))
        else:
            w.add_tensor(p + "attn_qkv.weight", r.rand(conv_dim, n_embd))
            w.add_tensor(p + "attn_gate.weight", r.rand(value_dim, n_embd))  # z, the output norm's gate
            w.add_tensor(p + "ssm_conv1d.weight", r.rand(conv_dim, s["d_conv"]))
            w.add_tensor(p + "ssm_dt.bias", r.rand(n_v_heads, scale=0.5))
            w.add_tensor(p + "ssm_a", r.decay(n_v_heads))  # gate = softplus(alpha + dt_bias) * a: log-decay < 0
            w.add_tensor(p + "ssm_beta.weight", r.rand(n_v_heads, n_embd))
            w.add_tensor(p + "ssm_alpha.weight", r.rand(n_v_heads, n_embd))
            w.add_tensor(p + "ssm_norm.weight", r.ones(d_state))
            w.add_tensor(p + "ssm_out.weight", r.rand(n_embd, value_dim))
        _ffn(w, r, p, n_embd, s["n_ff"], norm=False)


# --- Mamba2 mixers: mamba2, granitehybrid, nemotron_h (src/models/mamba-base.cpp) -----------------------------
def _ssm_keys(w: GGUFWriter, s: dict) -> None:
    w.add_ssm_conv_kernel(s["d_conv"])
    w.add_ssm_inner_size(s["d_inner"])
    w.add_ssm_state_size(s["d_state"])
    w.add_ssm_time_step_rank(s["n_ssm_head"])
    w.add_ssm_group_count(s["n_group"])


def _mamba2_mixer(w: GGUFWriter, r: _Weights, p: str, s: dict) -> None:
    n_embd, d_inner, n_heads, n_group = s["n_embd"], s["d_inner"], s["n_ssm_head"], s["n_group"]
    conv_dim = d_inner + 2 * n_group * s["d_state"]  # x, B, C go through the convolution
    # in_proj yields z (gate), xBC, dt (one per head)
    w.add_tensor(p + "ssm_in.weight", r.rand(d_inner + conv_dim + n_heads, n_embd))
    w.add_tensor(p + "ssm_conv1d.weight", r.rand(conv_dim, s["d_conv"]))
    w.add_tensor(p + "ssm_conv1d.bias", r.rand(conv_dim, scale=0.1))
    w.add_tensor(p + "ssm_dt.bias", r.rand(n_heads, scale=0.5) - 1.0)  # softplus -> dt around 0.3
    w.add_tensor(p + "ssm_a", r.decay(n_heads, 1))
    w.add_tensor(p + "ssm_d", r.ones(n_heads, 1))
    w.add_tensor(p + "ssm_norm.weight", r.ones(n_group, d_inner // n_group))
    w.add_tensor(p + "ssm_out.weight", r.rand(n_embd, d_inner))


def _mamba2(w: GGUFWriter, r: _Weights, s: dict) -> None:
    # what convert_hf_to_gguf writes: no attention and no FFN, but the keys are read
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    _ssm_keys(w, s)
    for i in range(len(s["pattern"])):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(s["n_embd"]))
        _mamba2_mixer(w, r, p, s)


def _granitehybrid(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head = s["n_embd"], s["n_head"]
    head_dim = n_embd // n_head
    if s["d_inner"] != 2 * n_embd:
        raise ValueError("granitehybrid: llama.cpp supports only d_inner == 2 * n_embd")
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(_head_kv_per_layer(s))
    _ssm_keys(w, s)
    # Granite's embedding/residual/logit/attention multipliers are optional and default to off: left out
    for i, kind in enumerate(s["pattern"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        if kind == "A":
            _attn(w, r, p, n_embd, n_embd, head_dim * s["n_head_kv"])
        else:
            _mamba2_mixer(w, r, p, s)
        _ffn(w, r, p, n_embd, s["n_ff"])


def _nemotron_h(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, pattern = s["n_embd"], s["n_head"], s["pattern"]
    head_dim = n_embd // n_head
    # layer kind by (head_count_kv, feed_forward_length): Mamba2 (0, 0), attention (>0, 0), FFN-only (0, >0)
    w.add_feed_forward_length([s["n_ff"] if c == "F" else 0 for c in pattern])
    w.add_head_count(n_head)
    w.add_head_count_kv(_head_kv_per_layer(s))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_eps(1e-5)  # required (the MTP head's norm), besides the RMS eps
    _ssm_keys(w, s)
    for i, kind in enumerate(pattern):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))  # every block's only norm
        if kind == "A":
            _attn(w, r, p, n_embd, n_embd, head_dim * s["n_head_kv"])
        elif kind == "R":
            _mamba2_mixer(w, r, p, s)
        else:  # squared-ReLU MLP, ungated, normed by attn_norm
            w.add_tensor(p + "ffn_up.weight", r.rand(s["n_ff"], n_embd))
            w.add_tensor(p + "ffn_down.weight", r.rand(n_embd, s["n_ff"]))


# --- Mamba 1 (src/models/mamba.cpp) -------------------------------------------------------------------------------
def _mamba(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, d_inner, d_state, dt_rank = s["n_embd"], s["d_inner"], s["d_state"], s["dt_rank"]
    if d_inner != 2 * n_embd:
        raise ValueError("mamba: llama.cpp supports only d_inner == 2 * n_embd")
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(s["d_conv"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    for i in range(len(s["pattern"])):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        w.add_tensor(p + "ssm_in.weight", r.rand(2 * d_inner, n_embd))  # x and the gate z
        w.add_tensor(p + "ssm_conv1d.weight", r.rand(d_inner, s["d_conv"]))
        w.add_tensor(p + "ssm_conv1d.bias", r.rand(d_inner, scale=0.1))
        w.add_tensor(p + "ssm_x.weight", r.rand(dt_rank + 2 * d_state, d_inner))  # dt (low rank), B, C
        w.add_tensor(p + "ssm_dt.weight", r.rand(d_inner, dt_rank))
        w.add_tensor(p + "ssm_dt.bias", r.rand(d_inner, scale=0.5) - 1.0)
        w.add_tensor(p + "ssm_a", r.decay(d_inner, d_state))
        w.add_tensor(p + "ssm_d", r.ones(d_inner))
        w.add_tensor(p + "ssm_out.weight", r.rand(n_embd, d_inner))


_LAYERS = {"lfm2": _lfm2, "qwen35": _qwen35, "nemotron_h": _nemotron_h, "granitehybrid": _granitehybrid,
           "mamba2": _mamba2, "mamba": _mamba}
