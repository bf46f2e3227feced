"""Lint in the test run: ruff over app/ with the rules pyproject.toml configures ([tool.ruff]) — pyflakes (unused
and undefined names), pycodestyle within 120 columns and bugbear's likely bugs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing_in_app():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "app"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_reads_the_projects_rules(tmp_path):
    """The check can fail: a probe with an unused import and a line of 130 columns, under the project's rules."""
    probe = tmp_path / "probe.py"
    probe.write_text('import os\n\nX = "' + "x" * 124 + '"\n')
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                          "--config", str(ROOT / "pyproject.toml"), str(probe)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1 and "F401" in run.stdout and "E501" in run.stdout, run.stdout + run.stderr
