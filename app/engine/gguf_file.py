"""Cheap sanity checks of a GGUF file before llama.cpp touches it, so bad files get a plain-words error.

llama.cpp itself only says "failed to load model"; here we tell apart a missing file, a file that is not GGUF at
all (a safetensors or HTML error page saved as .gguf), and a GGUF whose download stopped short.
"""
from __future__ import annotations

import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EngineError

GGUF_MAGIC = b"GGUF"
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_names(name: str) -> list[str]:
    """All files of a split GGUF named by any of its shards (``x-00001-of-00003.gguf``); ``[name]`` otherwise."""
    m = _SHARD.match(name)
    if not m:
        return [name]
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


_checked: dict[tuple[str, int, int], _Header] = {}


def check_gguf_file(path: Path) -> None:
    """Raise EngineError unless ``path`` looks like a complete GGUF file (each file is checked once per process)."""
    _cached_header(Path(path))


def metadata(path: Path) -> dict:
    """A GGUF file's key-value metadata (first shard), as read once per process."""
    return _cached_header(Path(path)).kv


def tensor_names(path: Path) -> frozenset[str]:
    """The names of the tensors a GGUF file (first shard) holds, as read once per process."""
    return _cached_header(Path(path)).tensors


# GGUF files that are not models (general.type), and what to do with each instead
_OTHER_FILES = {
    "mmproj": "a vision projector, not a model: give it beside its model with --mmproj.",
    "adapter": "a LoRA adapter, not a model: merge it into its base model first (llama.cpp's llama-export-lora).",
    "imatrix": "an importance matrix, not a model: llama-quantize reads it (--imatrix) to quantize a model.",
}


def not_a_model(path: Path) -> str:
    """What a GGUF file that is not a model is, with what to do instead ('': a model, or a head)."""
    kv = metadata(path)
    kind = "mmproj" if kv.get("general.architecture") == "clip" else str(kv.get("general.type", "model"))
    return _OTHER_FILES.get(kind, "")


def _cached_header(path: Path) -> _Header:
    st = path.stat() if path.is_file() else None
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns) if st else None
    header = _checked.get(key) if key else None
    if header is None:
        header = _checked_header(path)
        if key:
            _checked[key] = header
    return header


def _checked_header(path: Path) -> _Header:
    """The parsed header of ``path``, after the checks that make it safe to hand to llama.cpp."""
    if not path.exists():
        raise EngineError(f"Model file not found: {path}")
    if path.is_dir():
        raise EngineError(f"{path} is a folder; give the path of a .gguf file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        raise EngineError(
            f"{path.name} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF'). "
            "SpecChat runs llama.cpp GGUF models: download a .gguf file or convert with llama.cpp's "
            "convert_hf_to_gguf.py."
        )
    if len(head) < 8 or struct.unpack("<I", head[4:8])[0] not in (2, 3):
        raise EngineError(f"{path.name} has an unsupported or damaged GGUF header.")
    try:
        header = _parse(path)
    except Exception:
        raise EngineError(f"{path.name} is a damaged GGUF file: its header cannot be read. "
                          "Download it again.") from None
    expected = header.data_end
    tokens = header.kv.get("tokenizer.ggml.tokens") or []
    if len(set(tokens)) != len(tokens):  # llama.cpp aborts the whole process on such a vocabulary
        twice = next(t for t, n in Counter(tokens).items() if n > 1)
        raise EngineError(f"{path.name} has a damaged vocabulary: the token {twice.decode(errors='replace')!r} "
                          "appears more than once, which llama.cpp cannot load. Download or convert the model again.")
    if size < expected:
        raise EngineError(
            f"{path.name} is truncated: {size:,} bytes on disk, {expected:,} expected. "
            "The download probably stopped early; download it again."
        )
    return header


# --- reading the header -------------------------------------------------------------------------------------
# Our own small reader (no memory map of the weights, no llama.cpp): quick even for 250k-token vocabularies.

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_KEEP_STRING_ARRAYS = {"tokenizer.ggml.tokens"}  # other string arrays (merges) are skipped, not decoded


@dataclass
class _Header:
    kv: dict
    data_end: int  # file size the header's tensors need
    tensors: frozenset[str] = frozenset()


def _parse(path: Path) -> _Header:
    """Parse the header from the file's first bytes, reading more only when it is longer (big vocabularies)."""
    size, limit = 1 << 20, min(path.stat().st_size, 256 << 20)
    while True:
        with open(path, "rb") as f:
            data = f.read(size)
        try:
            return _parse_bytes(data)
        except (struct.error, ValueError, IndexError):
            if size >= limit:
                raise
            size = min(size * 4, limit)


