"""Plain decoding's speed on this machine's GPU, measured and kept across launches: how fast a pair that fits there
would run at least (``expected_speed``), where no GPU bandwidth can be read off the device.

A step reads every weight the token uses once, and pays fixed costs per layer (kernel launches) beside. So a target
larger than one measured here is at least as fast as that one's bytes per second allow for its size (its fixed
costs are a smaller share of its step, as larger models have fewer layers per byte), and a smaller one is at least
as fast as the larger one was. Each is a floor: a small target's step is mostly fixed costs on a fast GPU, so the
floor it gives a large one can be far below what the large one makes.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine import EngineError
from ..engine.gguf_file import read_info
from ..engine.llama import gpus
from ..json_files import load_json, save_json
from ..paths import data_dir

FILE = "gpu_speed.json"
KEEP = 16  # targets kept per GPU, the latest measured


@dataclass(frozen=True)
class Measurement:
    """One target's plain decoding (speculation off) with every layer on the GPU, as last measured."""

    model: str  # its file name
    read_bytes: int  # the weights it reads a token (the file's tensors)
    tokens_per_second: float
    at: float  # when (time.time())

    def floor(self, read_bytes: float) -> float:
        """Tokens/s a target reading ``read_bytes`` a token makes at least on this GPU, from this measurement."""
        if read_bytes <= self.read_bytes:
            return self.tokens_per_second
        return self.tokens_per_second * self.read_bytes / read_bytes


@dataclass(frozen=True)
class GpuSpeed:
    """What was measured on one GPU (or set of GPUs)."""

    measured: tuple[Measurement, ...]

    def floor(self, read_bytes: float, files: Sequence[str] = ()) -> tuple[float, Measurement]:
        """The highest floor on the tokens/s here of a target reading ``read_bytes`` a token, and the measurement it
        comes from: the target's own where one of its ``files`` was measured."""
        if own := next((m for m in self.measured if m.model in files), None):
            return own.tokens_per_second, own
        return max(((m.floor(read_bytes), m) for m in self.measured), key=lambda fm: fm[0])


def device_key(devices: list) -> str:
    """The GPUs a target ran on, by name (several split its layers)."""
    return " + ".join(sorted(g.name for g in devices))


def _saved() -> dict:
    return load_json(data_dir() / FILE)[0] or {}


def recall(devices: list) -> GpuSpeed | None:
    """What was measured on these GPUs (None: nothing yet, or no GPU)."""
    if not devices:
        return None
    try:
        entry = _saved().get(device_key(devices))
        found = tuple(Measurement(**m) for m in entry.values()) if isinstance(entry, dict) else ()
    except (OSError, TypeError, AttributeError):  # (a file from another version, a folder gone: nothing measured)
        return None
    return GpuSpeed(found) if found else None


class GpuSpeedLog:
    """``engine.measured.SpeedLog`` for one target file: its plain speed, kept for the GPUs it ran on."""

    def __init__(self, target: Path):
        self.target = Path(target)

    def keep_plain(self, tokens_per_second: float) -> None:
        try:
            info = read_info(self.target)
            devices = gpus()
            # A mixture of experts reads a share of its weights a token: its speed tells nothing of the others'
            if not devices or tokens_per_second <= 0 or info.n_expert:
                return
            saved = _saved()
            key = device_key(devices)
            found = saved.get(key)
            mine: dict = found if isinstance(found, dict) else {}
            mine[self.target.name] = asdict(Measurement(self.target.name, info.size_bytes,
                                                        round(tokens_per_second, 2), time.time()))
            latest = sorted(mine.items(), key=lambda kv: kv[1].get("at", 0) if isinstance(kv[1], dict) else 0)
            saved[key] = dict(latest[-KEEP:])
            save_json(data_dir() / FILE, saved)
        except (OSError, ValueError, EngineError):
            pass  # (a full disk, a file gone since it loaded: the figure waits for the next plain answer)
