"""How busy other programs keep this machine, for Compare's warning: the machine's busy time less the app's own
(its process and its children, the engine worker among them)."""
from __future__ import annotations

import time

import psutil

from ..engine.threads import cpu_sample, others_cores

BUSY_CORES = 0.5  # from this much of other programs' load on, Compare warns: its figures swing from run to run


class LoadWatch:
    """Other programs' load, in cores: over a short look now (``before``), and since then (``since``)."""

    def __init__(self, look_s: float = 0.25):
        me = psutil.Process()
        self._procs = [me, *me.children(recursive=True)]
        self.cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
        first = cpu_sample(self._procs)
        time.sleep(look_s)
        self._start = cpu_sample(self._procs)
        self.before = others_cores(first, self._start)

    def since(self) -> float:
        return others_cores(self._start, cpu_sample(self._procs))


def busy_warning(before: float | None, during: float | None, cores: int) -> str:
    """A sentence where other programs kept the machine busy (None: not measured), else ""."""
    when = [f"{cores_:.1f} of {cores} cores {what}" for cores_, what in ((before, "before it"), (during, "during it"))
            if cores_ is not None and cores_ >= BUSY_CORES]
    if not when:
        return ""
    return (f"Other programs kept {' and '.join(when)} busy: speedups measured on a busy machine swing from run to "
            "run (Hardware shows the load). Compare again when it is quieter.")
