"""The offload path in every test run: the pinned llama.cpp built for Vulkan (tests/support/vulkan_build.py) and
run on Mesa's lavapipe, a Vulkan device on the CPU, with the engine's tests and the GPU checks in processes of their
own (llama-cpp-python loads its libraries once per process). lavapipe's kernels round a verification batch apart
from one token, as a real GPU's do, so this covers what a GPU user's build runs: Model(n_gpu_layers=N), the fit to
a device's memory, the Hardware tab's device, batch_invariant false and exactness up to near-ties.

Where the machine lacks the Vulkan tool chain (tests/support/vulkan_setup.sh installs it) these skip, saying so;
with SPECCHAT_REQUIRE_VULKAN=1 (CI) they fail instead. Each inner run's log and JUnit report land in
tests/artifacts/vulkan/.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import ARTIFACTS, vulkan_build

ROOT = Path(__file__).resolve().parent.parent
OUT = ARTIFACTS / "vulkan"


@pytest.fixture(scope="module")
def lib() -> Path:
    lacks = vulkan_build.missing()
    if lacks:
        why = f"no Vulkan build: this machine lacks {', '.join(lacks)} (tests/support/vulkan_setup.sh installs them)"
        (pytest.fail if os.environ.get("SPECCHAT_REQUIRE_VULKAN") else pytest.skip)(why)
    return vulkan_build.libs()


def run_tests(lib: Path, name: str, *args: str, timeout: int) -> tuple[str, dict[str, int]]:
    """pytest on ``args`` in a process on the Vulkan build; its output and its counts (tests, failures, errors,
    skipped) from its JUnit report."""
    OUT.mkdir(parents=True, exist_ok=True)
    report = OUT / f"{name}.xml"
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", "-s", "-rfEs",
           f"--junitxml={report}", *args]
    env = dict(vulkan_build.environment(lib), SPECCHAT_ARTIFACTS=str(OUT / name))
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = run.stdout + run.stderr
    (OUT / f"{name}.log").write_text(output)
    assert report.is_file(), output[-3000:]
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert run.returncode == 0 and counts["failures"] == counts["errors"] == 0, output[-3000:]
    return output, counts


def test_what_holds_on_a_gpu_holds_on_lavapipe(lib):
    output, counts = run_tests(lib, "gpu-checks", "tests/gpu_checks.py", timeout=900)
    assert counts["skipped"] == 0 and counts["tests"] == 10, counts  # (it skips where llama.cpp cannot offload)
    # the device found (lavapipe here), the plain speed kept for it, the answers
    for said in ("GPUs: [Gpu(", "kept for ", "identical greedy answers"):
        print(next(line for line in output.splitlines() if said in line))


def test_the_engines_tests_pass_with_every_layer_on_lavapipe(lib):
    """test_engine.py with every model loaded wholly on the device (tests/support/gpu_offload.py). Left out: the test
    that pins the CPU's kernels, batch-invariant by SpecChat's build (gpu_checks.py measures the device's); the
    adaptive controller's back-off, which reads timings, not the device's numbers; and two of the four prompts of
    each greedy-identity case (every drafter and draft length still runs, on two prompts). lavapipe makes a decode
    some 50 times slower than the CPU does here: those cost 135 of this run's 292 s."""
    output, counts = run_tests(
        lib, "engine", "-p", "tests.support.gpu_offload", "tests/test_engine.py",
        "--deselect", "tests/test_engine.py::test_a_k_quant_model_gives_each_token_the_same_logits_alone_or_in_a_batch",
        "--deselect", "tests/test_engine.py::test_adaptive_mode_backs_off_a_draft_that_loses",
        "-k", "not (identical_to_plain and (ids2 or ids3))", timeout=900)
    loads = re.search(r"gpu_offload: (\d+) models loaded with every layer offloaded \(GPU offload supported\)", output)
    assert loads and int(loads[1]) > 10, output[-3000:]
    assert counts["tests"] > 28 and counts["skipped"] == 0, counts
