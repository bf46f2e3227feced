"""The real app (`specchat`, starter pair) in a real browser: Debian's chromium driven by Playwright.

Screenshots land in tests/artifacts/ (or $SPECCHAT_ARTIFACTS). Without chromium these tests are skipped, unless
SPECCHAT_REQUIRE_BROWSER=1 (CI sets it) makes that a failure.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("SPECCHAT_ARTIFACTS", Path(__file__).parent / "artifacts"))
LONG_PROMPT = "Write a long story about a lighthouse keeper and a storm, with many details."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
    """A local stand-in for the Hub serving a tiny pair ("tiny"), which the app's catalog gains."""
    from fake_hub import FakeHub
    from tiny_gguf import write_model

    d = tmp_path_factory.mktemp("hub-pair")
    hub = FakeHub()
    hub.add("tests/tiny", {"tiny-target-F32.gguf": write_model(d / "t.gguf", seed=1, n_embd=128).read_bytes(),
                           "tiny-draft-F32.gguf": write_model(d / "d.gguf", seed=2, base_seed=1, noise=0.1,
                                                              n_embd=128).read_bytes()})
    catalog = d / "models.toml"
    catalog.write_text((Path(__file__).parent.parent / "models.toml").read_text() + """
[pairs.tiny]
description = "A tiny random pair served by the tests' fake Hub."
license = "test"
target = { repo = "tests/tiny", file = "tiny-target-F32.gguf", quantization = "F32", size_gb = 0.0005 }
draft = { repo = "tests/tiny", file = "tiny-draft-F32.gguf", quantization = "F32", size_gb = 0.0005 }
""")
    yield hub, catalog
    hub.close()


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, fake_hub):
    home = tmp_path_factory.mktemp("home")
    port = _free_port()
    net_log = home / "outside-connections.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1", SPECCHAT_NET_LOG=str(net_log),
               HF_ENDPOINT=fake_hub[0].url, HF_HUB_CACHE=str(home / "hub"), SPECCHAT_MODELS=str(fake_hub[1]))
    # specchat's main(), with every connection beyond loopback logged (tests/net_guard.py)
    guard = Path(__file__).with_name("net_guard.py")
    proc = subprocess.Popen([sys.executable, str(guard), "--no-browser", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "running at" in line:
            break
    else:
        proc.kill()
    assert any(f"http://127.0.0.1:{port}/" in ln for ln in lines), "".join(lines)
    yield f"http://127.0.0.1:{port}/", home
    proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean shutdown
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, "".join(lines) + out
    assert net_log.read_text() == "", "the app reached beyond 127.0.0.1"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("SPECCHAT_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is not installed (apt install chromium)")
        pytest.skip("chromium is not installed (apt install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update"])
        yield b
        b.close()


class Page:
    """A browser tab on the app, recording every request it makes."""

    def __init__(self, browser, url: str):
        self.url = url
        self.page = browser.new_page(viewport={"width": 1400, "height": 950})
        self.requests: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(url, wait_until="domcontentloaded")
        self.page.locator("#msg textarea").wait_for(state="visible", timeout=60_000)

    def live(self) -> dict:
        el = self.page.locator("#live-stats .spec-live")
        return {k: el.get_attribute(f"data-{k}") for k in ("state", "acceptance", "tps", "tokens")}

    def send(self, text: str) -> None:
        self.page.locator("#msg textarea").fill(text)
        self.page.locator("#send").click()

    def wait_state(self, states: tuple[str, ...], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = self.live()
            if live["state"] in states:
                return live
            time.sleep(0.05)
        raise AssertionError(f"live panel never reached {states}: {self.live()}")

    def set_number(self, elem_id: str, value: str) -> None:
        sidebar = self.page.locator(f"#{elem_id} input")
        if not sidebar.is_visible():
            self.page.get_by_label("Toggle Sidebar").click()
        sidebar.fill(value)
        sidebar.press("Tab")

    def notice(self) -> str:
        return self.page.locator("#notice").inner_text()

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def outside_requests(self) -> list[str]:
        return [u for u in self.requests if not re.match(r"^(https?|wss?)://127\.0\.0\.1[:/]", u)
                and not u.startswith(("data:", "blob:"))]

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def page(browser, app_url):
    p = Page(browser, app_url[0])
    p.page.locator("#clear").click()
    yield p
    assert p.outside_requests() == []  # the page never reaches beyond 127.0.0.1
    p.close()


def test_chat_streams_with_live_stats(page, app_url):
    page.send(LONG_PROMPT)
    during = page.wait_state(("running",))
    samples = []
    while (live := page.live())["state"] == "running":
        samples.append(live)
        if len(samples) == 10:
            page.shot("chat-streaming")
        time.sleep(0.1)
    assert live["state"] == "done"
    streaming = [s for s in samples + [during] if int(s["tokens"]) > 8]
    assert streaming, samples
    assert any(float(s["acceptance"]) > 0 and float(s["tps"]) > 0 for s in streaming), streaming
    assert float(live["acceptance"]) > 0 and float(live["tps"]) > 0 and int(live["tokens"]) > 8
    chat = page.page.locator("#chat")
    assert "lighthouse" in chat.inner_text().lower()
    assert re.search(r"tok/s · acceptance \d+\.\d%", chat.inner_text())  # the answer keeps its stats line
    page.shot("chat-done")

    # Draft tokens get their own colour when the toggle is on.
    page.page.locator("#show-draft input").check()
    page.page.locator("#chat .tok-draft").first.wait_for(timeout=10_000)
    page.shot("chat-draft-tokens")

    # The conversation is saved (atomically, as JSON) and comes back on reload.
    saved = json.loads((app_url[1] / "data" / "history.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"]
    assert saved["messages"][1]["stats"]["n_tokens"] == int(live["tokens"])
    page.page.reload(wait_until="domcontentloaded")
    page.page.locator("#chat").get_by_text(LONG_PROMPT).wait_for(timeout=30_000)


def test_stop_ends_generation_within_a_second(page):
    page.send(LONG_PROMPT)
    deadline = time.monotonic() + 60
    while int(page.live()["tokens"] or 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    page.page.locator("#stop").click()
    live = page.wait_state(("cancelled", "done"), timeout=10)
    elapsed = time.monotonic() - t0
    assert live["state"] == "cancelled"
    assert elapsed < 1.0, f"stop took {elapsed:.2f} s"
    assert "stopped" in page.page.locator("#chat").inner_text()  # the partial answer stays, marked
    page.shot("chat-stopped")


def test_compare_reports_speedup_and_identical(page):
    page.page.get_by_role("tab", name="Compare").click()
    page.page.locator("#cmp-prompt textarea").fill("Explain in three sentences why the sky is blue.")
    page.page.locator("#cmp-run").click()
    summary = page.page.locator("#cmp-summary .spec-compare[data-speedup]")
    summary.wait_for(timeout=180_000)
    assert float(summary.get_attribute("data-speedup")) > 0
    assert "outputs identical" in summary.inner_text()
    assert page.page.locator("#cmp-off textarea").input_value() == page.page.locator("#cmp-on textarea").input_value()
    assert "1" in page.page.locator("#cmp-table").inner_text()  # the run is in the session's table
    page.page.locator("#cmp-chart svg.spec-bars").wait_for()
    page.shot("compare")
    with page.page.expect_download() as download:  # the session's table, exported
        page.page.get_by_role("button", name="Export CSV").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0].startswith("run,prompt,drafter,tokens") and lines[1].endswith(",yes")


def test_bad_input_shows_an_error_and_the_app_keeps_working(page):
    page.send("Say hello.")
    page.wait_state(("done",))
    before = page.page.locator("#chat").inner_text()

    page.set_number("top-k", "-3")  # an invalid setting
    page.send("This message must not be lost.")
    page.page.locator("#notice .error").wait_for(timeout=30_000)
    assert "top-k" in page.notice().lower()
    assert page.page.locator("#msg textarea").input_value() == "This message must not be lost."
    page.shot("error-invalid-setting")

    page.set_number("top-k", "40")
    page.send("word " * 5000)  # longer than the 4096-token context
    page.page.locator("#notice .error").get_by_text("context").wait_for(timeout=30_000)
    assert "tokens but the context holds" in page.notice()
    assert page.page.locator("#msg textarea").input_value().startswith("word word")
    assert page.page.locator("#chat").inner_text() == before  # the history is untouched
    page.shot("error-long-prompt")

    page.send("Say goodbye.")  # and the app still answers
    page.wait_state(("running", "done"))
    assert page.wait_state(("done", "error", "cancelled"))["state"] == "done"
    assert "goodbye" in page.page.locator("#chat").inner_text().lower()


def test_two_tabs_are_queued_not_interleaved(browser, app_url):
    a, b = Page(browser, app_url[0]), Page(browser, app_url[0])
    try:
        for p in (a, b):
            p.page.locator("#clear").click()
        prompt = "List five facts about the moon."
        a.send(prompt)
        b.send(prompt)
        both_running = False
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            sa, sb = a.live()["state"], b.live()["state"]
            both_running |= sa == "running" and sb == "running"
            if sa == "done" and sb == "done":
                break
            time.sleep(0.05)
        assert (a.live()["state"], b.live()["state"]) == ("done", "done")
        assert not both_running
        # One context each in turn: the same greedy answer in both tabs.
        answer = lambda p: [ln for ln in p.page.locator("#chat").inner_text().splitlines() if "tok/s" not in ln]  # noqa
        assert answer(a) == answer(b) and len(answer(a)) > 1
        b.shot("two-tabs")
        assert a.outside_requests() == [] and b.outside_requests() == []
    finally:
        a.close()
        b.close()


def test_hardware_panel(page):
    page.page.get_by_role("tab", name="Hardware").click()
    text = page.page.locator("#hardware").inner_text()
    assert "GiB free" in text and "GPU offload" in text and "starter" in text
    assert re.search(r"Pair memory\s+\d+\.\d\d GiB", text)
    page.shot("hardware")


def test_a_pair_that_fails_to_load_keeps_the_previous_one(page, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)  # a GGUF header cut short
    page.page.get_by_label("Toggle Sidebar").click()
    page.page.locator("#pair input").click()
    page.page.get_by_role("option", name="(GGUF files below)").click()
    page.page.locator("#target-path textarea").fill(str(bad))
    page.page.locator("#load").click()
    page.page.locator("#notice .error").wait_for(timeout=60_000)
    assert "broken.gguf" in page.notice() and "still loaded" in page.notice()
    assert "starter" in page.page.locator(".spec-header .pair").inner_text()
    page.shot("error-bad-pair")

    page.page.locator("#pair input").click()
    page.page.get_by_role("option", name="starter").click()
    page.page.locator("#load").click()
    page.page.locator("#notice .info").get_by_text("Loaded starter").wait_for(timeout=60_000)
    page.send("Say hello.")
    page.wait_state(("running", "done"))
    assert page.wait_state(("done", "error"))["state"] == "done"


def test_models_view_downloads_with_progress_and_offers_the_pair(page, fake_hub):
    hub = fake_hub[0]
    hub.rate = 150_000  # bytes/s: the ~0.5 MB pair takes a few seconds, so progress is seen moving
    p = page.page
    p.get_by_role("tab", name="Models").click()
    row = p.locator('#models-table tr[data-pair="tiny"]')
    row.wait_for(timeout=30_000)
    assert row.get_attribute("data-state") == "none"
    assert p.locator('#models-table tr[data-pair="qwen2.5-7b-instruct"]').count() == 1
    p.locator("#models-pair input").click()
    p.get_by_role("option", name="tiny", exact=True).click()
    p.locator("#models-download").click()

    seen_partial = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        box = p.locator("#models-progress .spec-download")
        if box.count() and box.get_attribute("data-state") == "done":
            break
        for f in p.locator("#models-progress .spec-dl-file").all():
            done, total = int(f.get_attribute("data-done")), int(f.get_attribute("data-total"))
            seen_partial |= 0 < done < total
        if seen_partial and not os.path.exists(ARTIFACTS / "models-downloading.png"):
            page.shot("models-downloading")
        time.sleep(0.1)
    assert p.locator("#models-progress .spec-download").get_attribute("data-state") == "done"
    assert seen_partial, "no intermediate progress was shown"
    assert "Downloaded and verified 2 file(s)" in p.locator("#models-progress").inner_text()
    p.locator('#models-table tr[data-pair="tiny"][data-state="ready"]').wait_for(timeout=10_000)
    page.shot("models-downloaded")

    # the chat's pair picker now offers it, and it loads and answers
    p.get_by_label("Toggle Sidebar").click()
    p.locator("#pair input").click()
    p.get_by_role("option", name="tiny", exact=True).click()
    p.locator("#load").click()
    p.get_by_role("tab", name="Chat").click()
    p.locator("#notice .info").get_by_text("Loaded tiny").wait_for(timeout=60_000)
    page.send("the cat")
    assert page.wait_state(("done", "error"))["state"] == "done"

    # back to the starter, so the rest of the session is as it began
    p.locator("#pair input").click()
    p.get_by_role("option", name="starter", exact=True).click()
    p.locator("#load").click()
    p.locator("#notice .info").get_by_text("Loaded starter").wait_for(timeout=60_000)


def test_models_view_checks_your_own_pair(page, tmp_path):
    from tiny_gguf import write_model

    target = write_model(tmp_path / "t.gguf", seed=1)
    other = write_model(tmp_path / "o.gguf", seed=2, rename={300: "▁zebra"})
    p = page.page
    p.get_by_role("tab", name="Models").click()
    p.locator("#own-target textarea").fill(str(target))
    p.locator("#own-draft textarea").fill(str(other))
    p.locator("#own-check").click()
    p.locator("#pair-report-body").wait_for(timeout=30_000)
    text = p.locator("#pair-report").inner_text()
    assert "NOT compatible: token 300 means" in text and "recommended offload: -ngl 0 -ngld 0" in text
    page.shot("models-check")
    p.locator("#own-draft textarea").fill(str(tmp_path / "missing.gguf"))
    p.locator("#own-check").click()
    p.locator("#pair-report .error").wait_for(timeout=30_000)
    assert "not found" in p.locator("#pair-report").inner_text()
