"""Images in the chat: what the message box's attachments become (checked bytes, or one message in words), the
files the page shows them from, and the words beside the attach button.

A message's images live as bytes (in the history and the conversations file); the page needs files, so each is
written once, named by its hash, into a temporary folder of this process.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..chat.conversations import image_type
from ..engine import EngineError
from ..engine.images import prepare_image
from ..paths import temp_folder

MAX_BYTES = 20 * 2**20  # per image: a photo is a few MB; the conversations file keeps every image sent
SUFFIX = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/bmp": ".bmp"}
_folder: Path | None = None


def box_parts(value) -> tuple[str, list[str]]:
    """The message box's text and its attached files' paths (a plain string from an API client: text only)."""
    if isinstance(value, str) or value is None:
        return (value or ""), []
    files = [f if isinstance(f, str) else f.get("path") for f in value.get("files") or []]
    return value.get("text") or "", [f for f in files if f]


def read_images(paths: list[str]) -> list[bytes]:
    """The attached files as image bytes the engine takes; an EngineError in words for the first that is not one."""
    out = []
    for i, path in enumerate(paths):
        name = f"The attached file {Path(path).name!r}" if len(paths) == 1 else \
            f"Attachment {i + 1} ({Path(path).name})"
        try:
            size = Path(path).stat().st_size
            if size > MAX_BYTES:
                raise EngineError(f"{name} is {size / 2**20:.0f} MB; images up to {MAX_BYTES // 2**20} MB are "
                                  "taken: scale it down.")
            data = Path(path).read_bytes()
        except OSError as exc:
            raise EngineError(f"{name} could not be read ({exc.strerror or exc}): attach it again.") from None
        out.append(prepare_image(data, name))
    return out


def image_file(data: bytes) -> str:
    """A file holding ``data`` for the page to show (written once per image)."""
    global _folder
    if _folder is None:
        _folder = temp_folder("images")
    path = _folder / (hashlib.sha256(data).hexdigest()[:32] + SUFFIX.get(image_type(data), ".img"))
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def box_value(text: str, images: list[bytes]) -> dict:
    """The message box holding ``text`` and ``images`` again (a refused message goes back as it was)."""
    return {"text": text, "files": [image_file(b) for b in images]}


def note(takes_images: bool, remote: bool = False) -> str:
    """The words beside the attach button."""
    if takes_images:
        return ('<div class="spec-images" data-images="yes">Images: attach them (the paperclip), paste them or drop '
                'them on the box, several per message.</div>')
    why = "The server's model takes no images (it says so): serve it with its vision projector to attach them." \
        if remote else "This model takes no images: load it with its vision projector (an mmproj GGUF beside the " \
        "target, or --mmproj) to attach them."
    return f'<div class="spec-images" data-images="no">{why}</div>'
