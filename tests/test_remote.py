"""SpecChat as a window onto a speculative server: `specchat generate --server` and `specchat bench --server` against
SpecChat's own `serve` (starter pair), and the failures a person meets: an unreachable server, a wrong key, an
unknown model, a stream that stops mid-answer, a server that reports no drafting (stand-ins on 127.0.0.1)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from servers import free_port, specchat_serve

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
    ("model", r"has no model 'nope' \(404\).*Its models: starter"),
    ("down", r"Cannot reach http://127\.0\.0\.1:\d+ \(ConnectError\): is the server running"),
    ("url", r"'127\.0\.0\.1:1' is not a server URL"),
])
def test_server_failures_are_explained(served, case, words):
    import re

    url = {"down": f"http://127.0.0.1:{free_port()}", "url": "127.0.0.1:1"}.get(case, served)
    extra = ["--model", "nope"] if case == "model" else []
    r = generate(url, *extra, key="wrong" if case == "key" else KEY)
    assert r.returncode == 1 and re.search(words, r.stderr), r.stderr
    assert "Traceback" not in r.stderr


class StandIn(BaseHTTPRequestHandler):
    """A server that streams three words and then drops the connection (``cut``), or answers whole without any
    speculation figures (a plain OpenAI-compatible server)."""
    protocol_version = "HTTP/1.1"
    cut = True

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
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
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
    handler = type("Handler", (StandIn,), {"cut": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", request.param
    server.shutdown()


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


class VllmStandIn(BaseHTTPRequestHandler):
    """Answers as vLLM's OpenAI server does (per its docs' "Production Metrics" page and its sources
    vllm/entrypoints/openai/api_server.py for /version and /metrics, vllm/v1/spec_decode/metrics.py for the
    speculative-decoding counters, labelled by engine and model_name): a streamed chat answer with usage but no
    timings, and counters that grow by each request's drafted and accepted tokens. ``busy``: another request
    finishes during ours, so the counters are server-wide, not ours alone."""
    protocol_version = "HTTP/1.1"
    busy = False
    counters = {"drafted": 0, "accepted": 0, "finished": 0}

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
    handler = type("Handler", (VllmStandIn,), {"busy": busy, "counters": {"drafted": 40, "accepted": 30,
                                                                          "finished": 4}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = specchat("generate", "--server", url, "--prompt", "Colours?", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
    finally:
        server.shutdown()
    assert out["engine"] == "vLLM 0.11.0" and out["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert out["text"] == "Red, green, blue." and out["n_tokens"] == 4
    assert (out["n_drafted"], out["n_accepted"], out["acceptance_rate"]) == (10, 7, 0.7)  # this request's deltas
    assert out["drafter"] == ("server (vLLM server-wide counters: other requests ran meanwhile)" if busy
                              else "server (vLLM counters)")
    assert out["token_ids"] is None and out["n_rounds"] is None
