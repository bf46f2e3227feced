"""Cheap sanity checks of a GGUF file before llama.cpp touches it, so bad files get a plain-words error.

llama.cpp itself only says "failed to load model"; here we tell apart a missing file, a file that is not GGUF at
all (a safetensors or HTML error page saved as .gguf), and a GGUF whose download stopped short.
"""
from __future__ import annotations

import struct
from pathlib import Path

from .errors import EngineError

GGUF_MAGIC = b"GGUF"


_checked: set[tuple[str, int, int]] = set()


def check_gguf_file(path: Path) -> None:
    """Raise EngineError unless ``path`` looks like a complete GGUF file (each file is checked once per process)."""
    path = Path(path)
    if not path.exists():
        raise EngineError(f"Model file not found: {path}")
    if path.is_dir():
        raise EngineError(f"{path} is a folder; give the path of a .gguf file")
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _checked:
        return
    size = st.st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        raise EngineError(
            f"{path.name} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF'). "
            "SpecChat runs llama.cpp GGUF models: download a .gguf file or convert with llama.cpp's convert_hf_to_gguf.py."
        )
    if len(head) < 8 or struct.unpack("<I", head[4:8])[0] not in (2, 3):
        raise EngineError(f"{path.name} has an unsupported or damaged GGUF header.")
    expected = expected_size(path)
    if expected is None:
        raise EngineError(f"{path.name} is a damaged GGUF file: its header cannot be read. Download it again.")
    if size < expected:
        raise EngineError(
            f"{path.name} is truncated: {size:,} bytes on disk, {expected:,} expected. "
            "The download probably stopped early; download it again."
        )
    _checked.add(key)


def expected_size(path: Path) -> int | None:
    """Bytes the file must have to hold the tensor data its header declares; None if the header is unreadable.

    Parses only the metadata and tensor-info tables (no memory map of the data), so it is quick on any size.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)  # headers of even 250k-token vocabularies fit comfortably
        off = 8
        n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
        off += 16
        alignment = 32

        def read_str(o: int) -> tuple[bytes, int]:
            (n,) = struct.unpack_from("<Q", data, o)
            return data[o + 8 : o + 8 + n], o + 8 + n

        def skip_value(vtype: int, o: int) -> tuple[object, int]:
            if vtype == 8:
                return read_str(o)
            if vtype == 9:
                (etype, count) = struct.unpack_from("<IQ", data, o)
                o += 12
                if etype in scalar:
                    return None, o + scalar[etype] * count
                if etype == 8:  # string arrays (vocabularies, merges): the hot path, keep it tight
                    for _ in range(count):
                        o += 8 + struct.unpack_from("<Q", data, o)[0]
                    return None, o
                for _ in range(count):
                    _, o = skip_value(etype, o)
                return None, o
            width = scalar[vtype]
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width]
            return struct.unpack_from(fmt, data, o)[0], o + width

        for _ in range(n_kv):
            key, off = read_str(off)
            (vtype,) = struct.unpack_from("<I", data, off)
            value, off = skip_value(vtype, off + 4)
            if key == b"general.alignment" and isinstance(value, int):
                alignment = value
        end = 0
        for _ in range(n_tensors):
            _, off = read_str(off)
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
        data_start = (off + alignment - 1) // alignment * alignment
        return data_start + end
    except Exception:
        return None
