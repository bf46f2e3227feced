"""The engine in a worker process (app/chat/worker): the app's process maps no weights, a crash of the worker is a
message and a reload, never a dead app, and the worker never outlives the app. Real llama.cpp on the starter pair;
the crashes are real signals sent to the worker."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from support.servers import specchat_serve

from app.chat.runtime import Runtime
from app.chat.settings import Settings
from app.chat.worker import EngineRestarting, WorkerDied, WorkerEngine
from app.chat.worker.child import CRASH_AT_LOAD
from app.engine import DRAFT_MODEL, GenerationParams, ModelsUnloaded, SamplingParams
from app.models.loader import LoadSpec, resolve
from app.prompts import chat_tokens

ROOT = Path(__file__).resolve().parent.parent
STARTER = LoadSpec(pair="starter", ctx=1024)
GREEDY = Settings(temperature=0.0, max_tokens=48, adaptive=False)
QUESTION = [{"role": "user", "content": "Name three rivers of Europe and say one thing about each."}]


def _answer(rt: Runtime, messages=QUESTION, settings: Settings = GREEDY) -> str:
    live = None
    for live in rt.answer(messages, settings):
        pass
    return live.text


def _maps(pid: int, name: str) -> bool:
    """Whether process ``pid`` has the file ``name`` mapped (weights llama.cpp loaded with mmap)."""
    return any(Path(m.path).name == name for m in psutil.Process(pid).memory_maps())


def _wait(condition, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def worker_rt(specchat_home):
    rt = Runtime(worker=True)
    rt.load(STARTER)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def in_process_text(specchat_home):
    """The greedy answer with the pair loaded in this process: what the worker must give too."""
    rt = Runtime()
    rt.load(STARTER)
    try:
        return _answer(rt)
    finally:
        rt.close()


def test_the_pair_is_loaded_in_the_worker_and_answers_as_in_one_process(worker_rt, in_process_text):
    engine = worker_rt.engine
    assert isinstance(engine, WorkerEngine)
    pid = engine.process_info()["pid"]
    assert pid != os.getpid()
    target = Path(worker_rt.resolved.target).name
    assert _maps(pid, target)  # the worker holds the weights...
    assert not _maps(os.getpid(), target) or engine.model.size_bytes  # (...this process only the vocabulary)
    text = _answer(worker_rt)
    assert text and text == in_process_text
    info = worker_rt.info()
    assert info["worker"]["pid"] == pid and info["worker"]["state"] == "ready"
    assert info["worker"]["rss_bytes"] > 0 and info["memory_bytes"] > 0


def test_compare_runs_both_sides_and_the_ceiling_in_the_worker(worker_rt):
    cmp = None
    for cmp in worker_rt.compare(QUESTION, GREEDY):
        pass
    assert cmp.phase == "done" and cmp.off.text and cmp.off.text == cmp.on.text
    assert cmp.on.stats.n_drafted > 0 and cmp.off.stats.n_drafted == 0
    assert cmp.ceiling is not None and cmp.ceiling.speedup > 0  # timed in the worker, with its draft model


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_a_worker_killed_mid_answer_fails_that_answer_and_the_next_is_answered(worker_rt, in_process_text, sig):
    engine = worker_rt.engine
    pid = engine.process_info()["pid"]
    ids = chat_tokens(engine.model, QUESTION)
    params = GenerationParams(max_tokens=400, sampling=SamplingParams(temperature=0.0))
    got = []
    with pytest.raises(WorkerDied) as died:
        for ev in engine.generate(ids, params, DRAFT_MODEL):
            got.append(ev)
            if len(got) == 3:
                os.kill(pid, sig)
    assert got  # (it was answering)
    message = str(died.value)
    assert sig.name in message and "while answering" in message and str(engine.log) in message
    # Meanwhile the API's requests are told to come back (503 with Retry-After), not failed for good.
    if engine.process_info()["state"] == "restarting":
        with pytest.raises(EngineRestarting):
            engine.speculation(DRAFT_MODEL)
    assert _answer(worker_rt) == in_process_text  # waits for the reload, then answers as before the crash
    info = engine.process_info()
    assert info["pid"] != pid and info["state"] == "ready" and sig.name in info["notice"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_worker_killed_while_idle_is_back_for_the_next_message(worker_rt, in_process_text):
    engine = worker_rt.engine
    pid = engine.process_info()["pid"]
    with open(engine.log, "a") as log:  # what the worker echoes of llama.cpp's errors before it dies
        log.write("llama.cpp: ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096 MiB: out of memory\n"
                  "  File \"x.py\", line 1 in f\n")
    os.kill(pid, signal.SIGSEGV)
    _wait(lambda: engine.process_info()["pid"] != pid and engine.ready, what="the worker to be started again")
    assert "while idle" in engine.notice
    assert "allocating 4096 MiB: out of memory" in engine.notice and "x.py" not in engine.notice  # (its stack: log)
    assert _answer(worker_rt) == in_process_text


def test_a_load_that_crashes_with_layers_offloaded_falls_back_to_the_cpu(specchat_home, monkeypatch):
    monkeypatch.setenv(CRASH_AT_LOAD, "offload")  # (no GPU here: the worker dies at load as on the H200)
    rt = Runtime(worker=True)
    rt.load(LoadSpec(pair="starter", ctx=512, ngl=99))
    try:
        engine = rt.engine
        assert engine.spec.ngl == 0
        assert "SIGSEGV" in engine.notice and "while loading starter with -ngl 99" in engine.notice
        assert "-ngl 0" in engine.notice
        assert _answer(rt, settings=Settings(temperature=0.0, max_tokens=8, adaptive=False))
    finally:
        rt.close()


def test_a_pair_whose_load_kills_the_worker_twice_is_not_loaded_at_the_next_start(specchat_home, monkeypatch):
    from app.cli.serve import startup_pair

    doomed = LoadSpec(pair="starter", ctx=256, ngl=99)
    monkeypatch.setenv(CRASH_AT_LOAD, "always")
    with pytest.raises(WorkerDied) as died:  # with -ngl 99, then on the CPU: two deaths
        Runtime(worker=True).load(doomed)
    assert "SIGSEGV" in str(died.value) and "while loading" in str(died.value)
    monkeypatch.delenv(CRASH_AT_LOAD)
    rt = Runtime(worker=True)
    try:
        notes = startup_pair(None, doomed, rt)  # the next start: the last-used pair is the doomed one
        assert rt.spec.describe() == "starter" and rt.spec.ctx != 256  # the starter instead...
        assert any("killed the engine 2 times" in n for n in notes), notes  # ...and why
        rt.load(doomed)  # asked for again by the person: loads, and is forgiven
        assert startup_pair(None, doomed, rt) == []
    finally:
        rt.close()


def test_switching_pairs_ends_the_old_worker(specchat_home):
    rt = Runtime(worker=True)
    rt.load(STARTER)
    old_engine = rt.engine
    old = old_engine.process_info()["pid"]
    rt.load(LoadSpec(pair="starter", ctx=512))
    try:
        assert rt.engine.process_info()["pid"] != old
        assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
        with pytest.raises(ModelsUnloaded):  # a request that still held the old engine is told to ask again
            old_engine.speculation(DRAFT_MODEL)
    finally:
        rt.close()


def test_a_worker_never_outlives_an_app_killed_with_kill_9(specchat_home, tmp_path):
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from app.chat.runtime import Runtime
        from app.models.loader import LoadSpec
        rt = Runtime(worker=True)
        rt.load(LoadSpec(pair="starter", ctx=512))
        print(rt.engine.process_info()["pid"], flush=True)
        time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        worker = int(parent.stdout.readline())
        assert psutil.pid_exists(worker)
    finally:
        parent.kill()
        parent.wait()
    _wait(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
          timeout=30, what="the orphaned worker to end")


def test_a_failing_load_is_the_loads_error_and_leaves_no_worker(specchat_home, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(Exception) as err:
        WorkerEngine(LoadSpec(target=str(bad)), resolve(LoadSpec(target=str(bad))))
    assert "bad.gguf" in str(err.value)
    _wait(lambda: {p.pid for p in psutil.Process().children(recursive=True)
                   if p.status() != psutil.STATUS_ZOMBIE} <= before, timeout=30, what="the worker to end")


def test_concurrent_requests_queue_in_the_worker_as_in_one_process(worker_rt, in_process_text):
    """Two answers asked at once both come back whole (the worker's engine takes them in turn)."""
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(_answer(worker_rt))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert out == [in_process_text, in_process_text]


# --- `specchat serve`: the API outlives its engine ----------------------------------------------------------------
def _worker_of(server: subprocess.Popen) -> psutil.Process:
    found = []
    _wait(lambda: found.extend(p for p in psutil.Process(server.pid).children(recursive=True)
                               if "app.chat.worker.child" in " ".join(p.cmdline())) or found,
          timeout=60, what="the server's engine worker")
    return found[0]


def _healthy(url: str, key: str) -> bool:
    import httpx

    r = httpx.get(url.removesuffix("/v1") + "/health", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code in (200, 503), r.text  # (503: loading, as llama-server says while it loads)
    return r.status_code == 200


@pytest.mark.slow
def test_serve_keeps_answering_through_crashes_of_its_engine(specchat_home):
    import anthropic
    import openai

    key = "sk-worker-test"
    ask = dict(model="starter", messages=QUESTION, max_tokens=40, temperature=0)
    with specchat_serve(specchat_home, key, with_process=True) as (url, server):
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
        before = client.chat.completions.create(**ask).choices[0].message.content
        worker = _worker_of(server)
        target = Path(resolve(LoadSpec(pair="starter")).target).name
        assert _maps(worker.pid, target) and not _maps(server.pid, target)  # the server maps no weights

        # SIGSEGV in the middle of a streamed answer: the stream ends with an error that says so...
        chunks = 0
        with pytest.raises(openai.APIError) as err:
            for _ in client.chat.completions.create(**{**ask, "max_tokens": 400}, stream=True):
                chunks += 1
                if chunks == 3:
                    os.kill(worker.pid, signal.SIGSEGV)
        assert "SIGSEGV" in str(err.value)
        # ...and the server goes on: loading meanwhile, then the same greedy answer as before the crash.
        _wait(lambda: _healthy(url, key), what="/health to say ok again")
        assert client.chat.completions.create(**ask).choices[0].message.content == before

        # The same through Anthropic's client: an error event in its shape, then a normal answer.
        worker = _worker_of(server)
        claude = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=300)
        seen = 0
        with pytest.raises(anthropic.APIError) as err:
            with claude.messages.stream(model="starter", max_tokens=400, messages=QUESTION,
                                        extra_body={"temperature": 0}) as stream:
                for _ in stream.text_stream:
                    seen += 1
                    if seen == 3:
                        os.kill(worker.pid, signal.SIGABRT)
        assert "SIGABRT" in str(err.value)
        _wait(lambda: _healthy(url, key), what="/health to say ok again")
        again = claude.messages.create(model="starter", max_tokens=16, messages=QUESTION,
                                       extra_body={"temperature": 0})
        assert again.content[0].text
        worker = _worker_of(server)
    # Stopped (Ctrl-C, checked clean by specchat_serve): no process holds the model any more.
    _wait(lambda: not psutil.pid_exists(worker.pid) or worker.status() == psutil.STATUS_ZOMBIE, timeout=30,
          what="the worker to end with the server")


@pytest.mark.slow
def test_kill_9_of_the_server_leaves_no_process_holding_the_model(specchat_home):
    with specchat_serve(specchat_home, with_process=True, stopped_by_test=True) as (url, server):
        worker = _worker_of(server)
        server.kill()
        server.wait()
        _wait(lambda: not psutil.pid_exists(worker.pid) or worker.status() == psutil.STATUS_ZOMBIE, timeout=30,
              what="the orphaned worker to end")


def test_requests_during_the_reload_get_503_with_retry_after_and_health_says_loading(specchat_home):
    import httpx
    from fastapi import FastAPI
    from support.servers import serve_in_thread

    from app.server.guard import Access, Guard
    from app.server.apis.llama_server import LlamaAliases
    from app.server.app import ApiServer

    rt = Runtime(worker=True)
    rt.load(LoadSpec(pair="starter", ctx=512))
    engine, hold = rt.engine, threading.Event()
    restart = engine._restart
    engine._restart = lambda died: (hold.wait(120), restart(died))  # the reload held until the test has asked
    root = FastAPI()
    root.mount("/v1", ApiServer(rt).app())
    body = {"model": "starter", "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    try:
        with serve_in_thread(lambda port: LlamaAliases(Guard(root, Access.serving(port, listen=False)))) as url:
            os.kill(engine.process_info()["pid"], signal.SIGKILL)
            _wait(lambda: engine.process_info()["state"] == "restarting", what="the worker's death to be seen")
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            assert "loading the pair again after a crash" in r.json()["error"]["message"]
            assert httpx.get(f"{url}/health", timeout=30).status_code == 503  # llama-server's "Loading model"
            hold.set()
            _wait(lambda: httpx.get(f"{url}/health", timeout=30).status_code == 200, what="/health to say ok")
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    finally:
        hold.set()
        rt.close()


@pytest.mark.slow
def test_the_terminal_chat_says_what_killed_its_engine_and_answers_the_next_message(specchat_home):
    chat = subprocess.Popen([sys.executable, "-m", "app", "chat", "--pair", "starter", "--max-tokens", "300",
                             "--temperature", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        _wait(lambda: _children_running(chat), what="the chat's engine worker")
        worker = _children_running(chat)[0]
        chat.stdin.write("Write a long story about a lighthouse.\n")
        chat.stdin.flush()
        assert chat.stdout.read(20)  # it is answering
        os.kill(worker.pid, signal.SIGSEGV)
        out, err = chat.communicate("Name an animal.\n", timeout=600)  # (then end of input: the chat ends)
    finally:
        chat.kill()
    assert chat.returncode == 0, err
    assert "SIGSEGV" in err and "while answering" in err and "Traceback" not in err
    assert err.count("tok/s") >= 1  # the next message's answer, with its stats line


def _children_running(proc: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(proc.pid).children(recursive=True)
            if "app.chat.worker.child" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE]


def test_every_method_forwarded_to_the_worker_is_one_it_answers():
    from app.chat.worker.parent import WorkerEngine
    from app.chat.worker.protocol import CALLS

    forwarded = {name for name, v in vars(WorkerEngine).items() if getattr(v, "__qualname__", "") == name}
    assert len(forwarded) >= 12 and forwarded <= CALLS, forwarded - CALLS


def test_a_fault_while_the_worker_reports_one_is_told_by_the_first():
    """faulthandler walks every thread's stack while they run, and can fault doing so: the worker then dies of
    that second signal, and its log (as in a real run: an abort, then a segfault mid-traceback) names the first."""
    from app.chat.worker.parent import _how

    logged = ('Fatal Python error: Aborted\n\nThread 0x00007f563bfff6c0 (most recent call first):\n'
              '  File "/app/engine/text_stream.py"Fatal Python error: Segmentation fault\n')
    assert _how(-signal.SIGSEGV, logged) == "killed by SIGABRT (Aborted; then SIGSEGV while reporting it)"
    assert _how(-signal.SIGSEGV, "Fatal Python error: Segmentation fault\n") == "killed by SIGSEGV (Segmentation fault)"
    assert _how(-signal.SIGKILL, "") == "killed by SIGKILL (Killed)"
    assert _how(3, logged) == "exited with status 3"
