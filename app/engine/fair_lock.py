"""Turns on the engine: first come, first served, and a waiter that is cancelled leaves the line at once.

``threading.Lock`` wakes an arbitrary waiter, so under steady load (the browser's chat and API clients together) an
early request can be overtaken again and again until its client times out.
"""
from __future__ import annotations

import threading
from collections import deque


class FairLock:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._line: deque[object] = deque()
        self._held = False

    def acquire(self, cancel: threading.Event | None = None) -> bool:
        """Wait for this caller's turn; False (and out of the line) as soon as ``cancel`` is set."""
        me = object()
        with self._cond:
            self._line.append(me)
            while self._held or self._line[0] is not me:
                if cancel is not None and cancel.is_set():
                    self._line.remove(me)
                    self._cond.notify_all()  # the one behind may be first now
                    return False
                self._cond.wait(0.05 if cancel is not None else None)
            self._line.popleft()
            self._held = True
            return True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        return len(self._line)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
