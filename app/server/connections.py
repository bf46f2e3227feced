"""How long a connection may take: uvicorn's HTTP/1.1 protocol (h11) with the deadlines it lacks.

uvicorn times out a connection only once it has answered a request (keep-alive). A client that connects and sends
nothing, or half a request line and headers a byte at a time ("slowloris"), or stops halfway through a body, would
hold its socket for ever. Here:

- the request line and headers must be complete within ``HEADER_SECONDS`` of the connection opening (or of the
  previous answer), however slowly they trickle in: the deadline is not moved by each byte;
- while a body is being read, ``BODY_IDLE_SECONDS`` may pass without a byte (not counted while the app has not
  read what came, so a busy app never drops a client).

Past either, the connection is closed. ``limit_concurrency`` (see ``server_config``) bounds how many are open.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_SECONDS = 20.0  # a browser or client sends its headers in one packet; a slow mobile link needs a few seconds
BODY_IDLE_SECONDS = 30.0  # as nginx's client_body_timeout (60 s) and Apache's (20 s), between two reads
KEEP_ALIVE_SECONDS = 5  # uvicorn's default, named here: an idle connection after an answer
MAX_CONNECTIONS = 200  # open connections and requests in flight; past it, new requests get 503
GRACEFUL_SHUTDOWN_SECONDS = 5  # at Ctrl-C, answers in flight get this long


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the body idle timeout above."""

    header_seconds = HEADER_SECONDS
    body_idle_seconds = BODY_IDLE_SECONDS
    _timer: asyncio.TimerHandle | None = None
    _waiting: str | None = None  # "headers" or "body": what the timer waits for

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        resume = self.flow.resume_reading

        def resumed() -> None:  # the app read what had piled up: the body's idle time counts again
            resume()
            self._rearm()

        self.flow.resume_reading = resumed
        self._rearm()

    def data_received(self, data: bytes) -> None:
        if self._waiting == "body":
            self._cancel()  # a byte came: the body's idle time starts again
        super().data_received(data)
        self._rearm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._rearm()  # the next request's headers, if the client keeps the connection

    def connection_lost(self, exc) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _awaited(self) -> str | None:
        """What the connection waits for from the client: "headers", "body" or nothing (the app has the request,
        or has not read what came)."""
        if self.transport is None or self.transport.is_closing():
            return None
        state = self.conn.their_state
        if state is h11.IDLE:  # a request line and headers: one deadline for all of them
            return "headers"
        return "body" if state is h11.SEND_BODY and not self.flow.read_paused else None

    def _rearm(self) -> None:
        wait = self._awaited()
        if wait is None:
            return self._cancel()
        if self._waiting != wait:
            self._cancel()
            seconds = self.header_seconds if wait == "headers" else self.body_idle_seconds
            self._waiting, self._timer = wait, self.loop.call_later(seconds, self._expired, wait)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._waiting = None

    def _expired(self, wait: str) -> None:
        self._timer = self._waiting = None
        if self._awaited() != wait:  # what came meanwhile met the deadline (a busy loop runs reads before timers)
            return self._rearm()
        self.logger.info("Closing a connection whose %s did not arrive in time.", wait)
        self.transport.close()


def server_config(app, host: str, port: int):
    """uvicorn's settings for SpecChat: the protocol above, keep-alive, a bound on connections, a graceful stop."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=DeadlineProtocol, log_level="warning", access_log=False,
                          lifespan="on", timeout_keep_alive=KEEP_ALIVE_SECONDS, limit_concurrency=MAX_CONNECTIONS,
                          timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