def _parse_bytes(data: bytes) -> _Header:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    off = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16

    def read_str(o: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", data, o)
        return data[o + 8 : o + 8 + n], o + 8 + n

    def read_value(vtype: int, o: int, key: str) -> tuple[object, int]:
        if vtype == 8:
            raw, o = read_str(o)
            return raw.decode("utf-8", "replace"), o
        if vtype != 9:
            fmt = _SCALARS[vtype]
            return struct.unpack_from(fmt, data, o)[0], o + struct.calcsize(fmt)
        etype, count = struct.unpack_from("<IQ", data, o)
        o += 12
        if etype in _NUMPY:
            arr = np.frombuffer(data, dtype=_NUMPY[etype], count=count, offset=o)
            return arr, o + arr.nbytes
        if etype == 8:  # string arrays: the hot path, keep it tight
            keep = key in _KEEP_STRING_ARRAYS
            items = []
            for _ in range(count):
                (n,) = struct.unpack_from("<Q", data, o)
                if keep:
                    items.append(data[o + 8 : o + 8 + n])
                o += 8 + n
            return (items if keep else None), o
        items = []
        for _ in range(count):
            v, o = read_value(etype, o, "")
            items.append(v)
        return items, o

    kv = {}
    for _ in range(n_kv):
        raw_key, off = read_str(off)
        key = raw_key.decode("utf-8", "replace")
        (vtype,) = struct.unpack_from("<I", data, off)
        kv[key], off = read_value(vtype, off + 4, key)
    end, names = 0, []
    for _ in range(n_tensors):
        name, off = read_str(off)
        names.append(name.decode("utf-8", "replace"))
        (n_dims,) = struct.unpack_from("<I", data, off)
        dims = struct.unpack_from(f"<{n_dims}Q", data, off + 4)
        off += 4 + 8 * n_dims
        ttype, t_off = struct.unpack_from("<IQ", data, off)
        off += 12
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        n_el = 1
        for d in dims:
            n_el *= d
        end = max(end, t_off + n_el * type_size // block)
    alignment = int(kv.get("general.alignment", 32))
    data_start = (off + alignment - 1) // alignment * alignment
    return _Header(kv, data_start + end, frozenset(names))


# llama.cpp's vocabulary types (enum llama_vocab_type), by the tokenizer.ggml.model names that select them, with
# the BOS/EOS defaults llama.cpp assumes when a file does not say.
_VOCAB = {"no_vocab": (0, False, False), "llama": (1, True, False), "gpt2": (2, False, False),
          "bert": (3, True, False), "t5": (4, False, True), "rwkv": (5, False, False), "plamo2": (6, False, False)}


@dataclass
class GgufInfo:
    """What a GGUF file says about itself, read without loading weights: enough to judge a pair and its memory."""

    path: Path
    architecture: str
    name: str
    quantization: str
    size_bytes: int  # all shards of a split file
    n_shards: int
    context_length: int
    n_layer: int
    nextn_layers: int  # next-token-prediction (MTP) layers, counted in n_layer too
    n_embd: int  # the hidden state's width
    kv_bytes_per_token: int  # F16 K and V cache
    recurrent_bytes: int  # one sequence's recurrent state (0: attention only)
    vocab_type: int
    tokens: list = field(repr=False)
    bos: int  # -1: the file names none (tokenizer.ggml.bos_token_id missing)
    eos: int
    add_bos: bool
    add_eos: bool
    has_chat_template: bool
    # Only a model's MTP (next-token-prediction) layers, not the model: the side file convert_hf_to_gguf.py --mtp
    # writes (``mtp-*.gguf``, unsloth's ``MTP/`` folder). Its metadata is the whole model's, nextn layers included,
    # but the trunk's tensors are missing (llama.cpp's own test: no ``blk.0.attn_norm.weight``). llama.cpp loads it
    # as a model, and crashes running it as one.
    only_mtp: bool = False
    # The header itself, for what a drafter's own checks read (a block draft's settings, which head a file is):
    # the same checks then run on a file on disk and on a header fetched from the Hub
    kv: dict = field(default_factory=dict, repr=False, compare=False)
    tensors: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def bos_named(self) -> bool:
        return self.bos >= 0

    @property
    def n_expert(self) -> int:
        """A mixture of experts' experts per layer (0: a dense model); a token reads only some of them."""
        return int(self.kv.get(f"{self.architecture}.expert_count") or 0)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def token_text(self, token: int) -> bytes:
        return self.tokens[token]


def read_info(path: Path) -> GgufInfo:
    """Read a GGUF file's metadata (first shard of a split file); EngineError with plain words if it is not one."""
    path = Path(path)
    header = _cached_header(path)
    kv = header.kv
    shards = [path]
    if int(kv.get("split.count", 1)) > 1:
        shards = [path.with_name(n) for n in shard_names(path.name)]
    return _info(header, path, sum(p.stat().st_size for p in shards if p.exists()))


def header_info(data: bytes, name: str, size_bytes: int) -> GgufInfo | None:
    """The metadata of a GGUF whose first bytes are ``data`` (e.g. fetched with an HTTP Range request), or None
    when they do not hold the whole header yet. ``size_bytes``: the whole model's size, as its host reports it."""
    if data[:4] != GGUF_MAGIC:
        raise EngineError(f"{name} is not a GGUF file (it starts with {data[:4]!r}).")
    try:
        return _info(_parse_bytes(data), Path(name), size_bytes)
    except (struct.error, ValueError, IndexError):
        return None


def _info(header: _Header, path: Path, size_bytes: int) -> GgufInfo:
    kv = header.kv
    arch = str(kv.get("general.architecture", "?"))

    def num(key: str, default=0):  # a number, or a per-layer array for some models (e.g. head counts)
        return kv.get(f"{arch}.{key}", default)

    n_layer, nextn = int(num("block_count")), int(num("nextn_predict_layers"))
    n_embd, n_head = int(num("embedding_length")), num("attention.head_count", 1)
    n_head_kv = num("attention.head_count_kv", n_head)
    per_layer = [int(x) for x in n_head_kv] if hasattr(n_head_kv, "__len__") else [int(n_head_kv)] * n_layer
    interval = int(num("full_attention_interval", 0))
    if interval > 1:  # Qwen3.5/3-Next: one attention layer in every `interval`, the others linear (recurrent)
        per_layer = [h if (il + 1) % interval == 0 else 0 for il, h in enumerate(per_layer)]
    head_max = max(int(x) for x in n_head) if hasattr(n_head, "__len__") else int(n_head)
    k_len = int(num("attention.key_length", n_embd // max(head_max, 1)))
    v_len = int(num("attention.value_length", k_len))
    vocab_type, add_bos, add_eos = _VOCAB.get(str(kv.get("tokenizer.ggml.model", "llama")), (1, True, False))
    tokens = kv.get("tokenizer.ggml.tokens") or []
    ftype = kv.get("general.file_type")
    return GgufInfo(
        path=path,
        architecture=arch,
        name=str(kv.get("general.name") or kv.get("general.basename") or path.stem),
        quantization=_ftype_name(ftype),
        size_bytes=size_bytes,
        n_shards=int(kv.get("split.count", 1)),
        context_length=int(num("context_length")),
        n_layer=n_layer,
        nextn_layers=nextn,
        n_embd=n_embd,
        kv_bytes_per_token=sum(h * (k_len + v_len) * 2 for h in per_layer),
        recurrent_bytes=_recurrent_bytes(arch, num, n_embd, per_layer),
        vocab_type=vocab_type,
        tokens=list(tokens),
        bos=int(kv.get("tokenizer.ggml.bos_token_id", -1)),
        eos=int(kv.get("tokenizer.ggml.eos_token_id", -1)),
        add_bos=bool(kv.get("tokenizer.ggml.add_bos_token", add_bos)),
        add_eos=bool(kv.get("tokenizer.ggml.add_eos_token", add_eos)),
        has_chat_template="tokenizer.chat_template" in kv,
        only_mtp=(nextn > 0 and int(kv.get("split.count", 1)) <= 1  # (a split model's first shard may hold none)
                  and "blk.0.attn_norm.weight" not in header.tensors),
        kv=kv,
        tensors=header.tensors,
    )


# Architectures whose every layer is recurrent (Mamba, RWKV), or has a recurrent path beside attention (Falcon-H1).
_ALL_RECURRENT = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "falcon-h1")
_HYBRID_KEYS = ("ssm.conv_kernel", "shortconv.l_cache", "wkv.head_size", "kda.head_dim")


def _recurrent_bytes(arch: str, num, n_embd: int, per_layer_kv: list[int]) -> int:
    """Bytes of one sequence's recurrent state (F32, as llama.cpp keeps it; cf. llama_hparams::n_embd_r/_s): what
    a saved state costs, and a snapshot. 0 for attention-only models."""
    if not any(num(k, 0) for k in _HYBRID_KEYS):
        return 0
    if arch in _ALL_RECURRENT:
        layers = len(per_layer_kv)
    else:  # hybrids: the layers without attention heads are the recurrent ones, but for FFN-only ones (Nemotron-H)
        n_ff = num("feed_forward_length", 0)
        ffn_only = [int(f) > 0 for f in n_ff] if hasattr(n_ff, "__len__") else [False] * len(per_layer_kv)
        layers = sum(1 for h, f in zip(per_layer_kv, ffn_only) if h == 0 and not f)
    head_size = int(num("wkv.head_size", 0))
    l_cache = int(num("shortconv.l_cache", 0))
    kda_dim = int(num("kda.head_dim", 0))
    if head_size:  # RWKV: token shifts and the wkv state
        r, s = 2 * n_embd, n_embd * head_size
    elif kda_dim:  # Kimi's delta attention: convolutions over q, k and v, and a head_dim x head_dim state per head
        n_head = num("attention.head_count", 1)
        n_head = max(int(h) for h in n_head) if hasattr(n_head, "__len__") else int(n_head)
        r, s = 3 * max(int(num("ssm.conv_kernel", 4)) - 1, 0) * n_head * kda_dim, kda_dim * kda_dim * n_head
    elif l_cache:  # LFM2: short convolutions only
        r, s = n_embd * (l_cache - 1), 0
    else:  # Mamba-style SSMs and gated DeltaNet: convolution plus state
        d_conv, d_inner = int(num("ssm.conv_kernel", 0)), int(num("ssm.inner_size", 0))
        d_state, n_group = int(num("ssm.state_size", 0)), int(num("ssm.group_count", 0))
        r, s = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner
    return layers * (r + s) * 4


def _ftype_name(ftype) -> str:
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        return "unknown"
