#!/usr/bin/env python3
"""Run llama.cpp's own server tests (``tools/server/tests/unit`` in the pinned llama-cpp-python sdist), unchanged,
against ``specchat serve --pair starter`` or against the real ``llama-server`` on the same model file (the starter's
F32 target), and compare the two. Not part of the default test run: it takes tens of minutes and needs llama-server
(built by tests/support/llama_server.py).

    python tests/peer/run_llama_server_suite.py run --server llama-server --json /tmp/peer-llama.json
    python tests/peer/run_llama_server_suite.py run --server specchat --json /tmp/peer-specchat.json
    python tests/peer/run_llama_server_suite.py compare /tmp/peer-llama.json /tmp/peer-specchat.json
    python tests/peer/run_llama_server_suite.py run --server specchat --json /tmp/peer-specchat.json --merge \
        --files test_template.py test_chat_completion.py::test_apply_chat_template   # (more for pytest after --)

The suite starts its server from ``LLAMA_SERVER_BIN_PATH`` with llama-server's flags. That path is a small script
which runs this file again (``as-server``) to map the flags: for SpecChat, to ``specchat serve``'s (the model flags
become ``--pair starter``; flags for what SpecChat leaves out are dropped); for llama-server, the model flags become
``-m`` the starter's target. Its presets download tiny models from the Hub: no network is used, every preset serves
the starter, so tests asserting the texts of the suite's own models fail on both servers alike.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDIST = ROOT / "tests" / ".cache" / "llama_cpp_python-0.3.36.tar.gz"
SUITE = "vendor/llama.cpp/tools/server/tests/"
TEMPLATES = "vendor/llama.cpp/models/templates/"
# The files about what both servers serve (left out: embeddings, rerank, infill, LoRA, router, slot saving, vision,
# MCP and built-in tools, the CORS proxy, sleeping, GCP and KV-cache tuning).
FILES = ("test_basic.py", "test_chat_completion.py", "test_compat_anthropic.py", "test_compat_oai_responses.py",
         "test_completion.py", "test_ctx_shift.py", "test_ignore_eos.py", "test_metrics.py", "test_security.py",
         "test_speculative.py", "test_stream.py", "test_template.py", "test_tokenize.py", "test_tool_call.py")

# llama-server's flags SpecChat's serve takes, by their llama-server names -> serve's (None: the same name).
SPECCHAT_FLAGS = {"--port": None, "--temp": None, "--seed": None, "--alias": None, "--tags": None,
                  "--ctx-size": "--ctx", "--n-predict": "-n", "--api-key": None, "--reasoning-format": None,
                  "--reasoning": None, "--chat-template": None, "--chat-template-file": None, "--spec-type": None,
                  "--spec-draft-n-max": "--draft-max", "--spec-draft-n-min": "--draft-min", "--threads": "-t",
                  "--batch-size": None}
SPECCHAT_SWITCHES = {"--metrics": "--metrics", "--jinja": "--jinja", "--no-jinja": "--no-jinja",
                     "--verbose": "--verbose", "--slots": "--slots", "--no-slots": "--no-slots"}
MODEL_FLAGS = {"--model", "-m", "--hf-repo", "-hf", "--hf-file", "-hff", "--model-url", "-mu", "--model-draft", "-md"}
# llama-server's switches that take no value (everything else starting with '-' takes one).
SWITCHES = {"--offline", "--cont-batching", "--embedding", "--reranking", "--metrics", "--kv-unified", "--swa-full",
            "--slots", "--no-slots", "--verbose", "--context-shift", "--no-ui", "--no-models-autoload", "--jinja",
            "--no-jinja", "--no-mmproj", "--no-cache-idle-slots", "--ui-mcp-proxy", "--backend_sampling"}


def _pairs(args: list[str]):
    """llama-server's command line as (flag, value or None)."""
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in SWITCHES or i + 1 == len(args):
            yield flag, None
            i += 1
        else:
            yield flag, args[i + 1]
            i += 2


def specchat_command(args: list[str]) -> list[str]:
    """``specchat serve`` for a llama-server command line: the starter pair, the flags it shares, no others."""
    out = [sys.executable, "-m", "app", "serve", "--pair", "starter"]
    for flag, value in _pairs(args):
        if flag in SPECCHAT_SWITCHES:
            out.append(SPECCHAT_SWITCHES[flag])
        elif flag in SPECCHAT_FLAGS and value is not None:
            out += [SPECCHAT_FLAGS[flag] or flag, value]
    return out


def llama_server_command(binary: str, target: str, draft: str, args: list[str]) -> list[str]:
    """The real llama-server on the starter's files, every other flag as given."""
    out, drafted = [binary, "-m", target], False
    for flag, value in _pairs(args):
        if flag in ("--model-draft", "-md"):
            drafted = True
        elif flag in MODEL_FLAGS or flag == "--offline":
            continue
        else:
            out += [flag] + ([value] if value is not None else [])
    return out + (["-md", draft] if drafted else [])


