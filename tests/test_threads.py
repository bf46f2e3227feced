"""Without --threads, llama.cpp gets the physical cores other programs leave free (see app/engine/threads.py)."""
from __future__ import annotations

import subprocess
import sys
import time

from app.engine import Done, Engine, GenerationParams, ModelSettings
from app.engine.threads import ThreadChooser


def test_a_busy_core_is_left_out():
    chooser = ThreadChooser(cores=64)  # as if this machine had 64 cores: the others' load is what it measures
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        choice = chooser.choose()
    finally:
        busy.kill()
        busy.wait()
    assert choice.n_threads <= 63 and "busy with other programs" in choice.why


def test_the_count_follows_the_others_load_not_our_own(monkeypatch):
    """Scripted samples (wall, machine busy CPU seconds, this process's CPU seconds), one per look."""
    looks = iter([(0.0, 0.0, 0.0),
                  (1.0, 3.0, 2.0),  # we used 2 cores, the others 1
                  (2.0, 5.0, 4.0),  # we used 2, the others none; (at 2.1: too soon to look, the choice stands)
                  (3.0, 11.0, 4.0)])  # the others kept 6 cores busy (of 4: hyper-threads): we keep one
    monkeypatch.setattr(ThreadChooser, "_sample", staticmethod(lambda: next(looks)))
    clock = iter([1.0, 2.0, 2.1, 3.0])
    chooser = ThreadChooser(cores=4)
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    assert chooser.choose().n_threads == 3
    assert chooser.choose().n_threads == 4
    assert chooser.choose().n_threads == 4
    assert chooser.choose().n_threads == 1


def test_threads_given_are_kept():
    chooser = ThreadChooser(cores=8, fixed=3)
    assert chooser.choose().n_threads == 3 and chooser.choice.why == "--threads 3"


def test_the_engine_applies_the_choice_and_says_why(models):
    auto = Engine(ModelSettings(models["target"], n_ctx=256), ModelSettings(models["draft"], n_ctx=256, n_threads=1))
    try:
        done = list(auto.generate([1, 300, 301], GenerationParams(max_tokens=8), "model"))[-1]
        assert isinstance(done, Done) and len(done.token_ids) == 8
        info = auto.threads()
        assert info["draft"] == {"n_threads": 1, "why": "--threads"}
        assert 1 <= info["target"]["n_threads"] <= auto._threads.cores and "cores" in info["target"]["why"]
    finally:
        auto.close()


def test_logits_do_not_depend_on_the_thread_count(models):
    """The count may change mid-answer, so it must not change a single logit (each output element of ggml's CPU
    kernels is computed whole by one thread)."""
    import numpy as np

    engine = Engine(ModelSettings(models["target"], n_ctx=256, n_threads=1))
    try:
        ctx, out = engine.target.ctx, []
        for n in (1, 2, 3):
            ctx.truncate(0)
            ctx.set_threads(n)
            ctx.decode([1] + list(range(262, 320)), n_logits=4)
            out.append(np.array([ctx.logits(i) for i in range(4)]))
        assert all(np.array_equal(out[0], o) for o in out[1:])
    finally:
        engine.close()
