"""Hostile schemas, grammars and tool definitions (deep $ref chains, thousands of chained rules, nesting, size)
never crash the process: each is refused with the limit named, or compiled; the limits' own edges compile. Whatever
could crash runs in a child process here (a regression fails a test, it does not kill pytest): the compilations,
a server answering hostile bodies and then a normal request, and the CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.servers import free_port

from app.engine import grammar_limits as limits
from app.engine import grammar_sandbox as sandbox

HERE = Path(__file__).resolve().parent


# --- shapes ----------------------------------------------------------------------------------------------------
def ref_chain(n: int) -> dict:
    """The issue's: n definitions, each an object whose one property refers to the next."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{n}": {"type": "string"}}}


def alias_chain(n: int) -> dict:
    """n bare aliases: {"$ref": next} (levels: n + 2)."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{n}": {"type": "string"}}}


def tool_params(n: int) -> dict:
    """A tool's parameters whose one argument chains n $defs."""
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": ref_chain(n)["$defs"]}


def nested(n: int, key: str) -> dict:
    """n levels of objects (key "properties"), arrays ("items") or anyOf ("anyOf"), no $ref."""
    s: dict = {"type": "integer"}
    for _ in range(n):
        s = {"properties": {"type": "object", "properties": {"x": s}}, "items": {"type": "array", "items": s},
             "anyOf": {"anyOf": [s, {"type": "null"}]}}[key]
    return s


def rule_chain(n: int, lark: bool = False) -> str:
    """n rules, each the next one (GBNF or Lark): n + 2 rule definitions."""
    if lark:
        return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "a"\n'
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "a"\n'


def parens(n: int, open_: str = "(", close: str = ")", lark: bool = False) -> str:
    return ("start: " if lark else "root ::= ") + open_ * n + '"a"' + close * n + "\n"


# (id, how it is compiled, what it is made from, words its refusal must hold: None = it compiles)
CASES = [
    ("ref-chain-2000", "schema", lambda: ref_chain(2000), ["6002 levels deep following its $refs",
                                                           "chain of 2001 $refs", "at most 1000"]),
    ("alias-chain-5000", "schema", lambda: alias_chain(5000), ["5002 levels deep following its $refs"]),
    ("alias-chain-just-over", "schema", lambda: alias_chain(999), ["1001 levels deep", "at most 1000"]),
    ("alias-chain-at-limit", "schema", lambda: alias_chain(998), None),  # (34 KB: checked in a child first)
    ("ref-chain-300", "schema", lambda: ref_chain(300), None),
    ("nested-objects-2000", "schema", lambda: nested(2000, "properties"), ["nests 4001 levels deep", "at most 64"]),
    ("nested-arrays-at-limit", "schema", lambda: nested(63, "items"), None),
    ("nested-arrays-just-over", "schema", lambda: nested(64, "items"), ["nests 65 levels deep", "at most 64"]),
    ("nested-anyof-3000", "schema", lambda: nested(3000, "anyOf"), ["nests 6001 levels deep"]),
    ("schema-text-100000-deep", "schema", lambda: '{"items": ' * 100_000 + "{}" + "}" * 100_000,
     ["nests too deep to read", "at most 64"]),
    ("wide-schema-1.2MB", "schema", lambda: {"type": "object", "properties": {
        f"property_{i:06}": {"type": "string"} for i in range(40_000)}}, ["characters long as JSON",
                                                                         "at most 1,000,000"]),
    ("recursive-tree", "schema", lambda: {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}, None),
    ("gbnf-5000-rules", "gbnf", lambda: rule_chain(5000), ["5,002 rules", "at most 2,000"]),
    ("gbnf-rules-just-over", "gbnf", lambda: rule_chain(1999), ["2,001 rules"]),
    ("gbnf-rules-at-limit", "gbnf", lambda: rule_chain(1998), None),
    ("lark-3000-rules", "gbnf", lambda: rule_chain(3000, lark=True), ["3,002 rules"]),
    ("gbnf-parens-50000", "gbnf", lambda: parens(50_000), ["nests brackets 50000 deep", "at most 32"]),
    ("gbnf-parens-25", "gbnf", lambda: parens(25), None),
    ("lark-optional-100", "gbnf", lambda: parens(100, "[", "]", lark=True), ["nests brackets 100 deep"]),
    ("gbnf-long-alternation", "gbnf", lambda: "root ::= " + " | ".join(f'"w{i}"' for i in range(60_000)),
     ["characters long", "at most 500,000"]),
    ("gbnf-alternation-20000", "gbnf", lambda: "root ::= " + " | ".join(f'"w{i}"' for i in range(20_000)), None),
    ("lark-regex-5000-parens", "gbnf", lambda: "start: /" + "(" * 5000 + "a" + ")" * 5000 + "/", ["invalid regex"]),
    # past every Python bound (tool grammars are ours): the child checking it crashes, not this process
    ("tool-grammar-10000-defs", "tools", lambda: "start: %json " + json.dumps(tool_params(10_000)),
     ["llguidance crashed compiling it (SIGSEGV)"]),
    ("tool-grammar-800-defs", "tools", lambda: "start: %json " + json.dumps(tool_params(800)), None),
    # a Grammar made without its checks, given to a generation's matcher
    ("matcher-30000-rules", "matcher", lambda: rule_chain(30_000, lark=True), ["llguidance crashed"]),
    ("matcher-alias-chain-998", "matcher-schema", lambda: alias_chain(998), None),
]


