"""How large a draft should be beside its target. Used to rank drafts of another vocabulary, where no sibling of
the target's family exists: the draft's cost per token grows with its size, and its guesses improve with it.
Published pairs that pay sit around 1:10 to 1:40 (Qwen2.5 0.5B for 7B–32B, Llama 3.2 1B for 8B–70B), so the
ranking prefers the ratio nearest 1:20 and leaves out drafts over a third of the target, which cannot pay."""
from __future__ import annotations

import math
from typing import Callable, Iterable, TypeVar

IDEAL = 1 / 20
LARGEST = 1 / 3

T = TypeVar("T")


def rank(items: Iterable[T], target_bytes: int, size: Callable[[T], int]) -> list[T]:
    """``items`` of a usable size (0 < size <= a third of the target), nearest to 1:20 first (in log scale: 1:10
    and 1:40 are equally far)."""
    usable = [x for x in items if 0 < size(x) <= target_bytes * LARGEST]
    return sorted(usable, key=lambda x: abs(math.log(size(x) / target_bytes / IDEAL)))


def describe(draft_bytes: int, target_bytes: int) -> str:
    return f"1:{target_bytes / draft_bytes:.0f} of the target's size" if draft_bytes else "size unknown"
