"""SpecChat as a window onto a speculative server: `specchat generate --server` and `specchat bench --server` against
SpecChat's own `serve` (starter pair), and the failures a person meets: an unreachable server, a wrong key, an
unknown model, a stream that stops mid-answer, a server that reports no drafting (stand-ins on 127.0.0.1)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.servers import free_port, specchat_serve

from app.cli.remote import JSON_FIELDS

KEY = "sk-remote-test"
ROOT = Path(__file__).resolve().parent.parent


def specchat(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def served(specchat_home):
    with specchat_serve(specchat_home, KEY) as url:
        yield url


def generate(url, *extra, key=KEY):
    return specchat("generate", "--server", url, "--api-key", key, "--prompt", "Name three colours.", "-n", "48",
                    "--json", *extra)


def test_generate_against_a_server_reports_the_fields_of_a_local_run(served):
    r = generate(served)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(JSON_FIELDS) <= set(out)
    assert out["token_ids"] is None and out["draft_flags"] is None and out["n_rounds"] is None  # not reported
    assert out["draft_seconds"] is None and out["batch_invariant"] is None
    assert out["n_drafted"] > 0 and 0 < out["acceptance_rate"] <= 1 and out["n_accepted"] <= out["n_drafted"]
    assert out["tokens_per_second"] > 0 and out["server_tokens_per_second"] > 0  # ours, from the stream; theirs
    assert out["n_tokens"] <= 48 and out["time_to_first_token_s"] > 0 and out["model"] == "starter"
    assert out["engine"] == "specchat"  # from the owner /v1/models names
    assert out["method"].startswith("draft model SmolLM2") and out["drafter"].startswith("server: draft model")

    off = json.loads(generate(served, "--drafter", "none").stdout)  # speculative.n_max 0: honoured by our server
    assert off["n_drafted"] == 0 and off["text"] == out["text"]  # greedy: the same answer


def test_streamed_text_then_a_summary(served):
    r = specchat("generate", "--server", served, "--api-key", KEY, "--prompt", "Hi", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert "tok/s measured here, server says" in r.stdout and "acceptance" in r.stdout


def test_terminal_chat_with_a_server_answers_each_turn_with_its_figures(served):
    r = subprocess.run([sys.executable, "-m", "app", "chat", "--server", served, "--api-key", KEY, "-n", "12"],
                       input="My name is Ada.\nWhat is my name?\n", capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("tok/s measured here") == 2 and "acceptance" in r.stderr and "Traceback" not in r.stderr


def test_bench_against_a_server_turning_speculation_off_per_request(served, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Name three colours.", "category": "list"}\n'
                       '{"prompt": "Write one sentence about the sea.", "category": "story"}\n')
    r = specchat("bench", "--server", served, "--api-key", KEY, "--prompts", prompts, "-n", "32", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["server"]["off"].endswith("(speculative.n_max 0)")
    assert report["overall"]["all_identical"] and report["overall"]["acceptance"] > 0
    assert all(row["tps_off"] > 0 and row["tps_on"] > 0 for row in report["prompts"])


@pytest.mark.parametrize("case,words", [
    ("key", r"refused the API key \(401\)"),
    ("down", r"Cannot reach http://127\.0\.0\.1:\d+ \(ConnectError\): is the server running"),
    ("url", r"'127\.0\.0\.1:1' is not a server URL"),
])
def test_server_failures_are_explained(served, case, words):
    import re

    url = {"down": f"http://127.0.0.1:{free_port()}", "url": "127.0.0.1:1"}.get(case, served)
    r = generate(url, key="wrong" if case == "key" else KEY)
    assert r.returncode == 1 and re.search(words, r.stderr), r.stderr
    assert "Traceback" not in r.stderr


def test_any_model_name_is_answered_by_the_loaded_pair(served):
    """As llama-server does: a tool that hard-codes a model name still gets the loaded pair's answer."""
    r = generate(served, "--model", "gpt-4o", key=KEY)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@contextmanager
