"""Write tiny block drafts (``general.architecture = dflash``) for a tiny llama target: DFlash, DFlash2, DSpark.

A block draft decodes ``[last token, <mask> x k]`` in one pass over a cache holding the target's features
(injected from the inputs of the target layers it names), and reads a draft token from each mask row. Random
weights would draft nothing the target accepts, so the drafts are built to compute the target's bigram model (the
target is nearly one, see tiny_gguf's ``context``):

- DFlash: every mask row attends to the block's anchor (the last token) alone and reads the target's output head
  off the anchor's normed embedding. Its stream is the target's width, 64 (llama.cpp requires it): 61 units for the
  token's embedding, then one the target's features write, one that marks a real token and one that marks the
  mask. Queries come from the mask unit and keys from the real-token unit in a dimension RoPE leaves alone, so a
  mask row's score for the anchor is ``head_dim x attention.scale`` and for everything else 0 (the injected
  features have no real-token unit). So every mask row drafts the anchor's bigram successor (nearly: the content
  keeps 61 of the embedding's 64 units): the first is often accepted, later ones rarely (the reject path runs).
  With ``feature_key`` the features' unit makes keys too, at that cosine to the query: each position's features
  then take a share of every mask row's attention, so what the draft proposes depends on every feature it holds.
- DSpark: the same decoder with its output head zeroed, and a Markov head whose bias is exactly the target's
  bigram logits of the previous token (``markov_w1`` = normed embeddings, ``markov_w2`` = the target's output head),
  chained greedily inside llama.cpp's graph: long runs are accepted. A confidence head (random, biased high) rides
  along.
- DFlash2 (``selector_top_k``): the DFlash draft with identity convolutions and a small random selector.

Proven in llama.cpp itself first, with the reference build's tool (2026-11-25, the sdist's vendored llama.cpp):
    llama-speculative-simple -m tiny-block-target.gguf -md tiny-dflash.gguf --spec-type draft-dflash --temp 0 \
        -p "the cat sat" -n 64 --spec-draft-n-max 8 --spec-draft-p-min 0 -t 1
drafted 252 tokens, 32 accepted (the DFlash2 draft the same); ``-md tiny-dspark.gguf --spec-type draft-dspark``:
69 drafted, 64 accepted. test_block_drafters.py checks llama-server against SpecChat with the same files.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from .tiny_gguf import EOG_IDS, vocab, write_model

WIDTH = 64  # the draft's stream (llama.cpp: the target's hidden size): 61 content units, then three markers
FEATURE, REAL, MASK = 61, 62, 63
N_HEAD, HEAD_DIM = 4, 16
KEY_DIM = HEAD_DIM - 1  # per head: RoPE rotates the first N_ROT dims only
N_ROT = 4
MASK_ID = 0  # <unk> stands in as the mask token


def write_block_pair(folder: Path, seed: int = 0, context: float = 0.2, **draft) -> tuple[Path, Path]:
    """(target, DFlash draft): a tiny llama target, nearly a bigram model, and a block draft for it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = write_model(folder / "tiny-block-target.gguf", seed=seed, n_layer=3, context=context)
    return target, write_block_draft(folder / "tiny-dflash.gguf", target, seed=seed, **draft)


