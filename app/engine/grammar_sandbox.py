"""Where llguidance compiles a grammar, so that no grammar can take the process down with it.

llguidance compiles recursively on the calling thread's stack and a deep enough grammar overflows it: a SIGSEGV
that no ``try`` catches, which would end every conversation and stream of the app (see ``grammar_limits`` for the
numbers). The limits there refuse the known shapes with a clear message, but a bound alone is a guess about the
library's insides, so the compilation itself is contained:

- In this process llguidance only ever compiles on a thread of its own with a 256 MiB stack (``on_big_stack``,
  reserved, touched only as deep as it goes): 32 times the 8 MiB every other thread has, for the checks and for
  the matcher a generation builds (``constraint``).
- A definition larger than 16,000 characters is first checked in a child process (``verdict``), on a 64 MiB
  stack, under a memory cap and a time limit: if the child crashes, runs out of memory or of time, the grammar is
  refused in words. What passed there compiles here on four times that stack. Anything smaller needs under 6 MiB
  of stack in the worst shape measured (about 330 bytes of stack per character, a chain of one-letter Lark rules),
  so it is compiled here directly and a normal request never waits for a process to start.
- Verdicts are cached by the definition's hash, so a client that sends the same large schema or tools with every
  request pays for the child once.
"""
from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict

from .errors import EngineError

STACK_BYTES = 256 << 20  # the stack llguidance compiles on in this process
CHILD_STACK_BYTES = 64 << 20  # ... and in the child that checks a large definition first
IN_PROCESS_CHARS = 16_000  # definitions up to this size are compiled here without a child
CHILD_TIMEOUT_S = 5.0  # (what compiles within the limits checks in under 2 s here; 5 s bounds the wait)
CHILD_MEMORY_BYTES = 4 << 30
CACHE_SIZE = 256

_stack_lock = threading.Lock()
_cache_lock = threading.Lock()
_verdicts: OrderedDict[str, str] = OrderedDict()  # sha256 of a definition -> "" (compiles) or why not

# The child: llguidance's own check on a thread with the given stack, under a memory cap; the answer after "ok:".
_CHILD = """
import sys, threading
sys.path.insert(0, sys.argv[3])
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
except (ImportError, ValueError, OSError):
    pass
from llguidance import LLMatcher
definition = sys.stdin.buffer.read().decode("utf-8")
out = []
threading.stack_size(int(sys.argv[1]))
t = threading.Thread(target=lambda: out.append(LLMatcher.validate_grammar(definition)))
t.start()
t.join()
sys.stdout.buffer.write(("ok:" + out[0]).encode("utf-8") if out else b"no answer")
"""


def on_big_stack(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a new thread with a ``STACK_BYTES`` stack, waited for; its result or its
    exception. (The stack size is process-wide while a thread starts, hence the lock.)"""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    with _stack_lock:
        before = threading.stack_size(STACK_BYTES)
        try:
            thread = threading.Thread(target=run, name="specchat-grammar", daemon=True)
            thread.start()
        except RuntimeError as exc:  # (no memory left to reserve the stack)
            raise EngineError(f"Cannot start a thread to compile the grammar on: {exc}") from None
        finally:
            threading.stack_size(before)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def verdict(definition: str) -> str:
    """llguidance's verdict on a grammar definition (what ``LLMatcher.grammar_from_*`` returns): "" when it
    compiles, otherwise why not, in its words or saying the check crashed or ran too long. Never crashes."""
    key = hashlib.sha256(definition.encode("utf-8", "surrogatepass")).hexdigest()
    with _cache_lock:
        if key in _verdicts:
            _verdicts.move_to_end(key)
            return _verdicts[key]
    if len(definition) > IN_PROCESS_CHARS:
        answer, lasting = _in_child(definition)
    else:
        from llguidance import LLMatcher

        answer, lasting = on_big_stack(LLMatcher.validate_grammar, definition), True
    if not lasting:  # (a busy machine may answer in time next time)
        return answer
    with _cache_lock:
        _verdicts[key] = answer
        while len(_verdicts) > CACHE_SIZE:
            _verdicts.popitem(last=False)
    return answer


def _in_child(definition: str, fork: bool | None = None) -> tuple[str, bool]:
    """The verdict from a child process: a fresh interpreter, or (a frozen bundle, which cannot run Python code
    given on its command line) a fork of this one; and whether it lasts (a time limit reached may not)."""
    if fork is None:
        fork = bool(getattr(sys, "frozen", False)) or not sys.executable
    status, output = _forked(definition) if fork else _spawned(definition)
    if status is None:
        return f"checking it took longer than {CHILD_TIMEOUT_S:g} s", False
    if status == 0 and output.startswith(b"ok:"):
        return output[3:].decode("utf-8", "replace"), True
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return (f"llguidance crashed compiling it ({name}): it is most likely nested or chained too deeply, or "
                "too large"), True
    if b"MemoryError" in output:
        return f"compiling it takes more than {CHILD_MEMORY_BYTES >> 30} GiB of memory", True
    last = output.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no answer"]
    return f"checking it failed ({last[0][:200]})", False


def _spawned(definition: str) -> tuple[int | None, bytes]:
    """(exit status, negative for a signal, or None past the time limit; what it wrote)."""
    import llguidance

    where = os.path.dirname(os.path.dirname(os.path.abspath(llguidance.__file__)))  # (isolated: no PYTHONPATH)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _CHILD, str(CHILD_STACK_BYTES), str(CHILD_MEMORY_BYTES),
                               where], input=definition.encode("utf-8"), capture_output=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, b""
    except OSError as exc:
        return 1, f"cannot start {sys.executable}: {exc}".encode()
    return done.returncode, done.stdout if done.returncode == 0 else done.stdout + done.stderr


def _forked(definition: str) -> tuple[int | None, bytes]:
    """As ``_spawned``, in a fork: the child only runs llguidance's check and leaves by ``os._exit``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a copy of this process, so its memory cap counts from what it already maps
        data = b"no answer"
        try:
            os.close(read_end)
            try:
                import resource

                with open("/proc/self/statm") as f:
                    mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
                cap = mapped + CHILD_MEMORY_BYTES
                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            except (ImportError, ValueError, OSError):
                pass
            from llguidance import LLMatcher

            out: list[str] = []
            threading.stack_size(CHILD_STACK_BYTES)
            t = threading.Thread(target=lambda: out.append(LLMatcher.validate_grammar(definition)))
            t.start()
            t.join()
            data = ("ok:" + out[0]).encode("utf-8") if out else data
        except BaseException as exc:  # (say why, whatever it is: the parent reads it)
            data = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
        finally:
            try:
                while data:
                    data = data[os.write(write_end, data):]
            finally:
                os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + CHILD_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None, b""
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), b"".join(chunks)
