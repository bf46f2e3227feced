from app.engine.text_stream import TextStream


def test_multibyte_characters_arrive_whole():
    s = TextStream()
    data = "héllo 🙂!".encode()
    out = [s.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + s.flush() == "héllo 🙂!"
    assert all("\ufffd" not in piece for piece in out)
    # the emoji's first three bytes release nothing; its fourth releases the whole character
    start = len("héllo ".encode())
    assert out[start : start + 3] == ["", "", ""] and out[start + 3] == "🙂"


def test_stop_string_is_cut_and_never_shown():
    s = TextStream(stop=("END",))
    shown = s.feed(b"abc E") + s.feed(b"N") + s.feed(b"D tail")
    assert shown == "abc "
    assert s.stopped and s.text == "abc "
    assert s.feed(b"more") == ""


def test_partial_stop_prefix_is_released_when_it_diverges():
    s = TextStream(stop=("</answer>",))
    assert s.feed(b"x </ans") == "x "
    assert s.feed(b"wer is") == "</answer is"
    assert s.text == "x </answer is" and not s.stopped


def test_flush_releases_held_text_at_the_end():
    s = TextStream(stop=("STOP",))
    assert s.feed(b"go ST") == "go "
    assert s.flush() == "ST"
    assert s.text == "go ST"
