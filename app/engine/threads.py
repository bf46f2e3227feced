"""How many CPU threads llama.cpp should use now: the physical cores other programs leave free.

llama.cpp's worker threads wait for each other at every step of a forward pass, spinning. When another program
keeps a core busy, one of our threads is descheduled for a whole time slice at a time and the others spin in
vain: on 2 cores with one busy, 2 threads ran the starter model at about half the speed of 1 thread. So with no
--threads given, the engine counts the cores other programs used recently (the machine's busy time minus this
process's own, and its app's where it is an engine worker) and leaves them out, choosing again before each
generation and every half second during one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

RECHECK_S = 0.5  # while generating: how often to look again
MIN_WINDOW_S = 0.2  # a shorter window says too little about the others' load
_ours: list[psutil.Process] = []  # processes whose work is this one's (``count_as_ours``)


def count_as_ours(pid: int) -> None:
    """Count process ``pid``'s CPU time as this process's own, not another program's: an engine worker's app, whose
    work (reading the events, serving them) is part of the answers this process makes."""
    _ours.append(psutil.Process(pid))


def _cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:  # (gone)
        return 0.0


def cpu_sample(procs) -> tuple[float, float, float]:
    """(wall clock, the machine's busy CPU seconds, ``procs``' CPU seconds): two of them tell how many cores other
    programs than ``procs`` kept busy in between (``others_cores``)."""
    t = psutil.cpu_times()
    idle = t.idle + sum(getattr(t, k, 0.0) for k in ("iowait", "guest", "guest_nice"))  # guest: counted in user
    return time.monotonic(), sum(t) - idle, sum(_cpu_seconds(p) for p in procs)


def others_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    wall = after[0] - before[0]
    return max(((after[1] - before[1]) - (after[2] - before[2])) / wall, 0.0) if wall > 0 else 0.0


@dataclass(frozen=True)
class Choice:
    n_threads: int
    why: str


class ThreadChooser:
    """Chooses a thread count from the cores other programs leave free (``fixed`` > 0: always that many)."""

    def __init__(self, cores: int, fixed: int = 0):
        self.cores = max(1, cores)
        self.fixed = fixed
        self.choice = Choice(fixed, f"--threads {fixed}") if fixed else Choice(self.cores, "all physical cores")
        self._last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        return cpu_sample((psutil.Process(), *_ours))

    @property
    def since_last_look(self) -> float:
        return time.monotonic() - self._last[0]

    def others_busy(self) -> float | None:
        """Cores the other programs kept busy since the last look (None: too soon to tell)."""
        if self.since_last_look < MIN_WINDOW_S:
            return None
        now = self._sample()
        others, self._last = others_cores(self._last, now), now
        return others

    def choose(self) -> Choice:
        """The thread count for what comes next; unchanged when measured too recently."""
        if self.fixed:
            return self.choice
        others = self.others_busy()
        if others is None:
            return self.choice
        busy = min(round(others), self.cores - 1)
        self.choice = Choice(self.cores - busy, f"{busy} of {self.cores} cores busy with other programs"
                             if busy else f"all {self.cores} physical cores (others idle)")
        return self.choice
