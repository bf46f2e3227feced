"""Which file of a Hub repo a tag names, the way llama.cpp's ``-hf owner/name:TAG`` picks it (common/download.cpp,
``find_best_model`` / ``find_best_sibling``), so that a catalog entry survives an upstream rename.

A repo's ``.gguf`` files are grouped into models (a split GGUF, ``x-00001-of-00003.gguf``, is one model named by its
first shard, in whatever folder it lives). A tag is matched without regard to case, as a whole label: ``Q4_K_M`` is
found in ``Model-Q4_K_M.gguf``, ``model-q4_k_m-00001-of-00002.gguf`` and ``UD-Q4_K_M/Model-UD-Q4_K_M.gguf``, not in
``Model-Q4_K_M_L.gguf``. A tag ending in ``.gguf`` names a file (its exact name first, else the one name that differs
only in case, or in another folder). Side files (Gemma 4's MTP assistant, EAGLE-3 heads, DFlash / DSpark block
drafts: llama.cpp's ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-`` files, also anything in an ``MTP/`` folder) are
never taken for the model itself; a source asks for one by its kind. Where a tag fits several models the plainest
name wins (``Model-Q4_K_M`` over ``Model-UD-Q4_K_M``); where none is plainer, or nothing fits, the error lists what
the repo has. Vision projectors (``mmproj`` files) are never a model either: ``projector`` picks the one llama.cpp's
``-hf`` downloads beside a model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..engine.errors import EngineError

SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
SIDE_PREFIXES = ("mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp's side-file keywords (gguf_filename_is_model)
SIDE_KINDS = tuple(p.removesuffix("-") for p in SIDE_PREFIXES)
PROJECTOR = "mmproj"  # llama.cpp's keyword for a vision projector file
_NOT_A_MODEL = re.compile(r"mmproj|imatrix", re.IGNORECASE)  # vision projectors, importance matrices (llama.cpp's rule)
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|[BF]F?16|F32|MXFP4(?:_MOE)?|TQ\d_\d)(?![A-Za-z0-9])",
                    re.IGNORECASE)


@dataclass(frozen=True)
class GgufChoice:
    """One model in a repo: a single .gguf, or every shard of a split one (named by its first shard)."""
    repo: str
    file: str
    shards: tuple[str, ...]
    size: int  # bytes, all shards
    quantization: str


def quantization(name: str) -> str:
    """'Qwen2.5-7B-Instruct-Q4_K_M.gguf' -> 'Q4_K_M' (upper case; '' when the name does not say)."""
    found = _QUANT.findall(name.rsplit("/", 1)[-1].removesuffix(".gguf"))
    return found[-1].upper() if found else ""


def group(repo: str, entries: list[tuple[str, int]], whole_only: bool = True) -> list[GgufChoice]:
    """(path, size) of a repo's files -> its GGUF models, split files grouped, smallest first. ``whole_only``: leave
    out a split model whose shards are not all there (an incomplete upload cannot be loaded)."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for path, size in entries:
        if not path.lower().endswith(".gguf"):
            continue
        m = SHARD.match(path)
        groups.setdefault(f"{m['stem']}-00001-of-{m['n']}.gguf" if m else path, []).append((path, size))
    choices = []
    for first, parts in groups.items():
        m = SHARD.match(first)
        if whole_only and m and len(parts) != int(m["n"]):
            continue
        parts.sort()
        choices.append(GgufChoice(repo, first, tuple(p for p, _ in parts), sum(s for _, s in parts),
                                  quantization(first)))
    return sorted(choices, key=lambda c: (c.size, c.file))


def models(choices: list[GgufChoice]) -> list[GgufChoice]:
    """The choices that can be a model: no vision projector, no importance matrix (llama.cpp's
    ``gguf_filename_is_model``, by the file name)."""
    return [c for c in choices if not _NOT_A_MODEL.search(c.file.rsplit("/", 1)[-1])]


def listed(choices: list[GgufChoice]) -> list[tuple[GgufChoice, str]]:
    """A repo's files as a person picks among them: its models first, then its side files, each with a note ('' for
    a model): a side file is a draft for its model, never the model itself."""
    notes = [(c, f"side file ({kind}): a draft for its model" if (kind := side_kind(c.file)) else "") for c in choices]
    return sorted(notes, key=lambda n: bool(n[1]))  # (stable: smallest first within each)


def side_kind(path: str) -> str:
    """The kind of side file ``path`` is ('' for a model): as llama.cpp tells them (``kind-`` in the file name, in
    lower case: ``Qwen3.6-27B-MTP-Q4_K_M.gguf`` and ``…-IQ3_XXS-mtp.gguf`` are models that carry MTP layers), or a
    folder named for the kind (unsloth's ``MTP/``)."""
    folders, name = path.lower().split("/")[:-1], path.rsplit("/", 1)[-1]
    for kind in SIDE_KINDS:
        if kind in folders or kind + "-" in name:
            return kind
    return ""


