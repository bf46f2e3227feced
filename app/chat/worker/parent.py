"""The app's side of the engine worker (``child``): ``WorkerEngine`` stands where an ``Engine`` stands, so the chat,
Compare and the API do not know that the pair is loaded in another process.

The parent loads no weights: a vocabulary-only copy of the target tokenizes and renders templates here, and
everything else is asked of the worker. When the worker dies (a signal, an exit), what was in flight fails with
``WorkerDied`` (its message says how it died, doing what, and quotes llama.cpp's last lines from the worker's log),
and the pair is loaded again in a new worker, on the CPU if a load that offloaded layers is what died. Until it is
back, requests get ``EngineRestarting`` (the API's 503 with Retry-After).
"""
from __future__ import annotations

import itertools
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Iterator

from ...engine import DRAFT_MODEL, EngineError, GenerationParams, Model, ModelsUnloaded
from ...engine.events import Event
from ...engine.images import has_images
from ...models.loader import LoadSpec, Resolved
from ...paths import data_dir
from . import load_crashes
from .protocol import LOAD, Call, Cancel, Close, Emitted, Facts, Failed, Generate, Load, Loaded

LOG_NAME = "engine-worker.log"
LOG_KEEP_BYTES = 4 << 20  # a longer log is moved to .1 when a worker starts
CLOSE_WAIT_S = 120  # a closing worker finishes the answer it is writing; one stuck longer is killed
LAST_LINES = 3  # of llama.cpp's lines in the worker's log, quoted when it dies
FROZEN_FLAG = "--engine-worker"  # a desktop bundle runs the worker as its own executable with this flag first
# What llama.cpp and ggml say before they end a process (the Python stack a crash prints is left in the log).
SAID = re.compile(r"^llama\.cpp: |GGML_ASSERT|GGML_ABORT|CUDA error|out of memory|terminate called", re.I)
# The fatal signals the worker's faulthandler reports, by the words it logs them with. Its report can fault in
# turn (it walks every thread's stack while they run): the process then dies of the second signal, and the
# first, the log's, is what killed it.
FAULTS = {"Segmentation fault": signal.SIGSEGV, "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS,
          "Floating-point exception": signal.SIGFPE, "Illegal instruction": signal.SIGILL}
FIRST_FAULT = re.compile(r"^Fatal Python error: (" + "|".join(FAULTS) + ")", re.M)


class WorkerDied(EngineError):
    """The engine worker died while this was asked of it (its message says how); the app goes on."""


class EngineRestarting(ModelsUnloaded):
    """The engine worker is loading the pair again after a crash: ask again in a moment."""


class ProjectorView:
    """The worker's vision projector as the parent sees it: its file, its media marker, and tokenizing a prompt
    with images (done in the worker, which keeps the prepared images the placeholder ids stand for)."""

    def __init__(self, engine: WorkerEngine, facts: Facts):
        self._engine = engine
        self.path, self.size_bytes, self.marker = facts.projector.path, facts.projector.size_bytes, facts.marker

    def tokenize(self, text: str, images: list[bytes], add_special: bool = True) -> list[int]:
        return self._engine._call("tokenize_images", text, images, add_special)


def log_path() -> Path:
    folder = data_dir() / "logs"
    folder.mkdir(exist_ok=True)
    return folder / LOG_NAME


def command(fd: int) -> list[str]:
    """How to start a worker (``child``) on socket ``fd``, from a checkout, an install or a PyInstaller bundle."""
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_FLAG, str(fd)]
    return [sys.executable, "-m", "app.chat.worker.child", str(fd)]


def _how(returncode: int, logged: str) -> str:
    """How a worker that ended with ``returncode`` died, by the first fatal signal its ``logged`` text reports
    where that differs from the one that ended it (see FAULTS)."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        first = FIRST_FAULT.search(logged)
        if first and FAULTS[first[1]] != sig:
            cause = FAULTS[first[1]]
            return f"killed by {cause.name} ({signal.strsignal(cause)}; then {sig.name} while reporting it)"
        return f"killed by {sig.name} ({signal.strsignal(sig)})"
    return f"exited with status {returncode}"


def _forwarded(method: str):
    """The engine's ``method``, called in the worker: its arguments and answer pickled, its error raised here."""
    def call(self, *args):
        return self._call(method, *args)

    call.__name__ = call.__qualname__ = method
    return call