def _compile(kind: str, value, model_path: str) -> None:
    """What the app does with it (in the child)."""
    from app.engine.grammar import Grammar

    if kind == "schema":
        Grammar.json_schema(value)
    elif kind == "gbnf":
        Grammar.gbnf(value)
    elif kind == "tools":
        Grammar.lark(value, "tools")
    else:
        from llguidance import LLMatcher

        from app.engine.constraint import Constraint
        from app.engine.llama import Model

        definition = (Grammar.json_schema(value).definition if kind == "matcher-schema"
                      else LLMatcher.grammar_from_lark(value))
        Constraint(Grammar(definition, "lark"), Model(model_path, vocab_only=True))


def child_main(model_path: str) -> None:
    """Compile every case in turn, one JSON line each (run as a child: a crash ends the lines)."""
    from app.engine.errors import EngineError

    for name, kind, make, _ in CASES:
        try:
            _compile(kind, make(), model_path)
            print(json.dumps({"id": name, "error": None}), flush=True)
        except EngineError as exc:
            print(json.dumps({"id": name, "error": str(exc)}), flush=True)


@pytest.fixture(scope="module")
def verdicts(models):
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_hostile_grammars as t; "
            "t.child_main(sys.argv[1])")
    r = subprocess.run([sys.executable, "-c", code, str(models["target"])], capture_output=True, text=True,
                       timeout=900)
    found = {row["id"]: row["error"] for row in map(json.loads, r.stdout.splitlines())}
    return found, r


@pytest.mark.parametrize("name, kind, make, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_naming_the_limit_or_compiles(verdicts, name, kind, make, words):
    found, r = verdicts
    assert name in found, f"the process compiling it died (status {r.returncode}): {r.stderr[-2000:]}"
    if words is None:
        assert found[name] is None, found[name]
    else:
        assert found[name] is not None, "compiled, but should have been refused"
        for w in words:
            assert w in found[name], found[name]


# --- the limits' arithmetic (pure Python) ----------------------------------------------------------------------
def test_depth_and_ref_levels_are_measured_without_recursing():
    assert limits.json_depth(nested(100_000, "items")) == 100_001  # (no RecursionError)
    assert limits.ref_levels(alias_chain(50_000)) == (50_002, 50_001)
    assert limits.ref_levels({"type": "string"}) == (1, 0)
    # a $ref back into its own path ends it: a recursive schema is shallow
    tree = {"$ref": "#", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    assert limits.ref_levels(tree)[0] <= 4
    # refs into the document itself (JSON pointer escapes), and refs that resolve to nothing
    doc = {"properties": {"a/b": {"type": "object", "properties": {"c": {"$ref": "#/properties/a~1b"}}},
                          "d": {"$ref": "#/nowhere"}, "e": {"$ref": "other.json#/x"}}}
    assert limits.ref_levels(doc)[0] == 5


def test_brackets_in_strings_classes_regexes_and_comments_do_not_count():
    assert limits.bracket_depth('root ::= ( "((((" [(((] ) # (((((\n', lark=False) == 1
    assert limits.bracket_depth('start: ["a" /((((a))))/ "[[[["] // [[[[\n', lark=True) == 1
    assert limits.bracket_depth('start: x\nx: ("\\"(" (("a")))', lark=True) == 3


def test_a_normal_request_never_starts_a_child(monkeypatch):
    """Small definitions are compiled in this process (on the big stack), and a verdict is cached."""
    from app.engine.grammar import Grammar

    monkeypatch.setattr(sandbox, "_in_child", lambda d, fork=None: pytest.fail("a child was started"))
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
        "$ref": "#/$defs/tag"}}}, "$defs": {"tag": {"enum": ["a", "b"]}}}
    Grammar.json_schema(schema)
    Grammar.gbnf('root ::= "yes" | "no"')
    assert sandbox.verdict(Grammar.json_schema(schema).definition) == ""


