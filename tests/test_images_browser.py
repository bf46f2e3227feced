"""Images in the real app in a real browser: pasted, attached with the button and dropped, answered, kept across a
restart, in Compare too; a model without a projector says so and refuses them keeping the text. The app runs the tiny vision set (tests/support/tiny_vision.py:
a projector beside the target, found as a person's would be)."""
from __future__ import annotations

import base64
import sqlite3

import pytest
from support.servers import App
from support.tiny_gguf import write_model
from support.tiny_vision import png_bytes, write_png, write_projector
from test_app_browser import Page

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# A PNG file given as a person's clipboard or a drag from the file manager gives it (a DataTransfer holding it).
FILE = """const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, {type: "image/png"}));"""
PASTE = """([b64, name]) => {%s
    document.querySelector("#msg textarea").dispatchEvent(
        new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
}""" % FILE
DROP = """([b64, name]) => {%s
    const box = document.querySelector("#msg .full-container");
    for (const kind of ["dragenter", "dragover", "drop"])
        box.dispatchEvent(new DragEvent(kind, {dataTransfer: data, bubbles: true, cancelable: true}));
}""" % FILE


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    d = tmp_path_factory.mktemp("app-vision")
    return {"target": write_model(d / "target.gguf", seed=3),
            "draft": write_model(d / "draft.gguf", seed=4, base_seed=3, noise=0.3),
            "mmproj": write_projector(d / "mmproj-target.gguf", n_embd_text=64),
            "b": write_png(d / "b.png", seed=2), "dir": d}


def start(home, vision, *flags) -> App:
    return App(home, "--target", str(vision["target"]), "--draft", str(vision["draft"]), "--ctx", "512", *flags)


def box_images(page: Page, n: int) -> None:
    """Wait until the message box shows ``n`` attached images (their uploads done)."""
    page.page.wait_for_function(f"document.querySelectorAll('#msg .thumbnail-item').length === {n}", timeout=60_000)


def type_and_enter(page: Page, text: str) -> None:
    if not page.page.locator("#msg textarea").is_visible():  # (a setting was just changed in its tab)
        page.tab("Chat")
    page.page.locator("#msg textarea").click()
    page.page.keyboard.type(text)
    page.page.keyboard.press("Enter")


def compare(page: Page, more: str, other_than: str | None = None) -> str:
    """Type ``more`` into Compare's prompt and press Enter; the text both runs wrote, once they are done (and their
    text is not ``other_than``, the last run's)."""
    page.page.locator("#cmp-prompt textarea").click()
    page.page.keyboard.type(more)
    page.page.keyboard.press("Enter")
    page.page.wait_for_function("""(previous) => {
        const text = side => document.querySelector('#cmp-' + side).innerText.split('\\n').slice(1).join('\\n').trim();
        return document.querySelector('#cmp-summary .spec-compare[data-speedup]') !== null
            && text('off') === text('on') && text('off') !== previous;
    }""", arg=other_than, timeout=300_000)
    assert "outputs identical" in page.page.locator("#cmp-summary").inner_text()
    return page.page.locator("#cmp-off").inner_text().split("\n", 1)[1].strip()


def user_images(page: Page) -> int:
    return page.page.locator("#chat .user img").count()


