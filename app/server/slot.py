"""The one slot: requests take turns on the engine (its lock is the slot the chat UI uses too, so an API call and a
browser chat never interleave in one context). A bounded number may wait, beyond that the answer is 503 with
Retry-After. A client that goes away while its request waits for its turn, or mid-answer, cancels its generation at
once, and so does shutting down (``cancel_all``)."""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncGenerator, Callable

from fastapi import Request

from ..chat.streaming import batches_async
from .http import ApiError
from .metrics import Metrics

MAX_WAITING = 64  # requests queued or running at once; more get 503


class Slot:
    def __init__(self, metrics: Metrics, max_waiting: int = MAX_WAITING):
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.waiting = 0
        self.generations = 0  # generations started (queued included): what a refused request must not move
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()  # one per request queued or running

    def generate(self, request: Request, engine, ids: list[int], params, drafter: str
                 ) -> tuple[AsyncGenerator[list, None], asyncio.Future]:
        """A prepared request's generation: a place in the queue, its batches (validation errors and the wait for
        the engine come with the first), and a watch that cancels it when the client goes away."""
        cancel = threading.Event()
        leave = self._enter(cancel)
        batches = self.metrics.observe(batches_async(lambda c: engine.generate(ids, params, drafter, c), leave, cancel))
        return batches, asyncio.ensure_future(_cancel_on_disconnect(request, cancel))

    def cancel_all(self) -> None:
        """Stop every request queued or running (shutting down)."""
        with self._lock:
            for cancel in self._cancels:
                cancel.set()

    def _enter(self, cancel: threading.Event) -> Callable[[], None]:
        """Count a request in (503 when too many wait); returns what counts it out, called on the worker when its
        generation is over, however it ends."""
        with self._lock:
            if self.waiting >= self.max_waiting:
                raise ApiError(503, f"Busy: {self.waiting} requests are queued; try again shortly.", "server_error",
                               code="queue_full", headers={"Retry-After": "2"})
            self.waiting += 1
            self.generations += 1
            self._cancels.add(cancel)

        def leave() -> None:
            with self._lock:
                self.waiting -= 1
                self._cancels.discard(cancel)

        return leave


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set ``cancel`` when the client closes the connection (the body is read already: what comes next from the
    server is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()