def is_projector(path: str) -> bool:
    """Whether ``path`` is a vision projector: llama.cpp's keyword ``mmproj`` in it (here in any case)."""
    return path.lower().endswith(".gguf") and PROJECTOR in path.lower()


def projector(choices: list[GgufChoice], model: str) -> GgufChoice | None:
    """The vision projector llama.cpp's ``-hf`` downloads with the repo's ``model`` file (common/download.cpp:
    ``find_best_mmproj`` = ``find_best_sibling(files, model, "mmproj")``): of the ``mmproj`` files in the model's
    folder or a folder above it, one in the deepest such folder, then the one whose quantization is closest in bits
    to the model's (``extract_quant_bits``: the first number of the name's last label, Q4_K_M 4, Q8_0 8, F16 and BF16
    16, none 0), then the first in the repo's listing (by name). None when the repo has no projector for it."""
    folder = model.split("/")[:-1]

    def rank(c: GgufChoice) -> tuple:
        own = c.file.split("/")[:-1]
        return -len(own), abs(_quant_bits(c.file) - _quant_bits(model)), c.file

    found = [c for c in choices if is_projector(c.file) and c.file.split("/")[:-1] == folder[:c.file.count("/")]]
    return min(found, key=rank, default=None)


def _quant_bits(path: str) -> int:
    """llama.cpp's ``extract_quant_bits``: the first number in the last ``-`` / ``.`` label of a GGUF's name (its
    shard suffix aside); 0 where there is none."""
    label = re.search(r"[-.]([A-Za-z0-9_]+)$", _stem(path))
    number = re.search(r"\d+", label[1]) if label else None
    return int(number[0]) if number else 0


def _stem(path: str) -> str:
    """The file name without folders, a shard suffix and ``.gguf``."""
    name = path.rsplit("/", 1)[-1]
    m = SHARD.match(name)
    return re.sub(r"\.gguf$", "", m["stem"] if m else name, flags=re.IGNORECASE)


def _tag_span(name: str, tag: str) -> tuple[int, int] | None:
    """Where ``tag`` stands as a whole label in ``name``'s stem (any case), the last place if several."""
    stem = _stem(name)
    found = list(re.finditer(r"(?<![A-Za-z0-9])" + re.escape(tag) + r"(?![A-Za-z0-9_])", stem, re.IGNORECASE))
    return (found[-1].start(), found[-1].end()) if found else None


def matches(name: str, tag: str, kind: str = "") -> bool:
    """Whether the file ``name`` is what ``tag`` (of side-file ``kind``, '' for a model) asks for."""
    if tag.lower().endswith(".gguf"):
        return name.lower() == tag.lower() or name.rsplit("/", 1)[-1].lower() == tag.rsplit("/", 1)[-1].lower()
    if kind == "" and _NOT_A_MODEL.search(name.rsplit("/", 1)[-1]):
        return False
    return side_kind(name) == kind and _tag_span(name, tag) is not None


def pick(choices: list[GgufChoice], repo: str, tag: str, kind: str = "") -> GgufChoice:
    """The model of ``repo`` (from ``choices``) that ``tag`` names; EngineError, listing what the repo has, when
    the tag names none of them or several equally."""
    what = f"{kind} file" if kind else "GGUF"
    if tag.lower().endswith(".gguf"):  # a file: its exact path, else its name in any case and any folder
        what = "file"
        exact = [c for c in choices if tag in (c.file, *c.shards)]
        found = exact or [c for c in choices if any(matches(s, tag) for s in (c.file, *c.shards))]
    else:
        found = _plainest([c for c in choices if matches(c.file, tag, kind)], tag)
    if len(found) == 1:
        return found[0]
    if not found:
        have = ", ".join(sorted(c.file for c in choices)) or "no GGUF files"
        raise EngineError(f"{repo} has no {tag} {what}; it has: {have}. The catalog entry may be out of date: see "
                          f"`specchat files {repo}`.")
    raise EngineError(f"{tag} fits more than one {what} in {repo}: {', '.join(c.file for c in found)}. Name it in "
                      "full (a longer tag, or file = the .gguf name).")


def _plainest(found: list[GgufChoice], tag: str) -> list[GgufChoice]:
    """Of the models a tag fits, the one whose name, less the tag, every other name starts with (``Model-`` before
    ``Model-UD-``); all of them when there is no such single one."""
    def rest(c: GgufChoice) -> str:
        stem = _stem(c.file).lower()
        start, end = _tag_span(c.file, tag)
        return stem[:start] + stem[end:]

    plain = [c for c in found if all(rest(o).startswith(rest(c)) for o in found)]
    return plain if len(plain) == 1 else found