def running(handler: type, **attrs):
    """A stand-in server on a free 127.0.0.1 port (``attrs`` set on a subclass of ``handler``); yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (handler,), attrs))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


class Quiet(BaseHTTPRequestHandler):
    """A stand-in's plumbing: HTTP/1.1, no request log, whole responses with their length."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status: int, body, kind: str = "application/json") -> None:
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class StandIn(BaseHTTPRequestHandler):
    """A server that streams three words and then drops the connection (``cut``), or answers whole without any
    speculation figures (a plain OpenAI-compatible server)."""
    protocol_version = "HTTP/1.1"
    cut = True
    think = False  # stream a reasoning model's thinking apart first, as llama-server's reasoning_content
    bodies: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "plain-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for thought in ("The user wants", " colours.") if self.think else ():
            self._chunk({"choices": [{"index": 0, "delta": {"reasoning_content": thought}, "finish_reason": None}]})
        for word in ("Red", ", green", ", blue"):
            self._chunk({"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
        if self.cut:
            self.wfile.write(b"5\r\ndata:")  # half a chunk, then the connection goes
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self._chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")

    def _chunk(self, obj):
        data = f"data: {json.dumps(obj)}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@pytest.fixture(params=[True, False], ids=["cut", "plain"])
def stand_in(request):
    with running(StandIn, cut=request.param) as url:
        yield url, request.param


def test_a_cut_stream_keeps_the_partial_answer_and_a_plain_server_reports_no_drafting(stand_in):
    url, cut = stand_in
    r = specchat("generate", "--server", url, "--prompt", "Colours?", "-n", "16")
    if cut:
        assert r.returncode == 1 and r.stdout.startswith("Red, green, blue")
        assert "stream from http://127.0.0.1" in r.stderr and "stopped mid-answer" in r.stderr
        assert "the partial answer is above" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert "drafting not reported by this server" in r.stdout
    out = json.loads(specchat("generate", "--server", url, "--prompt", "Colours?", "--json").stdout)
    assert out["text"] == "Red, green, blue" and out["n_tokens"] == 3 and out["engine"] == "OpenAI-compatible"
    assert out["n_drafted"] is None and out["acceptance_rate"] is None and "n_drafted" in out["unreported"]


class VllmStandIn(Quiet):
    """Answers as vLLM's OpenAI server does (per its docs' "Production Metrics" page and its sources
    vllm/entrypoints/openai/api_server.py for /version and /metrics, vllm/v1/spec_decode/metrics.py for the
    speculative-decoding counters, labelled by engine and model_name): a streamed chat answer with usage but no
    timings, and counters that grow by each request's drafted and accepted tokens. ``busy``: another request
    finishes during ours, so the counters are server-wide, not ours alone."""
    busy = False
    counters = {"drafted": 0, "accepted": 0, "finished": 0}

    def do_GET(self):
        c, labels = self.counters, 'engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"'
        if self.path == "/version":
            return self._send(200, b'{"version": "0.11.0"}', "application/json")
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [
                {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "vllm"}]}).encode(),
                "application/json")
        if self.path == "/metrics":
            text = (f"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
                    f"vllm:spec_decode_num_drafts_total{{{labels}}} {c['drafted'] / 5}\n"
                    f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(c['drafted'])}\n"
                    f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(c['accepted'])}\n"
                    f'vllm:request_success_total{{{labels},finished_reason="stop"}} {float(c["finished"])}\n'
                    f'vllm:request_success_total{{{labels},finished_reason="length"}} 0.0\n')
            return self._send(200, text.encode(), "text/plain; version=0.0.4")
        self._send(404, b'{"detail": "Not Found"}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        words = ("Red", ", green", ", blue", ".")
        chunks = [{"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in words]
        chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                   {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.counters.update(drafted=self.counters["drafted"] + 10, accepted=self.counters["accepted"] + 7,
                             finished=self.counters["finished"] + (2 if self.busy else 1))
        self._send(200, body.encode(), "text/event-stream")


@pytest.mark.parametrize("busy", [False, True], ids=["alone", "busy"])
def test_vllm_figures_come_from_its_prometheus_counters(busy):
    with running(VllmStandIn, busy=busy, counters={"drafted": 40, "accepted": 30, "finished": 4}) as url:
        r = specchat("generate", "--server", url, "--prompt", "Colours?", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["engine"] == "vLLM 0.11.0" and out["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert out["text"] == "Red, green, blue." and out["n_tokens"] == 4
    assert (out["n_drafted"], out["n_accepted"], out["acceptance_rate"]) == (10, 7, 0.7)  # this request's deltas
    assert out["drafter"] == ("server: method not reported (vLLM server-wide counters: other requests ran meanwhile)"
                              if busy else "server: method not reported (vLLM counters)")
    assert out["n_rounds"] == 2 and out["mean_accepted_per_round"] == 3.5  # vllm:spec_decode_num_drafts_total
    assert out["token_ids"] is None


class EngineStandIn(Quiet):
    """Answers as vLLM, SGLang or Hugging Face TGI do when they speculate, each as its docs and sources show:

    - ``vllm``: started with ``--per-request-spec-decode-metrics summary``: the streamed answer's final usage chunk
      carries ``metrics.speculative_decoding`` (docs/features/speculative_decoding/acceptance_metrics.md: only with
      ``stream_options.include_usage``). Its Prometheus counters also grow, by other amounts, to show they are not
      what is read when the request's own figures came.
    - ``sglang``: /v1/models owned by "sglang", /server_info with ``speculative_algorithm`` and
      ``speculative_num_draft_tokens`` (python/sglang/srt/entrypoints/http_server.py); a request with
      ``return_spec_tokens_details`` gets a chunk with no choices and ``sglext.spec_tokens_details`` before the usage
      chunk (entrypoints/openai/serving_chat.py, protocol.py SglExt/SpecTokensDetails, utils.py
      spec_tokens_details_from_meta_info).
    - ``tgi``: /info names its router "text-generation-router" (router/src/lib.rs Info); /metrics carries the
      histogram ``tgi_request_skipped_tokens`` (one sample per decoding step: the tokens beyond its first,
      router/src/infer/mod.rs; docs/source/reference/metrics.md "Speculated tokens per request") and the counter
      ``tgi_request_success``. It reports no drafted count.
    """
    engine = "vllm"
    state = {"skipped": 0, "steps": 0, "done": 0, "drafted": 0, "accepted": 0}
    words = ("Red", ", green", ", blue", ".")

    def do_GET(self):
        st, model = self.state, "org/Model-7B"
        owner = {"vllm": "vllm", "sglang": "sglang", "tgi": model}[self.engine]
        pages = {"/v1/models": {"object": "list", "data": [{"id": model, "object": "model", "owned_by": owner}]}}
        if self.engine == "vllm":
            pages["/version"] = {"version": "0.12.0"}
            pages["/metrics"] = (f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {st['drafted']}.0\n"
                                 f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {st['accepted']}.0\n")
        if self.engine == "sglang":
            pages["/server_info"] = {"model_path": model, "speculative_algorithm": "EAGLE3",
                                     "speculative_num_draft_tokens": 4, "version": "0.5.5"}
        if self.engine == "tgi":
            pages["/info"] = {"model_id": model, "version": "3.3.4", "router": "text-generation-router",
                              "max_total_tokens": 4096}
            pages["/metrics"] = ("# TYPE tgi_request_skipped_tokens histogram\n"
                                 f'tgi_request_skipped_tokens_bucket{{le="0"}} {st["steps"] - st["skipped"]}\n'
                                 f'tgi_request_skipped_tokens_bucket{{le="+Inf"}} {st["steps"]}\n'
                                 f"tgi_request_skipped_tokens_sum {st['skipped']}\n"
                                 f"tgi_request_skipped_tokens_count {st['steps']}\n"
                                 f"# TYPE tgi_request_success counter\ntgi_request_success {st['done']}\n")
        page = pages.get(self.path)
        if page is None:
            return self._send(404, {"error": "Not Found"})
        self._send(200, page.encode() if isinstance(page, str) else page,
                   "text/plain" if isinstance(page, str) else "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chunks = [{"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in self.words]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        last = {"choices": [], "usage": usage}
        if self.engine == "vllm" and body["stream_options"]["include_usage"]:
            last["metrics"] = {"time_to_first_token_ms": 20.5, "speculative_decoding": {
                "mean_acceptance_length": 2.0, "draft_acceptance_rate": 2 / 6, "acceptance_histogram": [1, 0, 1, 0],
                "acceptance_histogram_by_draft_length": {"3": [1, 0, 1, 0]}, "num_spec_steps": 2,
                "num_accepted_draft_tokens": 2, "num_draft_tokens": 6, "num_spec_tokens": 3}}
            self.state.update(drafted=self.state["drafted"] + 50, accepted=self.state["accepted"] + 1)
        if self.engine == "sglang" and body.get("return_spec_tokens_details"):
            chunks.append({"choices": [], "sglext": {"spec_tokens_details": {
                "spec_accept_rate": 0.25, "spec_accept_length": 2.0, "spec_cap_length": 4.0,
                "spec_block_accept_length": 1.0, "spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 8,
                "spec_verify_ct": 2, "spec_correct_drafts_histogram": [1, 0, 1, 0, 0],
                "spec_cap_lens_histogram": [0, 0, 0, 0, 2]}}})
        if self.engine == "tgi":
            self.state.update(skipped=self.state["skipped"] + 2, steps=self.state["steps"] + 2,
                              done=self.state["done"] + 1)
        chunks.append(last)
        self._send(200, ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode(),
                   "text/event-stream")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_each_engines_own_per_request_figures(engine):
    state = {"skipped": 5, "steps": 20, "done": 3, "drafted": 100, "accepted": 60}
    with running(EngineStandIn, engine=engine, state=state) as url:
        r = specchat("generate", "--server", url, "--prompt", "Colours?", "--json")
        text = specchat("generate", "--server", url, "--prompt", "Colours?")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == "Red, green, blue." and out["n_tokens"] == 4 and out["model"] == "org/Model-7B"
    if engine == "vllm":  # the request's own figures, not the counters (which grew by 50 drafted meanwhile)
        assert out["engine"] == "vLLM 0.12.0" and out["drafter"].endswith("(vLLM per-request metrics)")
        assert (out["n_drafted"], out["n_accepted"], out["n_rounds"]) == (6, 2, 2)
        assert out["acceptance_rate"] == pytest.approx(1 / 3) and out["mean_accepted_per_round"] == 1.0
    if engine == "sglang":
        assert out["engine"] == "SGLang" and out["method"] == "EAGLE3, 4 draft tokens"
        assert out["drafter"] == "server: EAGLE3, 4 draft tokens (SGLang spec_tokens_details)"
        assert (out["n_drafted"], out["n_accepted"], out["n_rounds"], out["acceptance_rate"]) == (8, 2, 2, 0.25)
    if engine == "tgi":  # tokens from speculation and steps, but no drafted count: no acceptance rate
        assert out["engine"] == "TGI 3.3.4" and "TGI reports tokens from speculation" in out["drafter"]
        assert (out["n_accepted"], out["n_rounds"]) == (2, 2) and out["n_drafted"] is None
        assert out["acceptance_rate"] is None and "n_drafted" in out["unreported"]
        assert "drafting not reported by this server" in text.stdout
    else:
        assert "acceptance" in text.stdout and "not reported" not in text.stdout


def test_sglang_meta_info_alone_gives_drafts_from_verify_steps_and_accept_rate():
    from app.chat.remote_server import _take_figures
    from app.engine import Stats

    stats = Stats(unreported=("n_drafted", "n_accepted", "n_rounds"))
    source = _take_figures(stats, {"meta_info": {"completion_tokens": 10, "spec_verify_ct": 4,
                                                 "spec_accept_rate": 0.5}})
    assert source.startswith("SGLang meta_info") and stats.unreported == ()
    assert (stats.n_accepted, stats.n_drafted, stats.n_rounds) == (6, 12, 4)  # 10 tokens in 4 steps: 6 from drafts


def test_the_apps_runtime_chats_and_compares_through_a_server_and_keeps_its_key_private(served, specchat_home):
    """The app's core with a server as its backend: connect (the key from the owner-only key file), chat with live
    figures, Compare off (asked per request) vs on with the outputs compared as text; a wrong URL keeps it."""
    import stat

    from app.chat.server_keys import FILE, key_for, save_key
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.engine import EngineError
    from app.models.loader import LoadSpec
    from app.paths import config_dir

    save_key(served, KEY)
    keys = config_dir() / FILE
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and key_for(served.removesuffix("/v1")) == KEY
    rt = Runtime()
    try:
        rt.load(LoadSpec(server=served, method="draft Q4_1"))
        info = rt.info()
        assert info["server"]["engine"] == "specchat" and info["target"] == "starter" and "model" in rt.drafters
        assert info["pair"] == f"starter @ {served}" and KEY not in json.dumps(info)
        settings = Settings(max_tokens=40)
        snapshots = list(rt.answer([{"role": "user", "content": "Name three colours."}], settings))
        live = snapshots[-1]
        assert live.done.finish_reason in ("stop", "length") and live.text == live.done.text != ""
        s = live.stats
        assert s.drafter == "server: draft Q4_1 (llama-server timings)" and s.n_drafted > 0 and s.rate_measured
        assert s.reported("acceptance_rate") and not s.reported("draft_seconds")
        assert len(snapshots) > 1  # streamed, not all at the end

        # Continue through the server: greedy, 12 tokens and 12 more are the 24-token answer
        from app.chat.live_answer import Live

        greedy = Settings(max_tokens=12, temperature=0.0)
        part = list(rt.answer([{"role": "user", "content": "Write a story."}], greedy))[-1]
        more = list(rt.answer([{"role": "user", "content": "Write a story."}], greedy, continues=Live.going_on(
            part.text, part.segments, part.stats.as_dict())))[-1]
        whole = list(rt.answer([{"role": "user", "content": "Write a story."}], Settings(max_tokens=24,
                                                                                       temperature=0.0)))[-1]
        assert more.text == whole.text and more.stats.n_tokens == 24 and part.done.finish_reason == "length"

        cmp = list(rt.compare([{"role": "user", "content": "Name three colours."}], settings))[-1]
        # The chat samples (temperature 0.7); Compare through a server runs greedy, and says so
        assert cmp.by_text and cmp.first_difference() is None and cmp.note.startswith("Compared greedy")
        assert cmp.off.stats.n_drafted == 0 and cmp.on.stats.n_drafted > 0 and cmp.speedup > 0

        with pytest.raises(EngineError, match="Cannot reach"):
            rt.load(LoadSpec(server=f"http://127.0.0.1:{free_port()}"))
        assert rt.info()["server"]["url"] == served.removesuffix("/v1")  # still connected
        rt.load(LoadSpec(server=served, server_off=served))  # a twin for the off side (here: the same server)
        assert rt.remote_off is not None and rt.remote_off.model == "starter"
    finally:
        rt.close()


def test_the_app_started_with_server_connects_and_saves_the_key_owner_only(served, tmp_path):
    import os
    import signal
    import stat

    home = tmp_path / "home"
    env = dict(os.environ, SPECCHAT_HOME=str(home), PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "app", "--server", served, "--pair", "starter", "--no-browser"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 1 and "either --server or a local pair" in r.stderr
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app", "--server", served, "--server-api-key", KEY, "--port",
                             str(port), "--no-browser"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        while (line := proc.stdout.readline()) and "running at" not in line:
            lines.append(line)
        assert f"(pair: starter @ {served};" in line, "".join(lines) + line
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and KEY not in "".join(lines) + line + out
    keys = home / "config" / "server-keys.json"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and KEY in keys.read_text()
    saved = json.loads((home / "config" / "settings.json").read_text())
    assert saved["models"]["server"] == served and KEY not in json.dumps(saved)


def test_the_app_keeps_a_partial_answer_when_the_stream_stops_and_explains_a_refused_key(served, tmp_path,
                                                                                         monkeypatch):
    from app.chat.server_keys import key_for
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.engine import EngineError
    from app.models.loader import LoadSpec
    from app.ui import render

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))  # a home with no saved keys
    rt = Runtime()
    try:
        with running(StandIn, cut=True) as url:
            rt.load(LoadSpec(server=url))
            live = list(rt.answer([{"role": "user", "content": "Colours?"}], Settings()))[-1]
        assert live.done.finish_reason == "error" and live.text == "Red, green, blue"
        assert "stopped mid-answer" in live.stats.error
        panel = render.live_panel(live.stats, live.points, "done")
        assert "stopped mid-answer" in panel and "the partial answer is kept" in panel
        assert render.live_panel(live.stats, [], "done").count(render.NOT_REPORTED) >= 3  # no drafting figures at all
        with pytest.raises(EngineError, match=r"refused the API key \(401\)"):
            rt.load(LoadSpec(server=served))
        with pytest.raises(EngineError, match=r"refused the API key \(401\)"):
            rt.load(LoadSpec(server=served), api_key="wrong")
        assert rt.info()["server"]["url"] == url and key_for(served) is None  # still connected; nothing saved
        rt.load(LoadSpec(server=served), api_key=KEY)
        assert key_for(served) == KEY  # saved once the server accepted it
    finally:
        rt.close()


def test_thinking_streamed_apart_comes_back_in_think_tags_and_can_be_turned_off():
    from app.chat.live_answer import Live
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.prompts.thinking import split
    from app.models.loader import LoadSpec

    rt = Runtime()
    bodies = []
    try:
        with running(StandIn, cut=False, think=True, bodies=bodies) as url:
            rt.load(LoadSpec(server=url))
            live = list(rt.answer([{"role": "user", "content": "Colours?"}], Settings()))[-1]
            assert live.text == "<think>\nThe user wants colours.\n</think>\n\nRed, green, blue"
            parts = split(live.text)
            assert parts.thinking == "The user wants colours." and live.text[parts.answer_start:] == "Red, green, blue"
            assert "chat_template_kwargs" not in bodies[-1]  # the template's own default
            list(rt.answer([{"role": "user", "content": "Colours?"}], Settings(enable_thinking=False)))
            assert bodies[-1]["chat_template_kwargs"] == {"enable_thinking": False}
            assert "continue_final_message" not in bodies[-1]
            list(rt.answer([{"role": "user", "content": "Colours?"}], Settings(), continues=Live.going_on("Red")))
            assert bodies[-1]["messages"][-1] == {"role": "assistant", "content": "Red"}  # Continue: said as
            assert bodies[-1]["continue_final_message"] is True and bodies[-1]["add_generation_prompt"] is False
    finally:
        rt.close()
