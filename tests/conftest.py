import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import ARTIFACTS, announce  # noqa: E402
from support.tiny_gguf import write_model  # noqa: E402


def pytest_configure(config):
    announce.attach(config)  # minutes-long set-up inside a test says so at once (building llama-server)


_FILE_SECONDS: dict[str, float] = {}
_TEST_SECONDS: dict[str, dict[str, float]] = {}
_STARTED = (time.monotonic(), os.times())


def pytest_runtest_logreport(report):
    """Each test's set-up, call and tear-down, added to its file's time."""
    name = report.nodeid.split("::")[0]
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration
    _TEST_SECONDS.setdefault(report.nodeid, {})[report.when] = round(report.duration, 3)


def pytest_terminal_summary(terminalreporter):
    """The time per file, slowest first, in every run's log (with --durations' slowest tests): where CI time goes.
    Beside it the run's CPU time, its own and its finished children's: on 2 cores, wall time can never drop below
    half of it however the tests are spread. Every test's phases go to artifacts/durations.json."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("seconds per file")
    for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f}  in all")
    wall, (t0, now) = time.monotonic() - _STARTED[0], (_STARTED[1], os.times())
    cpu = sum(b - a for a, b in zip(t0[:4], now[:4]))  # user and system, this process and its reaped children
    terminalreporter.write_line(f"{cpu:8.1f}  CPU seconds in {wall:.0f} s of wall time "
                                f"({cpu / wall:.2f} of {os.cpu_count()} cores busy)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "durations.json").write_text(json.dumps(_TEST_SECONDS, indent=0, sort_keys=True))


@pytest.fixture(scope="session", autouse=True)
def specchat_home(tmp_path_factory):
    """Keep the tests' data (the starter F32 target among it) out of the user's real data dir."""
    home = os.environ.get("SPECCHAT_TEST_HOME") or str(tmp_path_factory.mktemp("specchat-home"))
    os.environ["SPECCHAT_HOME"] = home
    return Path(home)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Tiny GGUF models written by the tests: a target, drafts of it, and files that must be refused."""
    d = tmp_path_factory.mktemp("tiny-models")
    m = {
        "target": write_model(d / "target.gguf", seed=1),
        # a perturbed copy of the target: accepts some drafts, rejects others
        "draft": write_model(d / "draft.gguf", seed=2, base_seed=1, noise=0.3),
        # a close copy: long accepted runs (exercises full acceptance and the bonus token)
        "close_draft": write_model(d / "close_draft.gguf", seed=3, base_seed=1, noise=0.02),
        "other_text": write_model(d / "other_text.gguf", seed=2, rename={300: "▁zebra"}),
        "other_size": write_model(d / "other_size.gguf", seed=2, extra_words=40 + 200),
        "other_type": write_model(d / "other_type.gguf", seed=2, vocab_model="gpt2"),
        "other_bos": write_model(d / "other_bos.gguf", seed=2, bos=3),
    }
    return m


@pytest.fixture(scope="session")
def tiny_engine(models):
    from app.engine import Engine, ModelSettings

    e = Engine(ModelSettings(models["target"], n_ctx=512), ModelSettings(models["draft"], n_ctx=512))
    yield e
    e.close()


@pytest.fixture(scope="session")
def close_engine(models):
    from app.engine import Engine, ModelSettings

    e = Engine(ModelSettings(models["target"], n_ctx=512), ModelSettings(models["close_draft"], n_ctx=512))
    yield e
    e.close()


@pytest.fixture(scope="session")
def starter_engine(specchat_home):
    from app.models import starter
    from app.engine import Engine, ModelSettings

    e = Engine(ModelSettings(starter.target_path(), n_ctx=2048), ModelSettings(starter.draft_path(), n_ctx=2048))
    yield e
    e.close()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium through Playwright; skipped without it, unless SPECCHAT_REQUIRE_BROWSER=1 (CI)."""
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