def test_a_child_that_crashes_or_runs_out_of_time_is_a_verdict_not_a_crash(monkeypatch):
    """Both ways to run the child (a fresh interpreter; a fork, as a frozen bundle must). The crash is the child's:
    this process only reads its status."""
    from llguidance import LLMatcher

    crashing = LLMatcher.grammar_from_lark(rule_chain(30_000, lark=True))
    for fork in (False, True):
        answer, lasting = sandbox._in_child(crashing, fork=fork)
        assert "llguidance crashed compiling it (SIGSEGV)" in answer and lasting
        assert sandbox._in_child(LLMatcher.grammar_from_lark(rule_chain(10, lark=True)), fork=fork) == ("", True)
    monkeypatch.setattr(sandbox, "CHILD_TIMEOUT_S", 0.001)
    slow = LLMatcher.grammar_from_lark(rule_chain(1500, lark=True))
    for fork in (False, True):
        assert sandbox._in_child(slow, fork=fork) == ("checking it took longer than 0.001 s", False)
    before = dict(sandbox._verdicts)
    assert sandbox.verdict(slow).startswith("checking it took longer")
    assert dict(sandbox._verdicts) == before  # (not cached: next time it may answer in time)


# --- the API: hostile bodies get 400s, and the server answers the next request ---------------------------------
BIG_TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d", "parameters": {
    "type": "object", "properties": {f"argument_{j}": {"type": "string", "description": "an argument " * 5}
                                     for j in range(12)}}}} for i in range(30)]
HOSTILE = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ref_chain(2000)}}},
     "response_format", "invalid_schema", "following its $refs"),
    # (81 levels: under the 100 a request body may nest, over the schema's 64)
    ({"json_schema": nested(40, "properties")}, "json_schema", "invalid_schema", "nests 81 levels deep"),
    ({"response_format": {"type": "json_object", "schema": alias_chain(3000)}}, "response_format",
     "invalid_schema", "at most 1000"),
    ({"grammar": rule_chain(5000)}, "grammar", "invalid_grammar", "5,002 rules"),
    ({"grammar": parens(50_000)}, "grammar", "invalid_grammar", "nests brackets"),
    ({"grammar": rule_chain(3000, lark=True)}, "grammar", "invalid_grammar", "3,002 rules"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": tool_params(3000)}}]}, "tools",
     "invalid_schema", "tools[0].function.parameters nests"),
]


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    """`specchat serve` on the tiny models, a process of its own (were it to crash, the test says so)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPECCHAT_API_KEY"}
    env.update(SPECCHAT_HOME=str(tmp_path_factory.mktemp("hostile-home")), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--target", str(models["target"]), "--draft",
                             str(models["draft"]), "--ctx", "512", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    while (line := proc.stdout.readline()) and "running at" not in line:
        lines.append(line)
    assert proc.poll() is None, "".join(lines)
    yield f"http://127.0.0.1:{port}/v1", proc
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out


def _normal(url: str) -> None:
    r = httpx.post(f"{url}/completions", json={"prompt": "the cat", "max_tokens": 4}, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text


@pytest.mark.parametrize("extra, param, code, words", HOSTILE, ids=[f"{h[1]}-{h[3]}" for h in HOSTILE])
def test_a_hostile_body_is_a_400_naming_the_limit_and_the_next_request_is_answered(server, extra, param, code,
                                                                                    words):
    url, proc = server
    r = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 4, **extra}, timeout=120)
    assert proc.poll() is None, "the server died"
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == code and words in error["message"], error
    _normal(url)


def test_a_large_tool_set_is_compiled_in_a_child_and_the_server_goes_on(server):
    """30 tools make a tool grammar past the in-process size: checked in a child (then cached). It compiles, so
    the request gets as far as the context check (their description is longer than the tiny model's context)."""
    url, proc = server
    for _ in range(2):
        r = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "go"}],
                                                        "max_tokens": 8, "tools": BIG_TOOLS}, timeout=120)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert proc.poll() is None
    _normal(url)


# --- the CLI: one clear line, a non-zero exit --------------------------------------------------------------------
@pytest.mark.parametrize("flag, content, words", [
    ("--json-schema-file", json.dumps(ref_chain(2000)), "following its $refs"),
    ("--json-schema-file", '{"items": ' * 100_000 + "{}" + "}" * 100_000, "nests too deep to read"),
    ("--grammar-file", rule_chain(5000), "5,002 rules"),
])
def test_the_cli_refuses_in_one_line(models, tmp_path, flag, content, words):
    path = tmp_path / "hostile"
    path.write_text(content)
    r = subprocess.run([sys.executable, "-m", "app", "generate", "--target", str(models["target"]), "--prompt", "x",
                        flag, str(path)], capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert lines[0].startswith("specchat: error: ") and words in lines[0], lines[0]
