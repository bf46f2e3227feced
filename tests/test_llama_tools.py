"""llama.cpp's own tools as the tests start them (tests/support/llama_tools.py): with weights loaded as SpecChat
loads them (no repacking, which a VM that traps AMX tiles answers with SIGILL), and, when one dies, a failure that
says how: the signal, the exit status, its last lines. A stand-in script plays the tool, so no build is needed."""
from __future__ import annotations

from pathlib import Path

import pytest

from support import llama_server as llama_server_module
from support.llama_tools import death_report, environment, exit_status


def stand_in(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def test_every_tool_is_started_without_repacked_weights_and_without_the_tiled_matmul(monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_REPACK", "1")  # a person's own setting does not reach the tests' tools
    env = environment()
    assert env["LLAMA_ARG_REPACK"] == "0" and env["GGML_CPU_TILED_MM"] == "0"
    assert env["PATH"]  # the rest of the environment is kept


def test_a_llama_server_killed_by_sigill_at_load_says_so_with_its_last_lines(tmp_path, monkeypatch):
    # What an AMX-trapping VM does to a repacking llama-server: lines, "initializing", then SIGILL.
    fake = stand_in(tmp_path, 'for i in $(seq 1 60); do echo "line $i"; done\n'
                              'echo "repack=$LLAMA_ARG_REPACK args=$*"\necho "load_model: initializing"\nkill -ILL $$\n')
    monkeypatch.setattr(llama_server_module, "binary", lambda: fake)
    with pytest.raises(RuntimeError) as caught:
        with llama_server_module.llama_server(tmp_path / "model.gguf", tmp_path / "draft.gguf"):
            pytest.fail("a server that died at load must not be yielded")
    said = str(caught.value)
    assert said.startswith("llama-server killed by SIGILL (Illegal instruction), status 132")
    assert "| load_model: initializing" in said and "repack=0" in said  # what it saw and printed last
    assert "-md" in said and "--spec-type draft-simple" in said
    assert "| line 60" in said and "| line 20\n" not in said  # the tail, not the whole log


def test_a_server_that_dies_under_a_test_is_reported_as_dead_not_as_a_refused_connection(tmp_path, monkeypatch):
    import httpx

    # Healthy (a one-shot HTTP answer from python), then it aborts while the test talks to it.
    fake = stand_in(tmp_path, f'''exec python3 - "$@" <<'EOF'
import http.server, os, signal, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}"); self.wfile.flush()
        print("answered /health", flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
EOF
''')
    monkeypatch.setattr(llama_server_module, "binary", lambda: fake)
    with pytest.raises(RuntimeError) as caught:
        with llama_server_module.llama_server(tmp_path / "model.gguf") as url:
            for _ in range(200):  # until it is gone
                httpx.get(url + "/health", timeout=5)
    assert str(caught.value).startswith("llama-server killed by SIGABRT (Aborted), status 134")
    assert "| answered /health" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx.HTTPError)


@pytest.mark.parametrize("code, said", [(-11, "killed by SIGSEGV (Segmentation fault), status 139"),
                                        (137, "killed by SIGKILL (Killed), status 137"),
                                        (1, "exited with status 1"), (0, "exited with status 0")])
def test_exit_statuses_read_as_a_signal_from_popen_or_a_shell_or_as_a_plain_exit(code, said):
    assert exit_status(code) == said


def test_a_tool_that_printed_nothing_says_so():
    assert death_report("llama-mtmd-cli", -6, "") == "llama-mtmd-cli killed by SIGABRT (Aborted), status 134; " \
                                                    "its last 0 lines:\n  (it printed nothing)"


@pytest.mark.slow
def test_the_real_llama_server_keeps_weights_unrepacked_as_specchat_does(tmp_path):
    """A Q4_0 model, which llama.cpp's CPU backend repacks where it can (AVX2, NEON, AMX), served as the tests serve
    it: llama.cpp's own log names no repacked buffer, only the memory-mapped one SpecChat also loads."""
    from app.engine.llama import quantize
    from app.models import starter

    model = tmp_path / "starter-q4_0.gguf"
    quantize(starter.target_path(), model, "Q4_0")
    with llama_server_module.llama_server_tool(model, None, "-lv", "4") as (_, server):
        log = server.output()
    buffers = [line for line in log.splitlines() if "model buffer size" in line]
    assert buffers and all("REPACK" not in line and "AMX" not in line for line in buffers), buffers
    assert any("CPU_Mapped" in line for line in buffers)
