"""Write tiny random-weight GGUF models of llama.cpp's recurrent and hybrid architectures, for tests.

Same vocabulary, tokenizer and ChatML template as ``tiny_gguf`` (so prompts, chat templates and draft/target pair
checks behave the same), F32 weights, a few layers of width 64: a one-token decode takes about a millisecond.

Architectures (llama.cpp's names) and what they exercise:

- ``lfm2``: LiquidAI LFM2, short convolution + attention. Supports recurrent-state rollback (``n_rs_seq``).
- ``qwen35``: Qwen3.5, gated DeltaNet + gated attention. Supports rollback.
- ``nemotron_h``: NVIDIA Nemotron-H, Mamba2 + attention + FFN-only layers. Supports rollback.
- ``granitehybrid``: IBM Granite 4.0-H, Mamba2 + attention. Hybrid *without* rollback support.
- ``falcon-h1``: TII Falcon-H1, attention and Mamba2 side by side in every layer. Hybrid without rollback.
- ``jamba``: AI21 Jamba, Mamba 1 (with dt/B/C RMS norms) + attention (no RoPE); dense FFNs unless ``n_expert``.
  Hybrid without rollback.
- ``plamo2``: PFN PLaMo-2, a Mamba2-like mixer (one B/C group, RMS-normed dt/B/C) + attention with QK norms, every
  mixer and FFN output RMS-normed again before its residual. Hybrid without rollback.
- ``kimi-linear``: Moonshot Kimi Linear, Kimi Delta Attention (gated DeltaNet with per-channel decay, short
  convolutions on q, k and v) + MLA attention (no RoPE); dense FFNs unless ``n_expert``. Hybrid without rollback.
- ``mamba2``, ``mamba`` and ``rwkv7`` (RWKV-7, "Goose": token shift + generalized delta rule): pure recurrent, no
  rollback support.

``shape`` overrides the per-arch defaults of ``DEFAULTS``; ``pattern`` spells the layer stack, one letter a layer:
``R`` recurrent (conv / DeltaNet / Mamba / RWKV), ``A`` attention, ``F`` feed-forward only (Nemotron-H), ``P``
attention and Mamba2 in parallel (Falcon-H1, whose layers are all alike).

Tensor shapes follow llama.cpp's loaders (``src/models/<arch>.cpp``), whose dims are ggml's ``ne`` order: numpy
arrays here are the reverse, (rows = outputs, columns = inputs).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import ExpertGatingFuncType, GGUFWriter

from .tiny_gguf import CHATML, vocab

ARCHS = ("lfm2", "qwen35", "nemotron_h", "granitehybrid", "mamba2", "mamba", "rwkv7", "falcon-h1", "jamba",
         "plamo2", "kimi-linear")
ROLLBACK_ARCHS = ("lfm2", "qwen35", "nemotron_h")  # llm_arch_supports_rs_rollback() in this llama.cpp
HYBRID_ARCHS = ("lfm2", "qwen35", "nemotron_h", "granitehybrid", "falcon-h1", "jamba", "plamo2", "kimi-linear")
_LETTERS = {"nemotron_h": "RAF", "falcon-h1": "P"}  # the layer kinds an arch's pattern may use; others: "RA"

_BASE = dict(n_embd=64, extra_words=40, logit_scale=4.0)  # extra_words, logit_scale: as in tiny_gguf
_COMMON = dict(_BASE, n_head=4, n_head_kv=2, n_ff=128)  # attention (GQA) and SwiGLU FFN of the hybrids
DEFAULTS: dict[str, dict] = {
    "lfm2": dict(_COMMON, pattern="RARA", l_cache=3),
    # DeltaNet: n_group key heads and n_ssm_head value heads of d_state each; attention heads of head_dim
    # mtp=1: one next-token-prediction (MTP, "nextn") layer after the trunk, as Qwen3.5's GGUFs carry
    "qwen35": dict(_COMMON, pattern="RARA", head_dim=16, n_rot=16, d_conv=4, d_state=16, n_group=2, n_ssm_head=4,
                   mtp=0),
    # Mamba2 mixers: d_inner = 2 * n_embd split into n_ssm_head heads; B and C shared by n_group groups
    "nemotron_h": dict(_COMMON, pattern="RARF", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    "granitehybrid": dict(_COMMON, pattern="RARA", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    "mamba2": dict(_BASE, pattern="RR", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    # Mamba 1: per-channel states of d_state; dt through a rank-dt_rank projection
    "mamba": dict(_BASE, pattern="RR", d_conv=4, d_state=16, dt_rank=4, d_inner=128),
    # RWKV-7: n_embd / head_size heads with a head_size x head_size state each; the lora ranks of the decay (w),
    # in-context learning rate (a), value-residual mix (v) and output gate (g) projections; n_ff the channel mix.
    # One head: ggml's CPU wkv7 kernel needs head_size a multiple of its SIMD step (64 with AVX-512)
    "rwkv7": dict(_BASE, pattern="RR", head_size=64, n_ff=128, lora_decay=8, lora_iclr=8, lora_value_res_mix=8,
                  lora_gate=16),
    # Falcon-H1: every layer attention (GQA, NeoX RoPE) + a Mamba2 mixer, summed, then a SwiGLU FFN
    "falcon-h1": dict(_COMMON, pattern="PP", d_conv=4, d_state=16, n_group=1, n_ssm_head=8, d_inner=128),
    # Jamba: Mamba 1 mixers as in mamba, attention without RoPE; n_expert > 0: MoE FFNs (n_expert_used of them)
    "jamba": dict(_COMMON, pattern="RARA", d_conv=4, d_state=16, dt_rank=4, d_inner=128, n_expert=0,
                  n_expert_used=2),
    # PLaMo-2: n_ssm_head heads of d_inner / n_ssm_head channels, one B/C group of d_state; the low-rank dt is
    # max(64, n_embd / 16) wide (fixed by llama.cpp)
    "plamo2": dict(_COMMON, pattern="RARA", d_conv=4, d_state=16, n_ssm_head=8, d_inner=128),
    # Kimi Linear: KDA layers of n_head heads of head_dim (a head_dim x head_dim state each); MLA layers whose
    # cache holds one latent "KV head" of kv_lora_rank + n_rot (the positional part, unrotated: Kimi's MLA is NoPE),
    # queries of qk_nope + n_rot and values of v_head_dim per head. n_expert > 0: MoE FFNs after the first layer,
    # each n_ff_exp wide, with n_expert_shared shared experts
    "kimi-linear": dict(_COMMON, pattern="RARA", n_head_kv=1, head_dim=16, d_conv=4, kv_lora_rank=32, n_rot=8,
                        qk_nope=16, v_head_dim=16, n_expert=0, n_expert_used=2, n_ff_exp=64, n_expert_shared=1),
}

MTP_QUIET = 0.1  # scale of the MTP layer's own contributions (see _qwen35)
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

    @staticmethod
    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)


def write_recurrent(
    path: Path,
    arch: str,
    seed: int = 0,
    base_seed: int | None = None,
    noise: float = 0.0,
    n_ctx: int = 4096,
    part: str = "",
    **shape,
) -> Path:
    """Write a tiny ``arch`` model to ``path``. ``base_seed`` + ``noise``: a draft that is a perturbed copy of the
    target written with ``seed=base_seed`` (same arch and shape). Deterministic: same arguments, same bytes.

    ``part`` splits a model with an MTP layer as llama.cpp's convert_hf_to_gguf.py does: "trunk" (``--no-mtp``: no
    MTP layer, no nextn key) or "mtp" (``--mtp``: the MTP layer's side file, with only the embeddings, the output
    and that layer; the trunk's metadata). The two parts hold the same weights as the whole."""
    if arch not in DEFAULTS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")
    unknown = set(shape) - set(DEFAULTS[arch])
    if unknown:
        raise TypeError(f"{arch} has no shape option(s) {sorted(unknown)}; it takes {sorted(DEFAULTS[arch])}")
    s = {**DEFAULTS[arch], **shape}
    pattern = s["pattern"]
    if set(pattern) - set(_LETTERS.get(arch, "RA")) or (arch in HYBRID_ARCHS) != bool(set(pattern) & set("AP")):
        raise ValueError(f"bad layer pattern {pattern!r} for {arch}")

    toks = vocab(s["extra_words"])
    n_vocab, n_embd = len(toks), s["n_embd"]
    w = GGUFWriter(str(path), arch) if not part else _Part(GGUFWriter(str(path), arch), part, len(pattern))
    _add_vocab(w, toks)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(pattern) + s.get("mtp", 0))  # (llama.cpp counts MTP layers as blocks after the trunk)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32

    r = _Weights(seed, base_seed, noise)
    w.add_tensor("token_embd.weight", r.rand(n_vocab, n_embd, scale=1.0))
    _LAYERS[arch](w, r, s)
    # LFM2's final norm goes by the name "token_embd_norm" (a historical misnaming llama.cpp keeps)
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", r.ones(n_embd))
    if arch == "rwkv7":  # layer norms, with biases
        w.add_tensor("output_norm.bias", r.zeros(n_embd))
    out = r.rand(n_vocab, n_embd, scale=s["logit_scale"] * n_embd ** -0.5)
    out[_EOG_ROWS] = 0.0
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class _Part:
    """A writer that keeps one part of a model with MTP layers after its ``n_trunk`` layers (see write_recurrent)."""

    SHARED = ("token_embd.weight", "output_norm.weight", "output.weight")

    def __init__(self, w: GGUFWriter, part: str, n_trunk: int):
        if part not in ("trunk", "mtp"):
            raise ValueError(f"part is 'trunk' or 'mtp', not {part!r}")
        self._w, self._part, self._n_trunk = w, part, n_trunk

    def __getattr__(self, name):
        return getattr(self._w, name)

    def add_block_count(self, n: int) -> None:
        self._w.add_block_count(self._n_trunk if self._part == "trunk" else n)

    def add_nextn_predict_layers(self, n: int) -> None:
        if self._part == "mtp":
            self._w.add_nextn_predict_layers(n)

    def add_tensor(self, name: str, data) -> None:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        in_mtp = layer is not None and layer >= self._n_trunk
        if in_mtp if self._part == "trunk" else not (in_mtp or name in self.SHARED):
            return
        self._w.add_tensor(name, data)


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


