"""A tiny multimodal set llama.cpp's libmtmd loads: a llama-architecture text model (``tiny_gguf.write_model``) and a
random-weight projector for it, of llava's ``mlp`` type (the simplest libmtmd knows: patch embedding, position
embedding, then ``mm.0`` → GELU → ``mm.2`` into the text model's embedding size), plus small PNG images.

With ``block_count`` 1 the vision transformer runs no layer (llava reads the second-to-last layer's output), so an
image's embedding is a random linear function of its pixels: two different images give different embeddings and,
through the text model, different greedy answers.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

IMAGE_SIZE = 32
PATCH = 8  # (32 / 8)^2 = 16 image tokens per image


def _clip(path: Path, projector: str, n_embd: int, n_ff: int, n_embd_text: int, eps: float, image_size: int,
          patch: int, seed: int):
    """A projector file's writer with the vision header every type shares, and ``t(*shape, scale)``: random weights
    of std ``scale`` (default 1/sqrt(fan-in))."""
    w = GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.has_vision_encoder", True)
    for key, value in (("embedding_length", n_embd), ("feed_forward_length", n_ff), ("block_count", 1),
                       ("projection_dim", n_embd_text), ("attention.head_count", 4)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_file_type(0)
    rng = np.random.default_rng(seed)

    def t(*shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return (rng.standard_normal(shape) * (scale if scale is not None else fan_in ** -0.5)).astype(np.float32)

    return w, t


def _close(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_projector(path: Path, n_embd_text: int = 64, seed: int = 7, n_embd: int = 32, n_ff: int = 64,
                    image_size: int = IMAGE_SIZE, patch: int = PATCH) -> Path:
    """A projector whose image embeddings have the scale of ``write_model``'s token embeddings (std about 1)."""
    w, t = _clip(path, "mlp", n_embd, n_ff, n_embd_text, 1e-5, image_size, patch, seed)
    w.add_bool("clip.use_gelu", True)
    n_patches = (image_size // patch) ** 2
    w.add_tensor("v.patch_embd.weight", t(n_embd, 3, patch, patch))  # ggml ne: [patch, patch, 3, n_embd]
    w.add_tensor("v.position_embd.weight", t(n_patches, n_embd, scale=0.1))
    # One encoder layer's required tensors (llava runs none of them with one block: it reads the layer before)
    w.add_tensor("v.blk.0.attn_out.weight", t(n_embd, n_embd))
    w.add_tensor("v.blk.0.ffn_up.weight", t(n_ff, n_embd))
    w.add_tensor("v.blk.0.ffn_down.weight", t(n_embd, n_ff))
    w.add_tensor("mm.0.weight", t(n_ff, n_embd))
    w.add_tensor("mm.0.bias", np.zeros(n_ff, dtype=np.float32))
    w.add_tensor("mm.2.weight", t(n_embd_text, n_ff, scale=2.0 * n_ff ** -0.5))
    w.add_tensor("mm.2.bias", np.zeros(n_embd_text, dtype=np.float32))
    return _close(w, path)


def write_qwen2vl_projector(path: Path, n_embd_text: int = 64, seed: int = 8, n_embd: int = 32, n_ff: int = 64,
                            patch: int = PATCH) -> Path:
    """Qwen2-VL's projector (``qwen2vl_merger``): two patch convolutions, one vision layer with M-RoPE, 2×2 patches
    merged into one embedding. Its images take fewer positions than tokens in the text model (M-RoPE)."""
    w, t = _clip(path, "qwen2vl_merger", n_embd, n_ff, n_embd_text, 1e-6, 64, patch, seed)
    zeros, ones = (lambda n: np.zeros(n, np.float32)), (lambda n: np.ones(n, np.float32))
    w.add_tensor("v.patch_embd.weight", t(n_embd, 3, patch, patch))
    w.add_tensor("v.patch_embd.weight.1", t(n_embd, 3, patch, patch))
    p = "v.blk.0."
    for name in ("ln1", "ln2"):
        w.add_tensor(p + name + ".weight", ones(n_embd))
        w.add_tensor(p + name + ".bias", zeros(n_embd))
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        w.add_tensor(p + name + ".weight", t(n_embd, n_embd))
        w.add_tensor(p + name + ".bias", zeros(n_embd))
    w.add_tensor(p + "ffn_up.weight", t(n_ff, n_embd))
    w.add_tensor(p + "ffn_up.bias", zeros(n_ff))
    w.add_tensor(p + "ffn_down.weight", t(n_embd, n_ff))
    w.add_tensor(p + "ffn_down.bias", zeros(n_embd))
    w.add_tensor("mm.0.weight", t(n_ff, 4 * n_embd))
    w.add_tensor("mm.0.bias", zeros(n_ff))
    w.add_tensor("mm.2.weight", t(n_embd_text, n_ff, scale=2.0 * n_ff ** -0.5))
    w.add_tensor("mm.2.bias", zeros(n_embd_text))
    return _close(w, path)


def png_bytes(seed: int, size: int = IMAGE_SIZE) -> bytes:
    """A small random-colour RGB PNG."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def write_png(path: Path, seed: int, size: int = IMAGE_SIZE) -> Path:
    path.write_bytes(png_bytes(seed, size))
    return path