class WorkerEngine:
    """An engine in a worker process: ``Engine``'s face, over the socket."""

    def __init__(self, spec: LoadSpec, resolved: Resolved):
        self.log = log_path()
        self.restarts = 0
        self.notice: str | None = None  # what the person should know: the last crash, a fall-back to the CPU
        self._lock = threading.Lock()  # guards the state, the pending requests and the socket's writing end
        self._ids = itertools.count(LOAD + 1)
        self._pending: dict[int, queue.Queue] = {}
        self._answering: dict[int, bool] = {}  # requests generating now -> whether their prompt has images
        self._state = "loading"
        self._ready = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self._target = Path(resolved.target)
        self._start(spec, resolved)

    # --- the process ----------------------------------------------------------------------------------------
    def _start(self, spec: LoadSpec, resolved: Resolved) -> None:
        """Start a worker and load the pair in it; a load that kills it with layers offloaded is tried once more
        on the CPU. Raises what the load raised. Each load that kills it is kept (``load_crashes``)."""
        try:
            self._spawn_and_load(spec, resolved)
        except WorkerDied as exc:
            load_crashes.record(spec, str(exc))
            if not spec.may_offload:
                raise
            on_cpu = replace(spec, ngl=0, ngld=0)
            try:
                self._spawn_and_load(on_cpu, resolved)
            except WorkerDied as again:
                load_crashes.record(spec, str(again))
                raise
            self.notice = f"{exc} It was loaded again on the CPU (-ngl 0); load it with -ngl to try the GPU again."
            spec = on_cpu
        load_crashes.clear(spec)
        self.spec, self.resolved = spec, resolved

    def _spawn_and_load(self, spec: LoadSpec, resolved: Resolved) -> None:
        self._rotate_log()
        ours, theirs = socket.socketpair()
        with open(self.log, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} loading {spec.describe()} "
                      f"({spec.offload_flags()})\n".encode())
            self._log_from = log.tell()
            package_root = str(Path(__file__).resolve().parents[3])  # (where ``app`` is, installed or not)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root,
                                                                              os.environ.get("PYTHONPATH"))))}
            proc = subprocess.Popen(command(theirs.fileno()),
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env=env)
        theirs.close()
        conn = Connection(ours.detach())
        doing = f"loading {spec.describe()}" + (f" with {spec.offload_flags()}" if spec.may_offload else "")
        try:
            conn.send(Load(spec, resolved))
            msg = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise WorkerDied(self._death(proc, doing)) from None
        if isinstance(msg, Failed):
            conn.close()
            proc.wait()
            raise msg.error
        assert isinstance(msg, Loaded), msg
        self._facts: Facts = msg.facts
        if not hasattr(self, "model"):  # (read once the worker has read the file: a bad one crashes there, not here)
            self.model = Model(resolved.target, vocab_only=True)  # tokenizing and templates, here
        for name, value in msg.facts.model.items():  # (a vocabulary-only load reads these as 0)
            setattr(self.model, name, value)
        self.projector = ProjectorView(self, msg.facts) if msg.facts.projector else None
        with self._lock:
            if self._state == "closed":  # (the app closed it while a new worker loaded: a crash at shutdown)
                conn.close()
                proc.kill()
                proc.wait()
                raise ModelsUnloaded("The engine was closed while it loaded.")
            self._proc, self._conn, self._state = proc, conn, "ready"
        self._ready.set()
        self._reader = threading.Thread(target=self._read, args=(proc, conn), daemon=True, name="specchat-worker-read")
        self._reader.start()

    def _rotate_log(self) -> None:
        try:
            if self.log.stat().st_size > LOG_KEEP_BYTES:
                self.log.replace(self.log.with_suffix(".log.1"))
        except OSError:
            pass

    def _read(self, proc: subprocess.Popen, conn: Connection) -> None:
        """Hand each message to the request it answers, until the worker's end closes."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            q = self._pending.get(msg.rid)
            if q is not None:
                q.put(msg)
        with self._lock:
            if self._state == "closed" or self._proc is not proc:
                return
            doing = ("answering a prompt with images" if any(self._answering.values()) else
                     "answering" if self._answering else "idle")
            self._state, self._conn = "restarting", None
            self._ready.clear()
            died = WorkerDied(self._death(proc, doing))
            for rid, q in list(self._pending.items()):
                q.put(Failed(rid, died))
        conn.close()
        self.notice = str(died)
        threading.Thread(target=self._restart, args=(died,), daemon=True, name="specchat-worker-restart").start()

    def _restart(self, died: WorkerDied) -> None:
        self.restarts += 1
        try:
            self._start(self.spec, self.resolved)
        except Exception as exc:  # (an EngineError, or no process could be started: either way, say so)
            with self._lock:
                if self._state == "closed":
                    return
                self._state = "failed"
            self.notice = f"{died} Loading it again failed: {exc}"
            self._ready.set()  # (whoever waits learns it failed)

    def _death(self, proc: subprocess.Popen, doing: str) -> str:
        """How the worker died, doing what, with what llama.cpp logged last (the lines its log holds since it
        started)."""
        returncode = proc.wait()
        try:
            with open(self.log, "rb") as log:
                log.seek(self._log_from)
                logged = log.read().decode("utf-8", "replace")
        except OSError:
            logged = ""
        said = " | ".join([ln.strip() for ln in logged.splitlines() if SAID.search(ln)][-LAST_LINES:])
        return (f"The engine worker (pid {proc.pid}) {_how(returncode, logged)} while {doing} ({self._target.name})."
                + (f" Its last words: {said}." if said else "") + f" Log: {self.log}.")

    # --- asking ---------------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._state == "ready":
            return
        if self._state == "closed":
            raise ModelsUnloaded("The models were unloaded (another pair was loaded) while this request waited "
                                 "for its turn: send it again.")
        if self._state == "failed":
            raise EngineError(self.notice or "The engine worker could not be started again.")
        raise EngineRestarting("The engine is loading the pair again after a crash: send this again in a moment. "
                               + (self.notice or ""))

    def _ask(self, msg) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        with self._lock:
            self._check()
            self._pending[msg.rid] = q
            try:
                self._conn.send(msg)
            except OSError:  # dying: the reader is about to say how
                q.put(Failed(msg.rid, EngineRestarting("The engine worker stopped: send this again in a moment.")))
        return q

    def _send(self, msg) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(msg)
                except OSError:
                    pass

    def _call(self, method: str, *args):
        rid = next(self._ids)
        q = self._ask(Call(rid, method, args))
        try:
            msg = q.get()
        finally:
            self._pending.pop(rid, None)
        if isinstance(msg, Failed):
            raise msg.error
        return msg.value

    def wait_ready(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) for a worker loading the pair again after a crash."""
        if self._state == "restarting":
            self._ready.wait(timeout)

    # --- Engine's face --------------------------------------------------------------------------------------
    ready = property(lambda self: self._state == "ready")
    n_ctx = property(lambda self: self._facts.n_ctx)
    drafters = property(lambda self: self._facts.drafters)
    cross_vocab = property(lambda self: self._facts.cross_vocab)
    head = property(lambda self: self._facts.head)
    has_draft_context = property(lambda self: self._facts.has_draft_context)
    draft_model = property(lambda self: self._facts.draft_model)

    def detokenize(self, ids: list[int]) -> str:
        return self.model.detokenize(ids)

    def reset(self, keep: list[int] = ()) -> None:
        self._call("reset", list(keep))

    # (the rest of protocol.CALLS: asked of the engine in the worker, as they are)
    check_drafter, check_logit_bias = _forwarded("check_drafter"), _forwarded("check_logit_bias")
    speculation, alternatives, ceiling = _forwarded("speculation"), _forwarded("alternatives"), _forwarded("ceiling")
    measure_costs, forget_costs = _forwarded("measure_costs"), _forwarded("forget_costs")
    forget_answers = _forwarded("forget_answers")
    started_from_kept, threads = _forwarded("started_from_kept"), _forwarded("threads")
    memory_bytes, state_costs = _forwarded("memory_bytes"), _forwarded("state_costs")
    recurrent_states, offload = _forwarded("recurrent_states"), _forwarded("offload")

    def process_info(self) -> dict:
        """The worker as Hardware shows it: its pid, state and memory, and where its log is."""
        proc, rss = self._proc, None
        if proc is not None and self._state == "ready":
            try:
                import psutil

                rss = psutil.Process(proc.pid).memory_info().rss
            except Exception:  # (gone meanwhile)
                rss = None
        return {"pid": proc.pid if proc else None, "state": self._state, "rss_bytes": rss, "log": str(self.log),
                "restarts": self.restarts, "notice": self.notice}

    def generate(self, prompt_ids: list[int], params: GenerationParams | None = None, drafter: str = DRAFT_MODEL,
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        """The worker's events for one generation (validation errors come with the first)."""
        if not isinstance(drafter, str):
            raise EngineError("A drafter object cannot be sent to the engine worker: name a method.")
        params = params or GenerationParams()
        params.validate()
        return self._stream(list(prompt_ids), params, drafter, cancel or threading.Event())

    def _stream(self, ids: list[int], params: GenerationParams, drafter: str,
                cancel: threading.Event) -> Iterator[Event]:
        rid = next(self._ids)
        q = self._ask(Generate(rid, ids, params, drafter))
        self._answering[rid] = has_images(ids)
        cancelled = ended = False
        try:
            while True:
                if cancel.is_set() and not cancelled:
                    self._send(Cancel(rid))
                    cancelled = True
                try:
                    msg = q.get(timeout=0.05)  # (wakes at once for a message; the timeout only watches cancel)
                except queue.Empty:
                    continue
                if isinstance(msg, Emitted):
                    yield msg.event
                    continue
                ended = True
                if isinstance(msg, Failed):
                    raise msg.error
                return
        finally:
            self._pending.pop(rid, None)
            self._answering.pop(rid, None)
            if not (ended or cancelled):  # its reader left early: stop writing for nobody
                self._send(Cancel(rid))

    def close(self) -> None:
        """End the worker once it has answered what was asked before (as ``Engine.close`` waits its turn): all its
        memory, GPU memory too, comes back."""
        with self._lock:
            proc, conn, reader, self._state = self._proc, self._conn, self._reader, "closed"
            self._conn = None
        self._ready.set()
        if conn is not None:
            try:
                conn.send(Close())
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if reader is not None:
            reader.join()  # (it hands out what the worker said before it ended)
        if conn is not None:
            conn.close()
        gone = ModelsUnloaded("The models were unloaded (another pair was loaded): send it again.")
        for rid, q in list(self._pending.items()):
            q.put(Failed(rid, gone))
        self.model.close()