def _ffn(w: GGUFWriter, r: _Weights, p: str, n_embd: int, n_ff: int, norm: bool = True, quiet: float = 1.0) -> None:
    """SwiGLU feed-forward; ``norm``: its own ffn_norm (Qwen3.5 norms with post_attention_norm instead); ``quiet``
    scales what it adds to the residual stream."""
    if norm:
        w.add_tensor(p + "ffn_norm.weight", r.ones(n_embd))
    w.add_tensor(p + "ffn_gate.weight", r.rand(n_ff, n_embd))
    w.add_tensor(p + "ffn_up.weight", r.rand(n_ff, n_embd))
    w.add_tensor(p + "ffn_down.weight", quiet * r.rand(n_embd, n_ff))


def _attn(w: GGUFWriter, r: _Weights, p: str, n_embd: int, n_q: int, n_kv: int, n_out: int | None = None,
          quiet: float = 1.0) -> None:
    """Separate q/k/v/output projections: ``n_q``, ``n_kv`` output widths; ``n_out`` the output's input width;
    ``quiet`` scales what the layer adds to the residual stream."""
    w.add_tensor(p + "attn_q.weight", r.rand(n_q, n_embd))
    w.add_tensor(p + "attn_k.weight", r.rand(n_kv, n_embd))
    w.add_tensor(p + "attn_v.weight", r.rand(n_kv, n_embd))
    w.add_tensor(p + "attn_output.weight", quiet * r.rand(n_embd, n_out or n_q))


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
    # With an MTP layer the trunk's layers add little to the token embedding too, so that the MTP layer's guess
    # (mostly that embedding, see below) agrees with the target often but not always.
    quiet = MTP_QUIET if s["mtp"] else 1.0
    for i, kind in enumerate(pattern):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        w.add_tensor(p + "post_attention_norm.weight", r.ones(n_embd))  # the FFN's input norm
        if kind == "A":
            # q projects to query + output gate (2 x head_dim per head)
            _attn(w, r, p, n_embd, 2 * head_dim * n_head, head_dim * n_kv, n_out=head_dim * n_head, quiet=quiet)
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
            w.add_tensor(p + "ssm_out.weight", quiet * r.rand(n_embd, value_dim))
        _ffn(w, r, p, n_embd, s["n_ff"], norm=False, quiet=quiet)
    if s["mtp"]:
        # An MTP layer: [enorm(embedding of token t), hnorm(trunk's hidden state at t - 1)] projected back to n_embd
        # (eh_proj), then one attention layer like the trunk's; it shares token_embd, output_norm and output.
        if s["mtp"] != 1:
            raise ValueError("qwen35 carries one MTP layer at most (llama.cpp asserts it)")
        w.add_nextn_predict_layers(1)
        p = f"blk.{len(pattern)}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        w.add_tensor(p + "post_attention_norm.weight", r.ones(n_embd))
        _attn(w, r, p, n_embd, 2 * head_dim * n_head, head_dim * n_kv, n_out=head_dim * n_head, quiet=MTP_QUIET)
        w.add_tensor(p + "attn_q_norm.weight", r.ones(head_dim))
        w.add_tensor(p + "attn_k_norm.weight", r.ones(head_dim))
        _ffn(w, r, p, n_embd, s["n_ff"], norm=False, quiet=MTP_QUIET)
        # Random weights would propose noise (nothing accepted): this layer mostly passes on the token embedding,
        # a guess at the target's next token from the current one that the target sometimes agrees with.
        eh = np.concatenate([np.eye(n_embd, dtype=np.float32), np.zeros((n_embd, n_embd), np.float32)], axis=1)
        w.add_tensor(p + "nextn.eh_proj.weight", eh + MTP_QUIET * r.rand(n_embd, 2 * n_embd))
        w.add_tensor(p + "nextn.enorm.weight", r.ones(n_embd))
        w.add_tensor(p + "nextn.hnorm.weight", r.ones(n_embd))


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


