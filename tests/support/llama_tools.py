"""How the tests and bench scripts start llama.cpp's own tools (llama-server, llama-speculative-simple,
llama-mtmd-cli): one environment for all of them, and one way to say how one died.

The environment loads weights as SpecChat's engine does, for two reasons. Like for like: SpecChat never repacks
weights and turns ggml's tiled K-quant matmul off, so that a verification batch rounds as one token does; a tool
that did either would be measured and compared on other kernels. And it keeps the tools alive: on a CPU that
advertises AMX, llama.cpp puts repacked weights in its AMX buffer type, and a VM that traps the tile instructions
kills the tool with SIGILL right after ``load_model: initializing`` (llama.cpp's ``--no-repack``, whose variable
``LLAMA_ARG_REPACK`` every tool built on llama.cpp's common arguments reads).
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

EXACT_ENV = {"LLAMA_ARG_REPACK": "0", "GGML_CPU_TILED_MM": "0"}
TAIL_LINES = 25


def threads() -> int:
    """Threads for a tool the tests start: this worker's share of the cores. llama.cpp's threads spin at each
    barrier, so a tool given every core while other pytest workers keep one busy waits on a descheduled thread at
    every graph node (measured beside one busy core: -t 2 on two cores took over 600 s for the llama-server bench
    test, -t 1 47 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the tool's weights loaded as SpecChat loads them (then ``extra``)."""
    return {**os.environ, **EXACT_ENV, **(extra or {})}


class Tool:
    """A llama.cpp tool running with :func:`environment`, what it prints (stdout and stderr) going to a log file: a
    pipe nobody reads fills up and stalls a chatty server, and a file keeps the lines to report if it dies."""

    def __init__(self, name: str, cmd: list[str], log: Path):
        self.name, self.log = name, log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=environment(), stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        """Raises, saying how and with its last lines, if the tool has stopped."""
        if self.proc.poll() is not None:
            raise RuntimeError(death_report(self.name, self.proc.returncode, self.output()))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def running(name: str, cmd: list[str]) -> Iterator[Tool]:
    """The tool started, then stopped at the end; a failure inside while it lies dead says how it died."""
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        tool = Tool(name, cmd, Path(tmp) / "output.log")
        try:
            yield tool
        except Exception as failure:  # a tool that died under the test: say how, not only "connection refused"
            if tool.proc.poll() is not None:
                raise RuntimeError(death_report(name, tool.proc.returncode, tool.output())) from failure
            raise
        finally:
            tool.stop()


def exit_status(returncode: int) -> str:
    """``-4`` (Popen's way) or ``132`` (a shell's): "killed by SIGILL (illegal instruction), status 132"."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"exited with status {returncode}"
    return f"killed by {sig.name} ({signal.strsignal(sig) or sig.name}), status {128 + number}"


def death_report(name: str, returncode: int, output: str, lines: int = TAIL_LINES) -> str:
    """What a test failure says of a tool that stopped: how, and the last lines it printed."""
    tail = output.rstrip("\n").splitlines()[-lines:]
    said = "\n".join(f"  | {line}" for line in tail) if tail else "  (it printed nothing)"
    return f"{name} {exit_status(returncode)}; its last {len(tail)} lines:\n{said}"
