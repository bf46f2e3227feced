"""The engine worker: a process of its own that loads the pair and makes every answer, so that a crash inside
llama.cpp (a segfault, an abort, the OOM killer) ends this process and not the app (``parent.WorkerEngine``).

Run as ``python -m app.chat.worker.child FD`` (``parent.command``): FD is its end of a socketpair with the app. Its
stderr is the worker's log file (llama.cpp's warnings and errors are echoed there, so the app can quote them after a
crash).
It ends when told to, or as soon as the app's end of the socket closes (the app died: nothing is left behind).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection

from ...engine import Engine
from ...engine.llama.backend import echo_log
from ...engine.threads import count_as_ours
from ...models.loader import load_engine
from ..acceptance_memory import memory_for
from .protocol import (CALLS, LOAD, Call, Cancel, Close, Emitted, Facts, Failed, FileFacts, Generate, Load, Loaded,
                       Reply, portable)

# Tests only (no GPU on the test machines): "offload" makes a load that offloads layers die as a CUDA build's did on
# the H200; "always", any load.
CRASH_AT_LOAD = "SPECCHAT_TEST_CRASH_AT_LOAD"


def facts(engine: Engine) -> Facts:
    model, draft, projector = engine.model, engine.draft_model, engine.projector
    return Facts(
        pid=os.getpid(), target=FileFacts(model.path, model.size_bytes),
        draft_model=FileFacts(draft.path, draft.size_bytes) if draft is not None else None,
        projector=FileFacts(projector.path, projector.size_bytes) if projector is not None else None,
        marker=projector.marker if projector is not None else None, n_ctx=engine.n_ctx, drafters=engine.drafters,
        cross_vocab=list(engine.cross_vocab), head=engine.head, has_draft_context=engine.has_draft_context,
        model={k: getattr(model, k) for k in ("size_bytes", "n_layer", "n_embd", "n_nextn")})


class Worker:
    def __init__(self, conn: Connection, engine: Engine):
        self.conn, self.engine = conn, engine
        self._send_lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}

    def send(self, msg) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def serve(self) -> None:
        """Read requests until told to close; each runs on a thread of its own (the engine queues generations
        in order, as it does in one process), so a Cancel is read while a generation runs."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the app is gone: so is everything it asked for
                os._exit(0)
            if isinstance(msg, Generate):
                self._cancels[msg.rid] = threading.Event()  # (before the thread: a Cancel may follow at once)
                threading.Thread(target=self._generate, args=(msg,), daemon=True).start()
            elif isinstance(msg, Call):
                threading.Thread(target=self._call, args=(msg,), daemon=True).start()
            elif isinstance(msg, Cancel):
                if (cancel := self._cancels.get(msg.rid)) is not None:
                    cancel.set()
            elif isinstance(msg, Close):
                for cancel in list(self._cancels.values()):
                    cancel.set()
                self.engine.close()  # (waits for a generation to see its cancel)
                return

    def _generate(self, msg: Generate) -> None:
        cancel = self._cancels[msg.rid]
        try:
            for event in self.engine.generate(msg.ids, msg.params, msg.drafter, cancel):
                self.send(Emitted(msg.rid, event))
            self.send(Reply(msg.rid))
        except BaseException as exc:
            self.send(Failed(msg.rid, portable(exc)))
        finally:
            self._cancels.pop(msg.rid, None)

    def _call(self, msg: Call) -> None:
        try:
            if msg.method not in CALLS:
                raise ValueError(f"the engine has no call {msg.method!r}")
            own = getattr(self, msg.method, None)
            self.send(Reply(msg.rid, (own or getattr(self.engine, msg.method))(*msg.args)))
        except BaseException as exc:
            self.send(Failed(msg.rid, portable(exc)))

    def tokenize_images(self, text: str, images: list[bytes], add_special: bool) -> list[int]:
        """A prompt with images, tokenized by the projector here (it keeps each prepared image for its
        placeholder ids, which the generation that follows reads)."""
        return self.engine.projector.tokenize(text, images, add_special)


def load(msg: Load) -> Engine:
    spec = msg.spec
    crash = os.environ.get(CRASH_AT_LOAD)
    if crash == "always" or crash == "offload" and (spec.ngl or spec.ngld):
        os.kill(os.getpid(), signal.SIGSEGV)
    return load_engine(spec, msg.resolved, memory=memory_for(msg.resolved.target, msg.resolved.draft))


def main(fd: int) -> int:
    faulthandler.enable()  # a crash writes the Python stack it happened under into the log
    # Ctrl-C in the terminal and its hang-up reach the whole process group; the app ends this worker itself.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    conn = Connection(fd)
    echo_log()
    count_as_ours(os.getppid())  # (the app's work on our answers is not another program's load)
    msg = conn.recv()
    try:
        engine = load(msg)
    except BaseException as exc:
        conn.send(Failed(LOAD, portable(exc)))
        return 1
    conn.send(Loaded(facts(engine)))
    Worker(conn, engine).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