# --- RWKV-7 (src/models/rwkv7.cpp, rwkv7-base.cpp) -----------------------------------------------------------------
def _rwkv7(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, head_size, n_ff = s["n_embd"], s["head_size"], s["n_ff"]
    if n_embd % head_size or head_size % 64:
        # ggml's CPU rwkv_wkv7 steps through a head GGML_F32_STEP floats at a time (32 with AVX2, 64 with AVX-512)
        # with no remainder loop: smaller heads read and write past their rows (garbage logits, heap corruption)
        raise ValueError("rwkv7: head_size must be a multiple of 64 and divide n_embd")
    w.add_feed_forward_length(n_ff)
    w.add_layer_norm_eps(1e-5)  # every RWKV norm is a LayerNorm with a bias
    w.add_wkv_head_size(head_size)
    w.add_decay_lora_rank(s["lora_decay"])
    w.add_iclr_lora_rank(s["lora_iclr"])
    w.add_value_residual_mix_lora_rank(s["lora_value_res_mix"])
    w.add_gate_lora_rank(s["lora_gate"])
    w.add_token_shift_count(2)  # the state keeps the previous token's two normed inputs, time and channel mix

    def lora(p: str, name: str, rank: int) -> None:  # x -> w2 @ tanh / sigmoid / nothing (w1 @ x): low rank
        w.add_tensor(f"{p}time_mix_{name}1.weight", r.rand(rank, n_embd))
        w.add_tensor(f"{p}time_mix_{name}2.weight", r.rand(n_embd, rank))

    w.add_tensor("token_embd_norm.weight", r.ones(n_embd))  # "ln0", on the embeddings
    w.add_tensor("token_embd_norm.bias", r.zeros(n_embd))
    for i in range(len(s["pattern"])):
        p = f"blk.{i}."
        for norm in ("attn_norm", "attn_norm_2"):  # before the time mix and the channel mix
            w.add_tensor(p + norm + ".weight", r.ones(n_embd))
            w.add_tensor(p + norm + ".bias", r.zeros(n_embd))
        # token shift: each of r, w, k, v, a, g mixes this token's input with the previous one's by its own lerp
        w.add_tensor(p + "time_mix_lerp_fused.weight", 0.5 + r.rand(6, 1, 1, n_embd, scale=0.2))
        # decay exp(-0.6065 * sigmoid(w0 + lora)) in (0.55, 1): a few tokens of memory
        w.add_tensor(p + "time_mix_w0.weight", r.rand(n_embd, scale=1.0))
        lora(p, "w", s["lora_decay"])
        w.add_tensor(p + "time_mix_a0.weight", r.rand(n_embd, scale=1.0))  # a = sigmoid(a0 + lora): the ICLR
        lora(p, "a", s["lora_iclr"])
        # the value residual: layer 0's (unused) lora is iclr-ranked, as the loader expects
        w.add_tensor(p + "time_mix_v0.weight", r.rand(n_embd, scale=1.0))
        lora(p, "v", s["lora_iclr"] if i == 0 else s["lora_value_res_mix"])
        lora(p, "g", s["lora_gate"])
        w.add_tensor(p + "time_mix_k_k.weight", 0.85 + r.rand(n_embd, scale=0.1))  # kk = l2norm(k * k_k)
        w.add_tensor(p + "time_mix_k_a.weight", 1.0 + r.rand(n_embd, scale=0.1))
        w.add_tensor(p + "time_mix_r_k.weight", r.rand(n_embd, scale=0.5))  # the per-head bonus term
        w.add_tensor(p + "time_mix_key.weight", r.rand(n_embd, n_embd))
        w.add_tensor(p + "time_mix_value.weight", r.rand(n_embd, n_embd))
        w.add_tensor(p + "time_mix_receptance.weight", r.rand(n_embd, n_embd))
        w.add_tensor(p + "time_mix_ln.weight", r.ones(n_embd))  # group norm of the heads' outputs
        w.add_tensor(p + "time_mix_ln.bias", r.zeros(n_embd))
        w.add_tensor(p + "time_mix_output.weight", r.rand(n_embd, n_embd))
        # channel mix: value @ relu(key @ lerp(x, x_prev))^2
        w.add_tensor(p + "channel_mix_lerp_k.weight", 0.5 + r.rand(1, 1, n_embd, scale=0.2))
        w.add_tensor(p + "channel_mix_key.weight", r.rand(n_ff, n_embd))
        w.add_tensor(p + "channel_mix_value.weight", r.rand(n_embd, n_ff))


# --- Falcon-H1 (src/models/falcon-h1.cpp) -----------------------------------------------------------------------
def _falcon_h1(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_kv = s["n_embd"], s["n_head"], s["n_head_kv"]
    head_dim = n_embd // n_head
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    _ssm_keys(w, s)
    # Falcon-H1's muP multipliers are folded into the weights by convert_hf_to_gguf: nothing to write
    for i in range(len(s["pattern"])):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))  # shared by the attention and the mixer
        _attn(w, r, p, n_embd, n_embd, head_dim * n_kv)
        _mamba2_mixer(w, r, p, s)
        # the FFN's norm goes without the ".weight" suffix (llama.cpp creates it as tn(LLM_TENSOR_FFN_NORM, i))
        w.add_tensor(p + "ffn_norm", r.ones(n_embd))
        _ffn(w, r, p, n_embd, s["n_ff"], norm=False)


