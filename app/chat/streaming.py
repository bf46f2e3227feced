"""Run one generation on a worker thread and hand its events to a viewer in batches, at the viewer's pace.

The engine never waits for the UI: a browser redraw (or a slow client) costs the viewer time, not decoding
time. The viewer gets everything that happened since its last look, at most every ``interval`` seconds.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import AsyncGenerator, Callable, Iterator

from ..engine import Done, Event

_END = object()
# Snapshots per second a viewer gets: 5 redraws/s read as smooth streaming and cost little decoding speed
# (bench/perf_ui_vs_engine.py on 2 cores: 0.95-1.02 of the engine at 0.2 s, 0.93 at 0.1 s; the host is noisy).
INTERVAL = 0.2


class Generation:
    def __init__(self, run: Callable[[threading.Event], Iterator[Event]], cancel: threading.Event | None = None):
        """``run(cancel)`` returns the engine's event iterator; it is called on the worker thread, so errors
        from validation and from decoding alike come back through ``batches``."""
        self.cancel = cancel or threading.Event()
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, args=(run,), daemon=True, name="specchat-generate")
        self._thread.start()

    def _work(self, run) -> None:
        try:
            for ev in run(self.cancel):
                self._q.put(ev)
        except BaseException as exc:  # handed to the viewer, who decides how to show it
            self._q.put(exc)
        finally:
            self._q.put(_END)

    def batches(self, interval: float = INTERVAL) -> Iterator[list[Event]]:
        """Lists of events; the last list ends with Done. Raises what the generation raised. If the viewer
        stops early (closes this iterator) the generation is cancelled."""
        finished = False
        try:
            while True:
                batch = [self._q.get()]
                deadline = time.monotonic() + interval
                while batch[-1] is not _END and not isinstance(batch[-1], (Done, BaseException)):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        batch.append(self._q.get(timeout=left))
                    except queue.Empty:
                        break
                errors = [e for e in batch if isinstance(e, BaseException)]
                if errors:
                    raise errors[0]
                events = [e for e in batch if e is not _END]
                if events:
                    yield events
                if batch[-1] is _END or isinstance(batch[-1], Done):
                    finished = True
                    return
        finally:
            if not finished:  # the viewer left early (or an error): stop decoding for nobody
                self.cancel.set()
            self._thread.join()


async def batches_async(run: Callable[[threading.Event], Iterator[Event]],
                        on_end: Callable[[], None] = lambda: None,
                        cancel: threading.Event | None = None) -> AsyncGenerator[list[Event], None]:
    """The same worker thread for an asyncio viewer (the HTTP API): as soon as there are events, all there are (a
    verification round commits several tokens at once; sending them together saves the viewer work). Leaving early,
    or being cancelled because the client went away, cancels the generation at once; so does setting ``cancel``
    (while it still waits for the engine, too). ``on_end`` runs on the worker when the generation is over, however
    it ended (even if this iterator is never read)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    cancel = cancel or threading.Event()

    def put(item) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down): nobody is listening
            cancel.set()

    def work() -> None:
        try:
            for ev in run(cancel):
                put(ev)
        except BaseException as exc:  # handed to the viewer
            put(exc)
        finally:
            on_end()
            put(_END)

    threading.Thread(target=work, daemon=True, name="specchat-generate").start()
    try:
        while True:
            batch = [await q.get()]
            while not q.empty():
                batch.append(q.get_nowait())
            for item in batch:
                if isinstance(item, BaseException):
                    raise item
            events = [e for e in batch if e is not _END]
            if events:
                yield events
            if batch[-1] is _END:
                return
    finally:
        cancel.set()
