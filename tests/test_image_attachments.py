"""What the message box's attachments become before anything is stored: image bytes, or one message in words."""
from __future__ import annotations

import pytest
from support.tiny_vision import png_bytes

from app.engine import EngineError
from app.ui import attachments


def test_attached_images_are_read_in_order_and_shown_from_files(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(png_bytes(1))
    b.write_bytes(png_bytes(2))
    text, paths = attachments.box_parts({"text": "look", "files": [{"path": str(a)}, str(b)]})
    assert text == "look" and attachments.read_images(paths) == [png_bytes(1), png_bytes(2)]
    assert attachments.box_parts("plain text from an API client") == ("plain text from an API client", [])
    restored = attachments.box_value("look", [png_bytes(1)])  # a refused message goes back into the box
    assert restored["text"] == "look" and open(restored["files"][0], "rb").read() == png_bytes(1)
    assert restored["files"][0].endswith(".png")


@pytest.mark.parametrize("content, words", [
    (b"these are words, not pixels", "is not an image SpecChat can read"),
    (png_bytes(3)[:200], "damaged or cut short"),
    (None, "images up to 20 MB are taken"),  # a 21 MB file
])
def test_a_bad_attachment_is_one_message_naming_the_file(tmp_path, content, words):
    bad = tmp_path / "holiday.png"
    if content is None:
        with open(bad, "wb") as f:
            f.truncate(21 * 2**20)
    else:
        bad.write_bytes(content)
    good = tmp_path / "good.png"
    good.write_bytes(png_bytes(1))
    with pytest.raises(EngineError, match=words) as err:
        attachments.read_images([str(good), str(bad)])
    assert "Attachment 2 (holiday.png)" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EngineError, match="could not be read"):
        attachments.read_images([str(tmp_path / "gone.png")])
