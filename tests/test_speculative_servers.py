"""SpecChat driving existing speculative servers with the starter pair: llama.cpp's llama-server (built from the
llama.cpp vendored in the pinned llama-cpp-python sdist, started with -m F32 target, -md Q4_1 draft,
--spec-type draft-simple, and a second one without -md), and SpecChat's own `specchat serve` (with its draft, and a
second one with --drafter none). The same checks run against both: a streamed chat with acceptance from the
server's own per-chunk figures, speculation off (second server) vs on giving identical greedy text, and
`specchat bench --server URL --server-off URL2` on the prompt set."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.llama_server import llama_server
from support.servers import specchat_serve

from app.chat.remote_server import RemoteServer, ServerSpec
from app.engine import Done, GenerationParams, Round, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Explain what a hash map is in two sentences."}]


def specchat(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module", params=["llama-server", "specchat"])
def servers(request, specchat_home):
    """(URL that speculates, URL of the same target without speculation)."""
    from app.models.starter import draft_path, target_path

    with ExitStack() as stack:
        if request.param == "llama-server":
            target = target_path()
            on = stack.enter_context(llama_server(target, draft_path()))
            off = stack.enter_context(llama_server(target))
        else:
            on = stack.enter_context(specchat_serve(specchat_home))
            off = stack.enter_context(specchat_serve(specchat_home, None, "--drafter", "none"))
        yield on, off


def test_a_streamed_chat_shows_the_servers_own_figures_as_they_come(servers):
    on, _ = servers
    server = RemoteServer(ServerSpec(on))
    try:
        events = list(server.generate(PROMPT, GenerationParams(max_tokens=64, sampling=SamplingParams(0.0))))
    finally:
        server.close()
    rounds = [e for e in events if isinstance(e, Round)]
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason in ("stop", "length") and done.text
    assert len(rounds) > 5  # timings_per_token: figures with every chunk, not only at the end
    assert [r.stats.n_drafted for r in rounds] == sorted(r.stats.n_drafted for r in rounds)
    s = done.stats
    assert s.reported("n_drafted") and s.n_drafted > 0 and 0 < s.acceptance_rate <= 1
    assert s.server_tokens_per_second > 0 and s.tokens_per_second > 0 and s.n_tokens <= 64


def test_speculation_off_on_a_second_server_and_on_give_the_same_greedy_text(servers):
    on, off = servers
    runs = [json.loads(specchat("generate", "--server", url, "--prompt", PROMPT[0]["content"], "-n", "64",
                                "--json").stdout) for url in (off, on)]
    assert runs[0]["text"] == runs[1]["text"] and len(runs[1]["text"]) > 20
    assert not runs[0]["n_drafted"] and runs[1]["n_drafted"] > 0  # off: none (or not reported at all)


def test_bench_against_a_server_and_its_speculation_off_twin(servers):
    on, off = servers
    r = specchat("bench", "--server", on, "--server-off", off, "--prompts", ROOT / "tests" / "prompts" / "chat.jsonl",
                 "-n", "32", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert len(report["prompts"]) == 12 and report["overall"]["all_identical"]
    assert report["overall"]["acceptance"] > 0 and report["overall"]["tps_on"] > 0
    assert (report["server"]["on"], report["server"]["off"]) == (on.removesuffix("/v1"), off.removesuffix("/v1"))
    assert report["server"]["engine"] in ("llama.cpp llama-server", "specchat")


def test_llama_server_cannot_turn_speculation_off_per_request_and_bench_says_so(servers, tmp_path):
    """The vendored llama-server parses no per-request speculative.* keys: bench detects it from the draft_n it
    keeps reporting and asks for a second server, instead of timing speculation twice."""
    on, _ = servers
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "Name three colours."}\n')
    r = specchat("bench", "--server", on, "--prompts", prompts, "-n", "16")
    server = RemoteServer(ServerSpec(on))
    engine = server.identify()
    server.close()
    if engine == "llama.cpp llama-server":
        assert r.returncode == 1 and "does not turn speculation off per request" in r.stderr
        assert "--server-off URL" in r.stderr
    else:
        assert r.returncode == 0, r.stderr  # SpecChat's own server honours speculative.n_max 0



def test_the_apps_compare_against_the_server_and_its_twin(servers):
    """Compare in the app (its runtime, as the Compare tab drives it): off on the twin, on the server, greedy,
    identical text. Without a twin, llama-server keeps drafting on the "off" side and Compare says so."""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    on, off = servers
    rt = Runtime()
    try:
        rt.load(LoadSpec(server=on, server_off=off))
        cmp = list(rt.compare(PROMPT, Settings(max_tokens=48)))[-1]
        # (the chat's settings sample: Compare through a server runs greedy, and says so)
        assert cmp.phase == "done" and cmp.by_text and cmp.first_difference() is None
        assert cmp.note.startswith("Compared greedy (temperature 0)")
        assert len(cmp.on.text) > 20 and cmp.on.stats.n_drafted > 0 and not cmp.off.stats.n_drafted
        assert cmp.speedup > 0 and cmp.drafter.startswith("server: ")

        rt.load(LoadSpec(server=on))  # no twin: speculation off is asked for per request
        cmp = list(rt.compare(PROMPT, Settings(max_tokens=16, temperature=0.0)))[-1]
        if rt.info()["server"]["engine"] == "llama.cpp llama-server":
            assert "kept drafting" in cmp.note and "speculation-off server" in cmp.note
        else:
            assert cmp.note == "" and cmp.off.stats.n_drafted == 0 and cmp.first_difference() is None
    finally:
        rt.close()