def as_server(argv: list[str]) -> None:
    """Started by the suite as its llama-server: become the mapped server (exec: the suite kills this pid)."""
    kind, args = argv[0], argv[1:]
    if kind == "specchat":
        cmd = specchat_command(args)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        os.chdir(ROOT)  # (a relative --chat-template-file is the suite's: made absolute below)
    else:
        cmd = llama_server_command(os.environ["PEER_LLAMA_SERVER"], os.environ["PEER_TARGET"],
                                   os.environ["PEER_DRAFT"], args)
        sys.path.insert(0, str(ROOT / "tests"))
        from support.llama_tools import environment

        env = environment()  # weights loaded as SpecChat loads them (no repacking: see llama_tools)
    if "--chat-template-file" in cmd:
        i = cmd.index("--chat-template-file") + 1
        cmd[i] = str(Path(os.environ["PEER_SUITE"], cmd[i]).resolve())
    print("peer:", " ".join(cmd), flush=True)
    os.execvpe(cmd[0], cmd, env)


def prepare(work: Path, kind: str) -> dict:
    """The suite unpacked into ``work``, a wget stub (no network), the starter's files, the launcher script; returns
    the environment the suite runs in."""
    with tarfile.open(SDIST) as tar:  # the suite where it lies (its tests read ../../../models/templates)
        top = tar.getnames()[0].split("/")[0]
        suite = work / "sdist" / top / SUITE
        if not suite.exists():
            wanted = (f"{top}/{SUITE}", f"{top}/{TEMPLATES}")
            tar.extractall(work / "sdist", [m for m in tar.getmembers() if m.name.startswith(wanted)], filter="data")
            (suite / "wget.py").write_text("def download(url, out=None):\n    raise RuntimeError('no network: ' + url)\n")
    home = work / "home"
    env = dict(os.environ, SPECCHAT_HOME=str(home), PEER_SUITE=str(suite))
    sys.path.insert(0, str(ROOT))
    os.environ["SPECCHAT_HOME"] = str(home)
    from app.models import starter

    env.update(PEER_TARGET=str(starter.target_path()), PEER_DRAFT=str(starter.draft_path()))
    if kind == "llama-server":
        sys.path.insert(0, str(ROOT / "tests"))
        from support.llama_server import binary

        env["PEER_LLAMA_SERVER"] = str(binary())
    launcher = work / f"llama-server-{kind}"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} as-server {kind} \"$@\"\n")
    launcher.chmod(0o755)
    env["LLAMA_SERVER_BIN_PATH"] = str(launcher)
    env.pop("SPECCHAT_API_KEY", None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(kind: str, files: list[str], out: Path, work: Path, extra: list[str], merge: bool = False,
        port: int = 0) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = prepare(work, kind)
    env["PORT"] = str(port or free_port())  # (the suite's default, 8080, is shared by every run on the machine)
    report = work / f"junit-{kind}.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "not slow", "-p", "no:cacheprovider", "-q", f"--junitxml={report}",
           *[f"unit/{f}" for f in files], *extra]
    subprocess.run(cmd, cwd=env["PEER_SUITE"], env=env)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        results[name] = outcome
    if merge and out.exists():  # this run's tests replace theirs in an earlier run's results
        results = {**json.loads(out.read_text())["results"], **results}
    out.write_text(json.dumps({"server": kind, "results": results}, indent=1))
    print(f"{kind}: {sum(v == 'passed' for v in results.values())} of {len(results)} passed; written to {out}")
    return results


def compare(llama_file: Path, specchat_file: Path) -> None:
    """A markdown table of passes per file, and the tests llama-server passes that SpecChat does not."""
    a = json.loads(llama_file.read_text())["results"]
    b = json.loads(specchat_file.read_text())["results"]
    files = sorted({n.split("::")[0] for n in a} | {n.split("::")[0] for n in b})
    print("| file | tests | llama-server | SpecChat |\n|---|---|---|---|")
    for f in files:
        names = [n for n in a if n.startswith(f + "::")]
        print(f"| {f} | {len(names)} | {sum(a[n] == 'passed' for n in names)} | "
              f"{sum(b.get(n) == 'passed' for n in names)} |")
    print(f"| all | {len(a)} | {sum(v == 'passed' for v in a.values())} | "
          f"{sum(b.get(n) == 'passed' for n in a)} |\n")
    for n in sorted(n for n in a if a[n] == "passed" and b.get(n) != "passed"):
        print(f"- {n}: {b.get(n, 'not run')}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["as-server"]:
        as_server(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the suite against one server")
    r.add_argument("--server", choices=("specchat", "llama-server"), required=True)
    r.add_argument("--files", nargs="+", default=list(FILES),
                   help="files of the suite, or single tests (test_template.py::test_date_inside_prompt)")
    r.add_argument("--port", type=int, default=0, help="the port the suite's servers listen on (default: a free one)")
    r.add_argument("--json", type=Path, required=True, help="where to write the results")
    r.add_argument("--work", type=Path, default=Path("/tmp/specchat-peer"), help="the suite's folder")
    r.add_argument("--merge", action="store_true", help="update the results in --json instead of replacing them")
    r.add_argument("pytest_args", nargs="*", help="more for pytest (after --)")
    c = sub.add_parser("compare", help="the table of two runs")
    c.add_argument("llama_server", type=Path)
    c.add_argument("specchat", type=Path)
    args = p.parse_args(argv)
    if args.command == "run":
        run(args.server, args.files, args.json, args.work, args.pytest_args, args.merge, args.port)
    else:
        compare(args.llama_server, args.specchat)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