# --- Jamba (src/models/jamba.cpp, mamba-base.cpp) -------------------------------------------------------------
def _jamba(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_ff, n_expert = s["n_embd"], s["n_head"], s["n_ff"], s["n_expert"]
    d_inner, d_state, dt_rank = s["d_inner"], s["d_state"], s["dt_rank"]
    head_dim = n_embd // n_head
    if d_inner != 2 * n_embd:
        raise ValueError("jamba: llama.cpp supports only d_inner == 2 * n_embd")
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(_head_kv_per_layer(s))  # a Mamba layer is one without KV heads
    w.add_ssm_conv_kernel(s["d_conv"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(s["n_expert_used"])
    for i, kind in enumerate(s["pattern"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        if kind == "A":
            _attn(w, r, p, n_embd, n_embd, head_dim * s["n_head_kv"])
        else:  # Mamba 1, as _mamba, with RMS norms on dt, B and C
            w.add_tensor(p + "ssm_in.weight", r.rand(2 * d_inner, n_embd))
            w.add_tensor(p + "ssm_conv1d.weight", r.rand(d_inner, s["d_conv"]))
            w.add_tensor(p + "ssm_conv1d.bias", r.rand(d_inner, scale=0.1))
            w.add_tensor(p + "ssm_x.weight", r.rand(dt_rank + 2 * d_state, d_inner))
            w.add_tensor(p + "ssm_dt_norm.weight", r.ones(dt_rank))
            w.add_tensor(p + "ssm_b_norm.weight", r.ones(d_state))
            w.add_tensor(p + "ssm_c_norm.weight", r.ones(d_state))
            # dt_norm makes the low-rank dt unit-RMS: scale ssm_dt down to keep softplus(dt) ~ 0.3
            w.add_tensor(p + "ssm_dt.weight", r.rand(d_inner, dt_rank, scale=0.5 * dt_rank ** -0.5))
            w.add_tensor(p + "ssm_dt.bias", r.rand(d_inner, scale=0.5) - 1.0)
            w.add_tensor(p + "ssm_a", r.decay(d_inner, d_state))
            w.add_tensor(p + "ssm_d", r.ones(d_inner))
            w.add_tensor(p + "ssm_out.weight", r.rand(n_embd, d_inner))
        w.add_tensor(p + "ffn_norm.weight", r.ones(n_embd))
        if n_expert:  # softmax-routed SwiGLU experts
            w.add_tensor(p + "ffn_gate_inp.weight", r.rand(n_expert, n_embd))
            w.add_tensor(p + "ffn_gate_exps.weight", r.rand(n_expert, n_ff, n_embd))
            w.add_tensor(p + "ffn_up_exps.weight", r.rand(n_expert, n_ff, n_embd))
            w.add_tensor(p + "ffn_down_exps.weight", r.rand(n_expert, n_embd, n_ff))
        else:
            _ffn(w, r, p, n_embd, n_ff, norm=False)


# --- PLaMo-2 (src/models/plamo2.cpp) --------------------------------------------------------------------------
def _plamo2(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_kv, n_ff = s["n_embd"], s["n_head"], s["n_head_kv"], s["n_ff"]
    d_inner, d_state, n_heads = s["d_inner"], s["d_state"], s["n_ssm_head"]
    head_dim = n_embd // n_head
    dt_dim = max(64, n_embd // 16)
    if d_inner % n_heads:
        raise ValueError("plamo2: d_inner must be a multiple of n_ssm_head")
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)  # one count for all: llama.cpp derives the head size from layer 0's
    w.add_head_count_kv(_head_kv_per_layer(s))  # a Mamba layer is one without KV heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_ssm_conv_kernel(s["d_conv"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_heads)
    w.add_ssm_group_count(0)  # llama.cpp asserts 0: B and C are shared by all heads and skip the convolution
    for i, kind in enumerate(s["pattern"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        if kind == "A":
            w.add_tensor(p + "attn_qkv.weight", r.rand((n_head + 2 * n_kv) * head_dim, n_embd))
            w.add_tensor(p + "attn_q_norm.weight", r.ones(n_head, head_dim))  # per head
            w.add_tensor(p + "attn_k_norm.weight", r.ones(n_kv, head_dim))
            w.add_tensor(p + "attn_output.weight", r.rand(n_embd, n_head * head_dim))
        else:
            w.add_tensor(p + "ssm_in.weight", r.rand(2 * d_inner, n_embd))  # z and x, interleaved per head
            w.add_tensor(p + "ssm_conv1d.weight", r.rand(d_inner, s["d_conv"]))  # no bias
            w.add_tensor(p + "ssm_x.weight", r.rand(2 * d_state + dt_dim, d_inner))  # B, C, dt (low rank)
            # these norms go without the ".weight" suffix (llama.cpp creates them as tn(LLM_TENSOR_..., i))
            w.add_tensor(p + "ssm_dt_norm", r.ones(dt_dim))
            w.add_tensor(p + "ssm_b_norm", r.ones(d_state))
            w.add_tensor(p + "ssm_c_norm", r.ones(d_state))
            # the normed dt has unit RMS: scale ssm_dt down to keep softplus(dt) ~ 0.3
            w.add_tensor(p + "ssm_dt.weight", r.rand(n_heads, dt_dim, scale=0.5 * dt_dim ** -0.5))
            w.add_tensor(p + "ssm_dt.bias", r.rand(n_heads, scale=0.5) - 1.0)
            w.add_tensor(p + "ssm_a", r.decay(n_heads))
            w.add_tensor(p + "ssm_d", r.ones(n_heads))
            w.add_tensor(p + "ssm_out.weight", r.rand(n_embd, d_inner))
        w.add_tensor(p + "post_attention_norm", r.ones(n_embd))  # the mixer's output norm, likewise unsuffixed
        w.add_tensor(p + "ffn_norm.weight", r.ones(n_embd))
        w.add_tensor(p + "ffn_up.weight", r.rand(2 * n_ff, n_embd))  # gate and up in one: SwiGLU of its halves
        w.add_tensor(p + "ffn_down.weight", r.rand(n_embd, n_ff))
        w.add_tensor(p + "post_ffw_norm", r.ones(n_embd))


# --- Kimi Linear (src/models/kimi-linear.cpp, delta-net-base.cpp) -------------------------------------------------
def _kimi_linear(w: GGUFWriter, r: _Weights, s: dict) -> None:
    n_embd, n_head, n_ff, n_expert = s["n_embd"], s["n_head"], s["n_ff"], s["n_expert"]
    head_dim, d_conv = s["head_dim"], s["d_conv"]
    d_inner = n_head * head_dim  # KDA's q, k and v widths
    rank, n_rot, nope, v_dim = s["kv_lora_rank"], s["n_rot"], s["qk_nope"], s["v_head_dim"]
    if s["n_head_kv"] != 1:
        raise ValueError("kimi-linear: MLA caches one latent KV head (n_head_kv=1)")
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)  # KDA and MLA heads alike
    w.add_head_count_kv([1 if c == "A" else 0 for c in s["pattern"]])  # a KDA layer is one without KV heads
    w.add_key_length(rank + n_rot)  # the cache's K row: the normed latent and the positional part
    w.add_value_length(rank)  # V is a view of the latent
    w.add_key_length_mla(nope + n_rot)  # per head, after decompression
    w.add_value_length_mla(v_dim)
    w.add_kv_lora_rank(rank)
    w.add_rope_dimension_count(n_rot)
    w.add_ssm_conv_kernel(d_conv)
    w.add_kda_head_dim(head_dim)
    # MoE keys are read whatever the FFNs: a leading dense block count of n_layer makes every FFN dense
    w.add_leading_dense_block_count(1 if n_expert else len(s["pattern"]))
    w.add_expert_feed_forward_length(s["n_ff_exp"])
    w.add_expert_shared_count(s["n_expert_shared"])
    w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(s["n_expert_used"])
        w.add_expert_weights_scale(1.0)
    for i, kind in enumerate(s["pattern"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.ones(n_embd))
        if kind == "A":  # MLA, with the "absorbed" per-head k_b / v_b of llama.cpp's MLA cache
            w.add_tensor(p + "attn_q.weight", r.rand(n_head * (nope + n_rot), n_embd))  # no q lora
            w.add_tensor(p + "attn_kv_a_mqa.weight", r.rand(rank + n_rot, n_embd))
            w.add_tensor(p + "attn_kv_a_norm.weight", r.ones(rank))
            w.add_tensor(p + "attn_k_b.weight", r.rand(n_head, rank, nope))  # q_nope -> latent space
            w.add_tensor(p + "attn_v_b.weight", r.rand(n_head, v_dim, rank))  # latent -> values
            w.add_tensor(p + "attn_output.weight", r.rand(n_embd, n_head * v_dim))
        else:  # KDA
            _attn(w, r, p, n_embd, d_inner, d_inner, n_out=d_inner)  # q, k, v (before their convolutions), o
            for x in "qkv":
                w.add_tensor(f"{p}ssm_conv1d_{x}.weight", r.rand(d_inner, 1, d_conv))
            # per-channel log-decay: softplus(f_b @ f_a @ x + dt_bias) * a, a = -exp(A_log) < 0 per head
            w.add_tensor(p + "ssm_f_a.weight", r.rand(head_dim, n_embd))
            w.add_tensor(p + "ssm_f_b.weight", r.rand(d_inner, head_dim))
            w.add_tensor(p + "ssm_dt.bias", r.rand(d_inner, scale=0.5) - 1.0)
            w.add_tensor(p + "ssm_a", r.decay(n_head, 1))
            w.add_tensor(p + "ssm_beta.weight", r.rand(n_head, n_embd))  # the delta rule's write strength
            # output: RMS norm per head, gated by sigmoid(g_b @ g_a @ x)
            w.add_tensor(p + "ssm_g_a.weight", r.rand(head_dim, n_embd))
            w.add_tensor(p + "ssm_g_b.weight", r.rand(d_inner, head_dim))
            w.add_tensor(p + "ssm_norm.weight", r.ones(head_dim))
        w.add_tensor(p + "ffn_norm.weight", r.ones(n_embd))
        if n_expert and i >= 1:  # sigmoid-routed experts (with a routing bias) + shared experts
            n_ff_exp, n_ff_sh = s["n_ff_exp"], s["n_ff_exp"] * s["n_expert_shared"]
            w.add_tensor(p + "ffn_gate_inp.weight", r.rand(n_expert, n_embd))
            w.add_tensor(p + "exp_probs_b.bias", r.zeros(n_expert))
            w.add_tensor(p + "ffn_gate_exps.weight", r.rand(n_expert, n_ff_exp, n_embd))
            w.add_tensor(p + "ffn_up_exps.weight", r.rand(n_expert, n_ff_exp, n_embd))
            w.add_tensor(p + "ffn_down_exps.weight", r.rand(n_expert, n_embd, n_ff_exp))
            w.add_tensor(p + "ffn_gate_shexp.weight", r.rand(n_ff_sh, n_embd))
            w.add_tensor(p + "ffn_up_shexp.weight", r.rand(n_ff_sh, n_embd))
            w.add_tensor(p + "ffn_down_shexp.weight", r.rand(n_embd, n_ff_sh))
        else:
            _ffn(w, r, p, n_embd, n_ff, norm=False)


_LAYERS = {"lfm2": _lfm2, "qwen35": _qwen35, "nemotron_h": _nemotron_h, "granitehybrid": _granitehybrid,
           "mamba2": _mamba2, "mamba": _mamba, "rwkv7": _rwkv7, "falcon-h1": _falcon_h1, "jamba": _jamba,
           "plamo2": _plamo2, "kimi-linear": _kimi_linear}