def test_images_by_paste_and_button_are_answered_and_come_back_after_a_restart(browser, tmp_path, vision):
    app = start(tmp_path, vision)
    p = Page(browser, app.url)
    try:
        assert "attach" in p.page.locator("#image-note [data-images='yes']").inner_text()
        # A file that is not an image, then a PNG cut short: one message each, the text stays.
        bad = vision["dir"] / "notes.png"
        bad.write_bytes(b"these are words, not pixels" * 10)
        cut = vision["dir"] / "cut.png"
        cut.write_bytes(png_bytes(5)[:200])
        for path, words in ((bad, "not an image"), (cut, "damaged or cut short")):
            p.page.locator("#msg input[type=file]").set_input_files(str(path))
            box_images(p, 1)
            type_and_enter(p, "Keep me.")
            p.page.locator("#notice .error").get_by_text(words).wait_for(timeout=60_000)
            assert p.page.locator("#msg textarea").input_value() == "Keep me."
            p.page.locator("#msg .delete-button").click()  # as a person would: remove it, clear the text
            p.page.locator("#msg textarea").fill("")
            box_images(p, 0)
        p.shot("images-bad-file")

        p.page.evaluate(PASTE, [base64.b64encode(png_bytes(1)).decode(), "pasted.png"])
        box_images(p, 1)
        p.page.locator("#msg input[type=file]").set_input_files(str(vision["b"]))
        box_images(p, 2)
        p.set_number("top-k", "-3")  # an error once the message is sent: it comes back into the box, images too
        type_and_enter(p, "the cat sat on")
        p.page.locator("#notice .error").get_by_text("Top-k").wait_for(timeout=60_000)
        box_images(p, 2)
        assert p.page.locator("#msg textarea").input_value() == "the cat sat on" and user_images(p) == 0
        p.set_number("top-k", "40")
        p.tab("Chat")
        p.page.locator("#msg textarea").press("Enter")  # sent again as it came back
        box_images(p, 0)  # sent: the box empties (the live panel leaves the last error's state)
        assert p.wait_state(("done", "error", "cancelled"), timeout=300)["state"] == "done"
        assert user_images(p) == 2 and "the cat sat on" in p.page.locator("#chat").inner_text()
        answer = p.page.locator("#chat .bot").first.inner_text().strip()
        assert answer
        p.shot("images-answered")

        # Its text edited by keyboard: answered again, with its images (they stay in the chat and in the store).
        p.page.locator('#chat button[aria-label="Edit"]').focus()
        p.page.keyboard.press("Enter")
        p.page.locator("#chat textarea.edit-textarea").wait_for(timeout=10_000)
        p.page.keyboard.press("Control+A")
        p.page.keyboard.type("the dog sat on")
        p.page.keyboard.press("Enter")
        p.page.locator("#chat .user-row").filter(has_text="the dog sat on").wait_for(timeout=60_000)
        # (the page drops the images while it sends the edit; the app's reply to it, the answer queued, has them)
        p.page.wait_for_function("document.querySelectorAll('#chat .user img').length === 2", timeout=60_000)
        assert p.wait_state(("done", "error", "cancelled"), timeout=300)["state"] == "done"
        said = [text.strip() for text in p.page.locator("#chat .user-row").all_inner_texts() if text.strip()]
        assert user_images(p) == 2 and said == ["the dog sat on"]
        assert p.conversations() == ["the dog sat on"]  # the first message names it, edited too
        answer = p.page.locator("#chat .bot").first.inner_text().strip()
        db = sqlite3.connect(tmp_path / "data" / "conversations.sqlite3")
        stored = [bytes(r[0]) for r in db.execute("SELECT data FROM images ORDER BY id")]
        asked = [r[0] for r in db.execute("SELECT content FROM messages WHERE role = 'user'")]
        db.close()
        assert stored == [png_bytes(1), vision["b"].read_bytes()]  # pasted first, then the button's
        assert asked == ["the dog sat on"]

        # Compare: both runs get the image (greedy: the same text), and it is read (without it the text differs).
        p.page.get_by_role("tab", name="Compare").click()
        p.page.locator("#cmp-prompt input[type=file]").set_input_files(str(vision["b"]))
        p.page.wait_for_function("document.querySelectorAll('#cmp-prompt .thumbnail-item').length === 1",
                                 timeout=60_000)
        with_image = compare(p, "the cat sat on")
        p.page.locator("#cmp-prompt .delete-button").click()
        p.page.wait_for_function("document.querySelectorAll('#cmp-prompt .thumbnail-item').length === 0",
                                 timeout=60_000)
        compare(p, "", other_than=with_image)  # (waits for a text other than with the image)
        p.page.get_by_role("tab", name="Chat").click()
    finally:
        p.close()
        app.stop()

    app = start(tmp_path, vision)  # the conversation opens on the next start with its images
    p = Page(browser, app.url)
    try:
        p.page.wait_for_function("document.querySelectorAll('#chat .user img').length === 2", timeout=60_000)
        assert answer in p.page.locator("#chat").inner_text()
        p.shot("images-after-restart")
    finally:
        p.close()
        app.stop()


def test_a_model_without_a_projector_says_so_and_refuses_an_image_keeping_the_text(browser, tmp_path, vision):
    app = start(tmp_path, vision, "--no-mmproj")
    p = Page(browser, app.url)
    try:
        note = p.page.locator("#image-note [data-images='no']")
        assert "takes no images" in note.inner_text() and not note.is_visible()  # said once an image comes
        p.page.evaluate(DROP, [base64.b64encode(vision["b"].read_bytes()).decode(), "dropped.png"])  # dragged in
        box_images(p, 1)
        note.wait_for(state="visible", timeout=10_000)
        type_and_enter(p, "What is this?")
        p.page.locator("#notice .error").get_by_text("takes no images").wait_for(timeout=60_000)
        assert p.page.locator("#msg textarea").input_value() == "What is this?"
        assert user_images(p) == 0 and p.conversations() == []  # nothing was sent or stored
        p.shot("images-refused")
        p.page.locator("#msg .delete-button").click()  # the text alone is answered
        p.page.locator("#msg textarea").press("Enter")
        assert p.wait_state(("done", "error", "cancelled"), timeout=300)["state"] == "done"
        assert p.conversations() == ["What is this?"]
    finally:
        p.close()
        app.stop()
