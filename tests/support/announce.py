"""A line for whoever watches the test run (a terminal, CI's log), printed at once, past pytest's output capture:
for set-up that takes minutes inside a test (building llama-server), which would otherwise leave the log silent.
conftest.py attaches the run's config; outside pytest the line goes to stderr."""
from __future__ import annotations

import sys

_config = None


def attach(config) -> None:
    global _config
    _config = config


def say(line: str) -> None:
    plugins = _config.pluginmanager if _config is not None else None
    capture = plugins and plugins.getplugin("capturemanager")
    reporter = plugins and plugins.getplugin("terminalreporter")
    if not capture:
        print(line, file=sys.stderr, flush=True)
        return
    with capture.global_and_fixture_disabled():
        if reporter and not hasattr(_config, "workerinput"):
            reporter.ensure_newline()
            reporter.write(line + "\n", flush=True)
        else:  # an xdist worker: its terminal reporter's lines go nowhere, its stderr is the run's
            print(line, file=sys.stderr, flush=True)
