"""The ``specchat`` command line, run as a user runs it (a subprocess)."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(r, words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert words in lines[0], lines[0]


def test_console_script_is_installed():
    """pip install . provides `specchat` beside the interpreter (the venv's bin/), and it runs."""
    script = Path(sys.executable).parent / "specchat"
    assert script.is_file(), "pip install . must provide the `specchat` command"
    r = subprocess.run([str(script), "generate", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--draft-max" in r.stdout


def test_generate_json_reports_measured_fields(models):
    r = cli("generate", "--target", models["target"], "--draft", models["draft"], "--prompt", "the cat",
            "--max-tokens", 40, "--draft-max", 4, "--draft-p-min", 0, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("text", "token_ids", "n_tokens", "n_drafted", "n_accepted", "acceptance_rate",
                "tokens_per_second", "time_to_first_token_s", "decode_seconds", "finish_reason", "drafter"):
        assert key in d
    assert d["n_tokens"] == len(d["token_ids"]) == 40 and d["finish_reason"] == "length"
    assert d["drafter"] == "model" and d["n_drafted"] > 0
    assert d["acceptance_rate"] == pytest.approx(d["n_accepted"] / d["n_drafted"])
    assert d["tokens_per_second"] > 0 and d["decode_seconds"] > 0
    plain = json.loads(cli("generate", "--target", models["target"], "--drafter", "none", "--prompt", "the cat",
                           "--max-tokens", 40, "--json").stdout)
    assert plain["token_ids"] == d["token_ids"] and plain["n_drafted"] == 0


def test_llama_cpp_flag_names_mean_the_same(models):
    """llama.cpp's current names (--spec-type, --spec-draft-*) work beside the older --draft-max family."""
    common = ["--target", models["target"], "--prompt", "the cat", "--max-tokens", 30, "--json"]
    old = json.loads(cli("generate", *common, "--draft", models["draft"], "--drafter", "model", "--draft-max", 3,
                         "--draft-min", 1, "--draft-p-min", 0, "--no-adaptive").stdout)
    new = cli("generate", *common, "--spec-draft-model", models["draft"], "--spec-type", "draft-simple",
              "--spec-draft-n-max", 3, "--spec-draft-n-min", 1, "--spec-draft-p-min", 0, "--no-adaptive")
    assert new.returncode == 0, new.stderr
    new = json.loads(new.stdout)
    assert new["drafter"] == old["drafter"] == "model" and new["n_drafted"] > 0
    assert new["token_ids"] == old["token_ids"]
    assert new["n_drafted"] == old["n_drafted"] and new["n_accepted"] == old["n_accepted"]  # same draft lengths
    lookup = json.loads(cli("generate", *common, "--spec-type", "ngram-mod").stdout)
    assert lookup["drafter"] == "ngram-mod" and lookup["token_ids"] == old["token_ids"]


def test_a_draft_of_another_vocabulary_drafts_as_text_and_check_explains_it(models):
    args = ["--target", models["target"], "--prompt", "the cat", "--max-tokens", 40, "--json"]
    cross = cli("generate", *args, "--draft", models["other_text"], "--draft-p-min", 0)
    assert cross.returncode == 0, cross.stderr
    d, plain = json.loads(cross.stdout), json.loads(cli("generate", *args, "--drafter", "none").stdout)
    assert d["token_ids"] == plain["token_ids"] and d["drafter"] == "model (as text)" and d["n_drafted"] > 0
    check = cli("check", "--target", models["target"], "--draft", models["other_text"])
    assert check.returncode == 0 and "different vocabularies: drafted as text" in check.stdout


def test_generate_streams_text_then_a_summary(models):
    r = cli("generate", "--target", models["target"], "--prompt", "the cat", "--max-tokens", 20)
    assert r.returncode == 0, r.stderr
    *text, summary = r.stdout.rstrip("\n").split("\n")
    assert summary.startswith("[20 tokens") and "tok/s" in summary and "drafter ngram" in summary


def test_prompt_file_and_chat(models, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("the dog ran")
    r = cli("generate", "--target", models["target"], "--prompt-file", f, "--chat", "--system", "be brief",
            "--max-tokens", 10, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_tokens"] == 10


@pytest.mark.parametrize("args,words", [
    (["--target", "missing.gguf", "--prompt", "x"], "not found"),
    (["--prompt", "x"], "Choose models"),
    (["--target", "{target}", "--prompt", "x", "--temperature", "-1"], "temperature"),
    (["--target", "{target}", "--prompt", "x", "--top-p", "2"], "top-p"),
    (["--target", "{target}", "--prompt", "x", "--draft-max", "100"], "draft-max"),
    (["--target", "{target}", "--prompt", "x", "--max-tokens", "0"], "max-tokens"),
    (["--target", "{target}", "--prompt", "x", "--ctx", "-5"], "context size"),
    (["--target", "{target}", "--prompt", "x", "--drafter", "model"], "needs a draft model"),
    (["--target", "{target}", "--prompt", "x" * 3000, "--ctx", "256"], "but the context holds"),
    (["--target", "{target}"], "--prompt"),
    (["--target", "{target}", "--prompt-file", "nowhere.txt"], "Cannot read the prompt file"),
    (["--pair", "nosuchpair", "--prompt", "x"], "Unknown pair"),
    (["--target", "{target}", "--prompt", "x", "--temperature", "hot"], "invalid float value"),
    (["--target", "{target}", "--prompt", "x", "--spec-type", "draft-dflash"], "needs a DFlash block draft"),
    (["--target", "{target}", "--draft", "{draft}", "--prompt", "x", "--spec-type", "draft-dspark"],
     "This pair has no DSpark block draft"),
    (["--target", "{target}", "--prompt", "x", "--spec-type", "draft-mtp,ngram-mod"], "no MTP"),
    (["--target", "{target}", "--prompt", "x", "--drafter", "ngram,ngram-longest"], "same drafter twice"),
    (["--target", "{target}", "--prompt", "x", "--spec-ngram-mod-n-match", "0"], "--spec-ngram-mod-n-match 0"),
    (["--target", "{target}", "--prompt", "x", "--spec-type", "eagle"], "Unknown speculative type 'eagle'"),
    (["--target", "{target}", "--prompt", "x", "--spec-draft-n-max", "100"], "draft-max"),
    (["--target", "{target}", "--prompt", "x", "-j", '{{"type": "strnig"}}'], "strnig"),
    (["--target", "{target}", "--prompt", "x", "--grammar", "root ::= x", "-j", "{{}}"], "not both"),
    (["--target", "{target}", "--prompt", "x", "--grammar-file", "nowhere.gbnf"], "Cannot read the --grammar-file"),
])
def test_bad_input_is_one_clear_line(models, args, words):
    args = [a.format(**{k: str(v) for k, v in models.items()}) for a in args]
    assert_one_line_error(cli("generate", *args), words)


def test_bad_files_are_one_clear_line(models, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a model")
    assert_one_line_error(cli("generate", "--target", junk, "--prompt", "x"), "not a GGUF file")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(models["target"].read_bytes()[:20000])
    assert_one_line_error(cli("generate", "--target", cut, "--prompt", "x"), "truncated")


def test_bench_reports_off_vs_on(models, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat", "category": "a", "chat": false}\n'
                       '{"prompt": "a dog ran", "category": "b"}\n')
    r = cli("bench", "--target", models["target"], "--draft", models["close_draft"], "--prompts", prompts,
            "--max-tokens", 48, "--draft-p-min", 0, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep["categories"]) == {"a", "b"}
    for row in rep["prompts"]:
        assert row["identical"] and row["tps_off"] > 0 and row["tps_on"] > 0
        assert row["speedup"] == pytest.approx(row["tps_on"] / row["tps_off"])
        assert row["acceptance"] > 0 and row["mean_accepted_per_round"] > 0
    assert rep["overall"]["all_identical"] and rep["overall"]["n_prompts"] == 2
    o = rep["overall"]
    assert o["draft_ms_per_token"] > 0 and o["verify_ms_per_token"] > 0
    assert o["draft_ms_per_token"] + o["verify_ms_per_token"] <= o["ms_per_token_on"] * 1.001
    # the round's costs were timed (default --draft-max 8: batches up to 9) and give the ceiling
    assert set(rep["costs"]["verify_ms"]) == {"1", "2", "4", "8", "9"}
    assert all(v > 0 for v in rep["costs"]["verify_ms"].values())
    assert all(v > 0 for v in rep["costs"]["draft_ms"].values())
    ceiling = rep["ceiling"]
    assert ceiling["speedup"] >= 1.0 and 0 <= ceiling["draft_length"] <= 8
    assert ceiling["reached"] == pytest.approx(o["speedup"] / ceiling["speedup"])
    text = cli("bench", "--target", models["target"], "--draft", models["close_draft"], "--prompts", prompts,
               "--max-tokens", 16)
    assert text.returncode == 0 and "OVERALL" in text.stdout and "speedup" in text.stdout
    assert "costs timed between prompts: plain step" in text.stdout
    assert "ceiling if every draft token were accepted" in text.stdout
    assert re.search(r"This pair can reach at most \d+\.\d\dx here|Drafting cannot pay with this pair here", text.stdout)
    assert ceiling["explanation"] and 0 < ceiling["draft_cost"] and 0 <= ceiling["position_cost"]
    ngram = cli("bench", "--target", models["target"], "--drafter", "ngram", "--prompts", prompts,
                "--max-tokens", 16, "--json")
    assert ngram.returncode == 0, ngram.stderr
    rep = json.loads(ngram.stdout)
    assert rep["ceiling"] is None and "draft_ms" not in rep["costs"]


def test_bench_rejects_bad_prompt_files(models, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "x"}\n')
    assert_one_line_error(cli("bench", "--target", models["target"], "--prompts", bad), "prompt")


def test_generate_follows_a_json_schema_as_llama_cli_does(tmp_path):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
              "additionalProperties": False}
    path = tmp_path / "city.json"
    path.write_text(json.dumps(schema))
    r = cli("generate", "--pair", "starter", "--chat", "-p", "Name a city as JSON.", "-jf", path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(json.loads(d["text"])) == {"city"} and d["finish_reason"] == "stop"
    assert 0 < d["n_forced_accepted"] <= d["n_forced"] <= d["n_drafted"]


def test_bench_under_json_schemas_compares_plain_constrained_decoding_with_forced_tokens_and_drafting(tmp_path):
    lines = (Path(__file__).parent / "prompts" / "json.jsonl").read_text().splitlines()
    prompts = tmp_path / "json.jsonl"
    prompts.write_text("\n".join(lines[:2]) + "\n")
    r = cli("bench", "--pair", "starter", "--drafter", "ngram", "--prompts", prompts, "--max-tokens", 96, "--json")
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)["overall"]
    assert o["all_identical"] and o["n_prompts"] == 2 and o["tps_off"] > 0 and o["tps_on"] > 0
    assert 0 < o["forced_accepted"] <= o["forced"]  # the schemas' keys and punctuation were drafted and verified
    assert o["grammar_us_per_token_off"] > 0 and o["grammar_us_per_token_on"] > 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "json_schema": {"type": "strnig"}}\n')
    assert_one_line_error(cli("bench", "--pair", "starter", "--prompts", bad), "bad.jsonl:1")


@pytest.mark.slow
def test_starter_pair_from_the_catalog():
    r = cli("generate", "--pair", "starter", "--chat", "--prompt", "What is 2+2?", "--max-tokens", 24, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["drafter"] == "model" and d["n_tokens"] > 0 and d["n_drafted"] > 0 and d["text"].strip()


def test_chat_in_the_terminal(models):
    r = subprocess.run([sys.executable, "-m", "app", "chat", "--target", str(models["target"]), "--max-tokens", "8"],
                       input="the cat sat\n/continue\n/reset\n/continue\nand the dog?\n", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("[8 tokens") == 3  # two answers and one continued, each run with its stats line
    assert r.stderr.count("Nothing to continue yet") == 1  # (after /reset: no answer to go on with)
    assert "Traceback" not in r.stderr


class Terminal:
    """A program on a pseudo-terminal, typed at as a person types (keys, arrows, Enter), its screen read back."""

    def __init__(self, argv, env):
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.screen = ""

    def wait_for(self, text, count=1, timeout=120):
        import select
        import time

        deadline = time.monotonic() + timeout
        while self.screen.count(text) < count:
            assert time.monotonic() < deadline, f"no {text!r} on the screen:\n{self.screen}"
            if select.select([self.master], [], [], 1)[0]:
                try:
                    self.screen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # (the program ended)
                    raise AssertionError(f"ended before {text!r}:\n{self.screen}") from None

    def type(self, keys):
        os.write(self.master, keys.encode())


def test_terminal_chat_edits_lines_recalls_them_and_answers_commands(models, tmp_path):
    """Typed on a real terminal: the arrows edit the line (readline), Up recalls an earlier message, /help and an
    unknown command are answered by the chat itself and never reach the model, and the history outlives the chat."""
    term = Terminal([sys.executable, "-m", "app", "chat", "--target", str(models["target"]), "--max-tokens", "8"],
                    env={**os.environ, "SPECCHAT_HOME": str(tmp_path), "TERM": "xterm"})
    try:
        left = "\x1b[D"
        term.wait_for("> ")
        term.type("the dog" + left * 3 + "big \r")  # typed "the dog", moved back before "dog", inserted "big "
        term.wait_for("[8 tokens")
        term.wait_for("> ", 2)
        term.type("/help\r")
        term.wait_for("/reset")
        term.type("/nope\r")
        term.wait_for("Unknown command /nope")
        term.type("\x1b[A" * 3 + "\r")  # Up three times: back past /nope and /help to the first message
        term.wait_for("[8 tokens", 2)
        term.type("/quit\r")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.proc.kill()
        os.close(term.master)
    assert "Traceback" not in term.screen
    assert term.screen.count("[8 tokens") == 2  # two answers: the commands were not sent
    history = (tmp_path / "data" / "chat_history").read_text().splitlines()
    assert history.count("the big dog") == 2 and "/help" in history, history


@pytest.mark.parametrize("args,words", [
    (["--port", "70000"], "Invalid --port"),
    (["--pair", "nosuchpair"], "Unknown pair"),
    (["--target", "missing.gguf"], "not found"),
    (["--draft-max", "100"], "draft-max"),
    (["--drafter", "magic"], "Unknown drafter 'magic'"),
])
def test_app_bad_flags_are_one_clear_line(args, words, tmp_path):
    """Plain `specchat` (the app) refuses bad flags before serving anything."""
    r = subprocess.run([sys.executable, "-m", "app", *args, "--no-browser"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "SPECCHAT_HOME": str(tmp_path)})
    assert_one_line_error(r, words)


@pytest.mark.parametrize("args,words", [
    (["--port", "0"], "Invalid --port"),
    (["--pair", "nosuchpair"], "Unknown pair"),
    (["--target", "missing.gguf"], "not found"),
    (["--draft-max", "-1"], "draft-max"),
])
def test_serve_bad_flags_are_one_clear_line(args, words, tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "serve", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SPECCHAT_HOME": str(tmp_path)})
    assert_one_line_error(r, words)


def test_serve_on_the_network_makes_up_a_key_and_only_no_auth_serves_openly(models, tmp_path):
    """`--listen` without --api-key prints a random key that /v1 then requires; `--no-auth` serves without one but
    says plainly that anyone on the network may use it; with --api-key neither."""
    import httpx

    env = {k: v for k, v in os.environ.items() if k != "SPECCHAT_API_KEY"}
    env.update(SPECCHAT_HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    for extra, made_up, warned in (([], True, False), (["--no-auth"], False, True), (["--api-key", "k"], False, False)):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--target", str(models["target"]), "--listen",
                                 "--port", str(port), *extra], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = []
        while (line := proc.stdout.readline()) and "running at" not in line:
            lines.append(line)
        if made_up:
            key_line = proc.stdout.readline()
            lines.append(key_line)
            key = key_line.split("the key for this session is ")[1].split()[0]
            models_url = f"http://127.0.0.1:{port}/v1/models"
            assert httpx.get(models_url, timeout=30).status_code == 401
            assert httpx.get(models_url, headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code == 200
        proc.send_signal(signal.SIGINT)
        out = "".join(lines) + line + proc.communicate(timeout=30)[0]
        assert proc.returncode == 0, out
        assert ("serves to your whole network and nobody needs a key" in out) is warned, out
        assert ("the key for this session is" in out) is made_up, out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