def write_dspark_pair(folder: Path, seed: int = 0, context: float = 0.2, **draft) -> tuple[Path, Path]:
    """(target, DSpark draft): the same target, and a DSpark draft for it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = write_model(folder / "tiny-block-target.gguf", seed=seed, n_layer=3, context=context)
    return target, write_block_draft(folder / "tiny-dspark.gguf", target, seed=seed, markov=True, **draft)


def write_block_draft(path: Path, target: Path, seed: int = 0, layers=(0, 2), block_size: int = 16,
                      markov: bool = False, sample_from_anchor: bool = True, confidence: bool = True,
                      causal: bool = False, selector_top_k: int = 0, feature_key: float = 0.0,
                      mrope: bool = False, draft_vocab: int = 0) -> Path:
    """A block draft for ``target`` (a tiny_gguf model of width 64) reading the inputs of ``layers``. ``markov``: a
    DSpark draft (a Markov head, and a confidence head unless ``confidence`` is False), drafting from the anchor's
    row on (``sample_from_anchor``) or from the first mask's. ``causal``: its block attends causally.
    ``selector_top_k``: a DFlash2 draft, whose selector walks each row's top candidates (its convolutions are the
    identity and its selector's pair scores small, so it picks as DFlash does, nearly). ``feature_key``: the cosine
    of the injected features' keys to a mask row's query (0: they get no attention). ``mrope``: M-RoPE with the
    degenerate sections llama.cpp's drafts for M-RoPE targets carry. ``draft_vocab``: an output head (and DSpark's
    Markov output) over that many of the target's ids, mapped back by a ``d2t`` table inside llama.cpp's graph, as
    reduced-vocabulary exports carry; the target's end-of-generation ids are among them."""
    tensors = {t.name: np.array(t.data) for t in GGUFReader(str(target)).tensors}
    embd, out = tensors["token_embd.weight"], tensors["output.weight"]
    n_vocab, n_embd = embd.shape
    toks = vocab()
    assert len(toks) == n_vocab and n_embd == WIDTH
    w = GGUFWriter(str(path), "dflash")
    w.add_context_length(512)
    w.add_embedding_length(WIDTH)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_ROT)
    if mrope:
        w.add_rope_dimension_sections([N_ROT // 2, 0, 0, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_attention_scale(2.0)
    w.add_file_type(0)
    w.add_array("dflash.target_layers", list(layers))
    w.add_uint32("dflash.block_size", block_size)
    w.add_bool("dflash.attention.causal", causal)
    if selector_top_k:
        for key, value in (("selector_rank", 8), ("selector_top_k", selector_top_k), ("conv_kernel_size", 3),
                           ("conv_group_size", 16)):
            w.add_uint32(f"dflash.{key}", value)
    if markov:
        w.add_bool("dflash.sample_from_anchor", sample_from_anchor)
        w.add_bool("dflash.has_confidence_head", confidence)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in toks])
    w.add_token_scores([0.0] * 261 + [-float(i) for i in range(n_vocab - 261)])
    w.add_token_types([int(k) for _, k in toks])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_mask_token_id(MASK_ID)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(seed + 7)
    f32 = np.float32
    stream = np.zeros((n_vocab, WIDTH), dtype=f32)  # token embeddings: the target's, marked as real tokens
    stream[:, :FEATURE], stream[:, REAL] = embd[:, :FEATURE], 1.0
    stream[MASK_ID] = 0.0
    stream[MASK_ID, MASK] = 1.0
    w.add_tensor("token_embd.weight", stream)
    n_feat = len(layers) * n_embd
    fc = np.zeros((WIDTH, n_feat), dtype=f32)  # the features reach the content units and their own
    fc[:REAL] = rng.standard_normal((REAL, n_feat)) * n_feat ** -0.5
    w.add_tensor("fc.weight", fc)
    w.add_tensor("enc.output_norm.weight", np.ones(WIDTH, dtype=f32))
    w.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=f32))
    head = np.zeros((n_vocab, WIDTH), dtype=f32)
    if not markov:  # (DSpark drafts from its Markov head alone)
        head[:, :FEATURE] = out[:, :FEATURE]
    d2t = np.arange(n_vocab)
    if draft_vocab:  # some of the target's ids, its end of generation among them (or answers would not end alike)
        others = np.setdiff1d(np.arange(3, n_vocab), EOG_IDS)
        d2t = np.union1d(EOG_IDS, rng.choice(others, draft_vocab - len(EOG_IDS), replace=False))  # (sorted)
    w.add_tensor("output.weight", head[d2t])
    if draft_vocab:
        w.add_tensor("d2t", d2t.astype(np.int64))

    wq, wk = np.zeros((WIDTH, WIDTH), dtype=f32), np.zeros((WIDTH, WIDTH), dtype=f32)
    for h in range(N_HEAD):
        wq[h * HEAD_DIM + KEY_DIM, MASK] = 1.0  # a mask row asks...
        wk[h * HEAD_DIM + KEY_DIM, REAL] = 1.0  # ...for the real token
        if feature_key:  # (and the features' keys point partly the same way)
            wk[h * HEAD_DIM + KEY_DIM, FEATURE] = feature_key
            wk[h * HEAD_DIM + KEY_DIM - 1, FEATURE] = np.sqrt(1.0 - feature_key ** 2)
    wv = np.zeros((WIDTH, WIDTH), dtype=f32)
    wv[:FEATURE, :FEATURE] = np.eye(FEATURE)
    p = "blk.0."
    for name, value in (("attn_norm", np.ones(WIDTH)), ("attn_q", wq), ("attn_k", wk), ("attn_v", wv),
                        ("attn_output", 10.0 * wv), ("attn_q_norm", np.ones(HEAD_DIM)),
                        ("attn_k_norm", np.ones(HEAD_DIM)), ("ffn_norm", np.ones(WIDTH)),
                        ("ffn_gate", rng.standard_normal((32, WIDTH)) * WIDTH ** -0.5),
                        ("ffn_up", rng.standard_normal((32, WIDTH)) * WIDTH ** -0.5),
                        ("ffn_down", np.zeros((WIDTH, 32)))):
        w.add_tensor(p + name + ".weight", np.asarray(value, dtype=f32))
    if selector_top_k:  # convolutions (before and after attention and the feed-forward): the identity
        identity = np.zeros((2, 3, WIDTH), dtype=f32)
        identity[:, 0] = 1.0  # tap 0 (this row) weighs 1, earlier rows 0; no per-row part
        for part in ("attn", "ffn"):
            w.add_tensor(p + f"{part}_conv_base", identity)
            w.add_tensor(p + f"{part}_conv_proj.weight", np.zeros((2 * 3 * (WIDTH // 16), WIDTH), dtype=f32))
        for name, shape in (("selector_predecessor", (n_vocab, 8)), ("selector_successor", (n_vocab, 8)),
                            ("selector_hidden", (8, WIDTH))):
            w.add_tensor(name + ".weight", (rng.standard_normal(shape) * 0.1).astype(f32))
    if markov:
        normed = embd / np.sqrt((embd ** 2).mean(axis=1, keepdims=True) + 1e-5)
        w.add_tensor("markov_w1.weight", normed.astype(f32))  # the previous token's normed embedding...
        w.add_tensor("markov_w2.weight", out[d2t].astype(f32))  # ...through the target's output head
        if confidence:  # sigmoid(2 + a little of the row): about 0.7 to 0.96
            w.add_tensor("conf_proj.weight", (rng.standard_normal((1, WIDTH + n_embd)) * 0.05).astype(f32))
            w.add_tensor("conf_proj.bias", np.array([2.0], dtype=f32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
