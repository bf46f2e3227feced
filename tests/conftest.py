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


# The test command runs the files on pytest-xdist workers, a file per worker at a time (pyproject.toml's addopts):
# a file's module fixtures (a started app, a loaded pair) are made once. These files take minutes (the "seconds per
# file" table in each run's log): they start first, so that no worker is left running one of them while the other
# has nothing to do. The rest keep their order.
LONG_FILES = ("test_app_browser.py", "test_starter.py", "test_vulkan_offload.py", "test_ngram_kinds.py",
              "test_bundle.py", "test_exact_sampling.py", "test_heads.py", "test_speculative_servers.py",
              "test_recurrent.py", "test_cli.py", "test_hostile_requests.py", "test_hub.py", "test_remote.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core, at most 4 (each may hold a loaded model pair and a browser)."""
    return max(1, min(os.cpu_count() or 1, 4))


_FILE_SECONDS: dict[str, float] = {}
_TEST_SECONDS: dict[str, dict[str, float]] = {}
_STARTED = (time.monotonic(), os.times())
_WORKERS_CPU: list[float] = []  # each xdist worker's CPU seconds, as it reported them on stopping


def _cpu_seconds(children: bool = True) -> float:
    """User and system time since the run began: this process's, and (``children``) its reaped children's."""
    return sum(b - a for a, b in zip(_STARTED[1][:4 if children else 2], os.times()[:4 if children else 2]))


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its CPU time goes to the controller
        session.config.workeroutput["cpu_seconds"] = _cpu_seconds()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKERS_CPU.append(getattr(node, "workeroutput", {}).get("cpu_seconds", 0.0))


def pytest_runtest_logreport(report):
    """Each test's set-up, call and tear-down, added to its file's time."""
    name = report.nodeid.split("::")[0]
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration
    _TEST_SECONDS.setdefault(report.nodeid, {})[report.when] = round(report.duration, 3)


def pytest_terminal_summary(terminalreporter):
    """The time per file, slowest first, in every run's log (with --durations' slowest tests): where CI time goes.
    Beside it the run's CPU time, its own, its workers' and their children's: on 2 cores, wall time can never drop
    below half of it however the tests are spread. Every test's phases go to artifacts/durations.json."""
    if not _FILE_SECONDS or hasattr(terminalreporter.config, "workerinput"):  # (the controller reports for all)
        return
    terminalreporter.section("seconds per file")
    for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f}  in all")
    wall = time.monotonic() - _STARTED[0]
    # (xdist's workers are the controller's children: counted once, as each reported its own and its children's)
    cpu = _cpu_seconds(children=not _WORKERS_CPU) + sum(_WORKERS_CPU)
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
