"""Images in a prompt, below libmtmd: the checks an image passes before llama.cpp decodes it, and how a drafter that
reads only text sees a prompt with images.

A prompt's token ids hold each image as its placeholder positions (negative ids, see ``llama.vision``). The target
evaluates them through the projector; a draft model or prompt lookup cannot, so ``TextOnly`` shows it the history
with every image replaced by ``placeholder`` tokens (none by default: the text around the image). A head (MTP,
EAGLE-3, Gemma 4's assistant, a block draft) reads the target's own state by position, which saw the image, and
takes the history as it is. Either way the proposals are text tokens the target verifies as always, so output stays
exact whatever the draft sees.
"""
from __future__ import annotations

import io
import warnings

from .drafters import Draft, Drafter, Wrapper
from .drafters.chain import ChainDrafter
from .errors import EngineError
from .sampling import Noise, SamplingParams

FORMATS = ("PNG", "JPEG", "GIF", "BMP")  # what libmtmd's decoder (stb_image) reads
MAX_PIXELS = 100_000_000  # refused above this: decoding alone would take gigabytes
MAX_SIDE = 4096  # larger images are scaled down to this longest side first (projectors scale far lower anyway)


def prepare_image(data: bytes, name: str = "The image") -> bytes:
    """The bytes to hand libmtmd: checked to be a whole image of a format it reads, scaled down when huge. One
    clear EngineError for anything else."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray)) or not data:
        raise EngineError(f"{name} is empty.")
    too_big = f"images up to {MAX_PIXELS // 1_000_000} megapixels are taken: scale it down."
    try:
        with warnings.catch_warnings():  # (PIL's warning about large images: judged here, in words)
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise EngineError(f"{name} is too large; {too_big}") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise EngineError(f"{name} is not an image SpecChat can read (PNG, JPEG, GIF or BMP).") from None
    if img.format not in FORMATS:
        raise EngineError(f"{name} is {img.format}, which the model's image reader does not take: convert it to "
                          "PNG or JPEG.")
    w, h = img.size
    if w * h > MAX_PIXELS:
        raise EngineError(f"{name} is {w}×{h} ({w * h / 1e6:.0f} megapixels); {too_big}")
    try:
        if max(w, h) <= MAX_SIDE:
            img.load()  # a cut-short or damaged file fails here, in words, not inside llama.cpp
            return bytes(data)
        img.draft("RGB", (MAX_SIDE, MAX_SIDE))  # (JPEG: decoded at a reduced scale, cheaply)
        img = img.convert("RGB")
        img.thumbnail((MAX_SIDE, MAX_SIDE))
    except (OSError, ValueError, SyntaxError):
        raise EngineError(f"{name} could not be decoded: the file is damaged or cut short.") from None
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def has_images(ids: list[int]) -> bool:
    return bool(ids) and min(ids) < 0


def through_images(ids: list[int]) -> int:
    """How many of ``ids`` run through the last image (0: none)."""
    return max((i + 1 for i, tok in enumerate(ids) if tok < 0), default=0)


def text_view(ids: list[int], placeholder: tuple[int, ...] = ()) -> list[int]:
    """``ids`` with each image (a run of one negative id; two equal images in a row read as one) replaced by
    ``placeholder``."""
    out: list[int] = []
    prev = 0
    for tok in ids:
        if tok >= 0:
            out.append(tok)
        elif tok != prev:
            out.extend(placeholder)
        prev = tok
    return out


def for_images(d: Drafter) -> Drafter:
    """``d`` on a prompt with images: a drafter that reads text sees the text around them, a head the target's
    state, which saw them; a chain, each member as it reads."""
    if isinstance(d, ChainDrafter):  # (a new chain: the one given is left as it was)
        return ChainDrafter([(for_images(m.drafter), m.costly) for m in d.members])
    return TextOnly(d) if d.speculates and d.READS_TEXT and not isinstance(d, TextOnly) else d


class TextOnly(Wrapper):
    """A drafter that reads text, on a prompt with images: it sees the prompt's text view and the answer so far.
    Everything else (its name, signals, contexts) is the wrapped drafter's."""

    def __init__(self, inner: Drafter, placeholder: tuple[int, ...] = ()):
        super().__init__(inner)
        self.placeholder = placeholder
        self._n_prompt = 0
        self._text: list[int] = []

    def _view(self, history: list[int]) -> list[int]:
        return self._text + history[self._n_prompt:]  # (an answer holds no images)

    def begin(self, prompt_ids: list[int]) -> None:
        self._n_prompt, self._text = len(prompt_ids), text_view(prompt_ids, self.placeholder)
        self.inner.begin(self._text)

    def propose(self, history, n_max, sp: SamplingParams, rng: Noise, gate=None, stop=None) -> Draft:
        return self.inner.propose(self._view(history), n_max, sp, rng, gate, stop)

    def draft_round(self, history, n_max, limit, sp, rng, gate) -> Draft:
        return self.inner.draft_round(self._view(history), n_max, limit, sp, rng, gate)
