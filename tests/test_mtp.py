"""Drafting with a model's own MTP layer (--drafter mtp) on a tiny Qwen3.5 (hybrid: gated DeltaNet + attention)
that carries one, written by tiny_recurrent: what MTP alone does (the drafter by default in the CLI, the app and the
API; hidden states kept bounded; the pair check and a catalog pair with no draft file), the MTP layer in a side file
(convert_hf_to_gguf.py --mtp: found beside the model, on the Hub, in the catalog) and clear errors. Exact greedy
output, the target's distribution when sampling, prefix reuse across turns and grammars: test_heads.py, as for every
head."""
import json

import pytest

from app.engine import Engine, EngineError, GenerationParams, ModelSettings
from app.engine.llama.heads import Capture
from app.prompts import chat_tokens
from support.heads import HEADS, drafted, run


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    return HEADS["mtp"].write(tmp_path_factory.mktemp("mtp"))[0]


@pytest.fixture(scope="module")
def engine(mtp_path):
    e = Engine(ModelSettings(mtp_path, n_ctx=1024))
    yield e
    e.close()



def test_the_model_reports_its_mtp_layer(engine):
    assert engine.model.n_nextn == 1


def test_a_model_without_mtp_layers_is_refused_clearly(models):
    e = Engine(ModelSettings(models["target"], n_ctx=128))
    try:
        with pytest.raises(EngineError, match="no MTP"):
            list(e.generate([1, 300, 301], GenerationParams(max_tokens=4), "mtp"))
        assert run(e, [1, 300, 301], "none", max_tokens=4).token_ids  # and the engine still serves
    finally:
        e.close()


def test_hidden_states_stay_bounded_while_another_drafter_runs(engine, monkeypatch):
    """The target keeps hidden states for the MTP layer from the first MTP draft on; with speculation off they are
    not consumed, so the oldest go (and MTP drafting afterwards is still exact)."""
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat"}])
    ctx = engine.target.ctx
    monkeypatch.setattr(Capture, "MAX_BYTES", 4 * engine.model.n_embd * ctx.n_batch)
    engine.reset()
    run(engine, ids, "mtp", max_tokens=8)
    plain = run(engine, ids, "none", max_tokens=600)
    assert len(ctx.captures[0].rows) <= ctx.n_batch < len(ids) + 600
    # The same conversation goes on with MTP: the MTP cache holds the first positions, the states after them are
    # gone, so it starts over from the ones kept (positions must follow each other in llama.cpp's cache)
    longer = ids + plain.token_ids
    spec = run(engine, longer, "mtp", max_tokens=40, draft_max=4, draft_p_min=0.0)
    assert spec.stats.prompt_cached > 0 and spec.stats.n_drafted > 0
    engine.reset()
    assert run(engine, longer, "none", max_tokens=40).token_ids == spec.token_ids
    assert run(engine, ids, "mtp", max_tokens=600, draft_max=4, draft_p_min=0.0).token_ids == plain.token_ids


def test_the_cli_drafts_with_mtp_by_default_for_a_model_that_has_it(mtp_path):
    """No draft model given and the target carries an MTP layer: the CLI drafts with it, output as plain."""
    from test_cli import cli

    args = ("generate", "--target", mtp_path, "--temperature", "0", "-n", "48", "--json", "--prompt", "the cat sat")
    default, plain = cli(*args), cli(*args, "--drafter", "none")
    assert default.returncode == 0 and plain.returncode == 0, default.stderr + plain.stderr
    default, plain = json.loads(default.stdout), json.loads(plain.stdout)
    assert default["drafter"] == "mtp" and default["n_drafted"] > 0
    assert default["token_ids"] == plain["token_ids"]


def test_a_pair_with_mtp_layers_offers_mtp_by_default(engine):
    """A model with MTP layers and no draft model: MTP first among what it can use; a choice it cannot use falls back
    to it, a choice it can use is kept."""
    from app.chat.settings import Settings

    assert engine.drafters == ("mtp", "ngram", "suffix", "none")
    assert Settings(drafter="model").for_pair(None, engine.drafters).drafter == "mtp"
    assert Settings(drafter="ngram").for_pair(None, engine.drafters).drafter == "ngram"
    assert Settings(drafter="mtp").for_pair(None, ("model", "ngram", "none")).drafter == "model"
    assert Settings(drafter="mtp").for_pair(None, ("ngram", "none")).drafter == "ngram"


def test_the_api_drafts_with_mtp_by_default_and_by_llama_server_names(mtp_path):
    """/v1 on an MTP model: the model list says how it speculates; a request leaving the drafter out, one naming it
    llama-server's way ("speculative.type": "draft-mtp") and one with speculation off give the same greedy text,
    the first two with drafted tokens verified. A type SpecChat lacks is a 400 and the server keeps serving."""
    import httpx
    from support.servers import serve_in_thread

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(mtp_path), ctx=1024))
    try:
        with serve_in_thread(lambda port: ApiServer(rt).app()) as url:
            listed = httpx.get(f"{url}/models", timeout=30).json()["data"][0]
            assert listed["speculation"] == "MTP (1 layer of the model's own)"
            ask = lambda **extra: httpx.post(f"{url}/completions", timeout=120, json={  # noqa: E731
                "prompt": "the cat sat", "max_tokens": 48, "temperature": 0, **extra}).json()
            default, named, off = ask(), ask(**{"speculative.type": "draft-mtp"}), ask(**{"speculative.n_max": 0})
            assert default["choices"][0]["text"] == named["choices"][0]["text"] == off["choices"][0]["text"]
            assert default["timings"]["draft_n"] > 0 and named["timings"]["draft_n"] > 0
            assert off["timings"]["draft_n"] == 0
            bad = httpx.post(f"{url}/completions", timeout=30,
                             json={"prompt": "x", "speculative": {"type": "draft-eagle"}})
            assert bad.status_code == 400 and "Unknown speculative type" in bad.json()["error"]["message"]
            bad = httpx.post(f"{url}/completions", timeout=30, json={"prompt": "x", "drafter": "model"})
            assert bad.status_code == 400 and "has no draft model: choose MTP" in bad.json()["error"]["message"]
            assert ask()["choices"][0]["text"] == off["choices"][0]["text"]
    finally:
        rt.close()


def test_the_pair_check_says_a_model_drafts_for_itself_before_and_after_download(mtp_path, tmp_path):
    """`specchat check` on the file, and `check -hf` on the Hub's copy (its header read with Range requests, nothing
    downloaded): "MTP, 1 head", and no draft needed. The Models tab renders the same line above its drafts."""
    from support.fake_hub import FakeHub, child_env
    from test_cli import cli
    from test_hub import no_traffic_beyond_loopback, specchat

    from app.ui import render

    local = cli("check", "--target", mtp_path)
    assert local.returncode == 0, local.stderr
    assert "this model can draft for itself: MTP, 1 head (--drafter mtp" in local.stdout
    assert "--drafter ngram speculates without one" not in local.stdout

    hub = FakeHub()
    try:
        repo = "tests/Qwen3.5-Tiny-GGUF"
        hub.add(repo, {"Qwen3.5-Tiny-Q8_0.gguf": mtp_path.read_bytes()}, downloads=5)
        env = child_env(hub.url, tmp_path)
        r = specchat(env, "check", "-hf", repo)
        assert r.returncode == 0, r.stderr
        assert "This model can draft for itself: MTP, 1 head" in r.stdout and "No draft found" in r.stdout
        assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.gguf"))
        no_traffic_beyond_loopback(env)
    finally:
        hub.close()
    html = render.hub_drafts(f"{repo}/x.gguf", [], "this model can draft for itself: MTP, 1 head")
    assert "This model can draft for itself: MTP, 1 head." in html and "none is needed" in html


def test_a_catalog_pair_without_a_draft_pulls_one_file_and_drafts_with_its_mtp_layers(mtp_path, tmp_path):
    """A 2026 catalog entry for a model that drafts for itself names no draft: the list says so, a pull fetches the
    target alone (from the local stand-in for the Hub), and the pair generates with MTP, as with speculation off."""
    from support.fake_hub import FakeHub, child_env
    from test_hub import no_traffic_beyond_loopback, specchat

    hub = FakeHub()
    hub.add("tests/qwen35-mtp", {"Qwen3.5-tiny-MTP-Q8_0.gguf": mtp_path.read_bytes()})
    catalog = tmp_path / "models.toml"
    catalog.write_text('[pairs.tiny-mtp]\ndescription = "drafts with its own MTP layer"\nlicense = "test"\n'
                       'target = { repo = "tests/qwen35-mtp", file = "Qwen3.5-tiny-MTP-Q8_0.gguf", '
                       'quantization = "F32", size_gb = 0.001 }\n')
    env = child_env(hub.url, tmp_path, SPECCHAT_MODELS=str(catalog))
    try:
        row = json.loads(specchat(env, "list", "--json").stdout)[0]
        assert row["draft"].startswith("its own MTP layers") and not row["ready"]
        assert "its own MTP layers" in specchat(env, "list").stdout
        pulled = specchat(env, "pull", "tiny-mtp")
        assert pulled.returncode == 0, pulled.stderr
        assert json.loads(specchat(env, "list", "--json").stdout)[0]["ready"]
        args = ("generate", "--pair", "tiny-mtp", "--prompt", "the cat sat", "-n", "32", "--temperature", "0",
                "--json")
        mtp, off = (json.loads(specchat(env, *args, *extra).stdout) for extra in ([], ["--drafter", "none"]))
        assert mtp["drafter"] == "mtp" and mtp["n_drafted"] > 0 and mtp["token_ids"] == off["token_ids"]
        assert "Removed 1 file(s)" in specchat(env, "remove", "tiny-mtp").stdout
        no_traffic_beyond_loopback(env)
    finally:
        hub.close()


# --- The MTP layer in a side file (convert_hf_to_gguf.py --mtp: unsloth's MTP/mtp-*.gguf beside a model without it)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """(trunk, side file): the model of ``mtp_path`` converted without its MTP layer, and that layer alone."""
    from support.heads import write_mtp_split

    return write_mtp_split(tmp_path_factory.mktemp("split"))


def test_a_side_file_drafts_what_the_layer_drafts_inside_the_model(engine, split):
    """Split or whole, the same layer on the same hidden states: the side file proposes what the carried layer
    proposes, round for round, and the answer is speculation off's."""
    ids = chat_tokens(engine.model, [{"role": "user", "content": "the cat sat on the mat"}])
    engine.reset()
    whole = run(engine, ids, "mtp", max_tokens=120, draft_max=4, draft_p_min=0.0)
    e = Engine(ModelSettings(split[0], n_ctx=1024), ModelSettings(split[1], n_ctx=1024))
    try:
        assert e.model.n_nextn == 0 and e.draft is None and e.draft_model.path == split[1]
        side = run(e, ids, "model", max_tokens=120, draft_max=4, draft_p_min=0.0)
        e.reset()
        assert run(e, ids, "none", max_tokens=120).token_ids == side.token_ids == whole.token_ids
    finally:
        e.close()
    assert side.stats.drafter == "mtp" and side.stats.n_accepted > 0
    assert (side.stats.n_drafted, side.stats.n_accepted, side.draft_flags) == (
        whole.stats.n_drafted, whole.stats.n_accepted, whole.draft_flags)


def test_a_side_file_is_no_target_and_one_for_another_model_is_refused(split, tmp_path):
    """llama.cpp loads a side file as a model and crashes running it: given as the target (test_heads.py checks it
    for every head), or as the draft of a model it was not made for, it is a clear error before anything runs, and
    the process goes on."""
    from support.tiny_gguf import write_model
    from support.tiny_recurrent import write_recurrent
    from test_cli import cli

    deeper = write_recurrent(tmp_path / "mtp-deeper.gguf", "qwen35", seed=3, mtp=1, part="mtp", pattern="RARARARA")
    with pytest.raises(EngineError, match="follow a trunk of 8 layers, the target has 4"):
        Engine(ModelSettings(split[0], n_ctx=256), ModelSettings(deeper, n_ctx=256))
    llama = write_model(tmp_path / "llama.gguf", seed=1)
    with pytest.raises(EngineError, match="MTP layers of a qwen35 model, the target is llama"):
        Engine(ModelSettings(llama, n_ctx=256), ModelSettings(split[1], n_ctx=256))
    r = cli("generate", "-m", split[1], "--prompt", "the cat sat", "-n", "4")
    assert r.returncode == 1 and "not a model" in r.stderr and "Traceback" not in r.stderr
    assert drafted(*split, "mtp") > 0  # and the right pair still runs


def test_the_pair_check_names_a_side_file(split, tmp_path):
    from support.tiny_recurrent import write_recurrent
    from test_cli import cli

    from app.models.check import NOT_A_MODEL, check_files, describe

    lines = describe(check_files(split[0], split[1], n_ctx=256))
    assert ("compatible: the draft is a side file of a model's MTP layers, drafting from the target's hidden states "
            "(llama.cpp: --spec-type draft-mtp -md FILE)") in lines
    lines = describe(check_files(split[1], None, n_ctx=256))
    assert NOT_A_MODEL.format("a side file of a model's MTP layers") in lines
    assert not any("can draft for itself" in line for line in lines)
    measured = cli("check", "-m", split[0], "-md", split[1], "--measure", "8")  # one row per drafter: the side file
    assert measured.returncode == 0, measured.stderr  # answers to "model" too, and is timed as what it is
    rows = [line.split(" x")[0].strip() for line in measured.stdout.splitlines() if " acceptance " in line]
    assert sorted(rows) == ["MTP", "MTP + n-gram lookup (ngram-longest)", "n-gram lookup (ngram-longest)"], measured.stdout
    deeper = write_recurrent(tmp_path / "mtp-deeper.gguf", "qwen35", seed=3, mtp=1, part="mtp", pattern="RARARARA")
    lines = describe(check_files(split[0], deeper, n_ctx=256))
    assert any(line.startswith("not usable: the draft is a side file of a model's MTP layers, but they follow a "
                               "trunk of 8 layers") for line in lines)


def test_a_model_given_alone_finds_its_side_file_in_its_mtp_folder(split, mtp_path, tmp_path):
    """unsloth's repos ship the side file in an MTP/ folder: a model without MTP layers loaded alone drafts with the
    one made for it from there; one made for another model is passed over, and a model that carries its own layer
    needs none."""
    import shutil
    from pathlib import Path

    from support.tiny_recurrent import write_recurrent

    from app.models.loader import LoadSpec, resolve

    repo = tmp_path / "Qwen-tiny-GGUF"
    (repo / "MTP").mkdir(parents=True)
    target = Path(shutil.copy(split[0], repo / "Qwen-tiny-Q8_0.gguf"))
    write_recurrent(repo / "MTP" / "mtp-another-model.gguf", "qwen35", seed=3, mtp=1, part="mtp", pattern="RARARARA")
    assert resolve(LoadSpec(target=str(target))).draft is None
    side = Path(shutil.copy(split[1], repo / "MTP" / "mtp-Qwen-tiny-Q4_0.gguf"))
    assert resolve(LoadSpec(target=str(target))).draft == side
    whole = Path(shutil.copy(mtp_path, repo / "Qwen-tiny-MTP-Q8_0.gguf"))
    assert resolve(LoadSpec(target=str(whole))).draft is None


def test_a_catalog_pair_pulls_the_side_file_beside_a_model_of_its_quantization(split, tmp_path):
    """As the catalog's qwen3.8-27b: the target by its tag, the side file by its kind from the MTP/ folder of the
    same repo, which also holds a model of the side file's quantization. Pulled from the local stand-in for the Hub,
    the pair drafts with the side file by default, and says what speculation off says."""
    from support.fake_hub import FakeHub, child_env
    from test_hub import no_traffic_beyond_loopback, specchat

    hub = FakeHub()
    trunk, side = split[0].read_bytes(), split[1].read_bytes()
    hub.add("tests/qwen-tiny", {"Qwen-tiny-UD-Q8_0.gguf": trunk, "Qwen-tiny-Q4_0.gguf": trunk,
                                "MTP/mtp-Qwen-tiny-Q4_0.gguf": side})
    catalog = tmp_path / "models.toml"
    catalog.write_text('[pairs.tiny-side]\ndescription = "drafts with its MTP side file"\nlicense = "test"\n'
                       'target = { repo = "tests/qwen-tiny", quantization = "UD-Q8_0", size_gb = 0.001 }\n'
                       'draft = { repo = "tests/qwen-tiny", quantization = "Q4_0", side_file = "mtp", '
                       'size_gb = 0.001 }\n')
    env = child_env(hub.url, tmp_path, SPECCHAT_MODELS=str(catalog))
    try:
        pulled = specchat(env, "pull", "tiny-side")
        assert pulled.returncode == 0, pulled.stderr
        assert "draft: tests/qwen-tiny/MTP/mtp-Qwen-tiny-Q4_0.gguf" in pulled.stderr
        args = ("generate", "--pair", "tiny-side", "--prompt", "the cat sat", "-n", "32", "--temperature", "0",
                "--json")
        side_run, off = (json.loads(specchat(env, *args, *extra).stdout) for extra in ([], ["--drafter", "none"]))
        assert side_run["drafter"] == "mtp" and side_run["n_drafted"] > 0
        assert side_run["token_ids"] == off["token_ids"]
        no_traffic_beyond_loopback(env)
    finally:
        hub.close()


def test_the_hub_offers_the_side_file_in_the_targets_repo_before_anything_comes_down(split, tmp_path):
    """`files` and the Models tab list a repo's models before its side files (the first is picked: never a side
    file, though it is smaller). `check -hf` on a model converted without its MTP layer lists, first, the side file
    beside it that holds them (named by its file: a tag alone would name the model of its quantization), judged
    from the two headers; one made for another model is left out. The Models tab offers it too. Pulled with -hfd,
    it drafts as speculation off answers."""
    import subprocess
    import sys

    from support.fake_hub import FakeHub, child_env
    from support.tiny_recurrent import write_recurrent
    from test_hub import ROOT, cached, no_traffic_beyond_loopback, specchat

    repo = "tests/Qwen-tiny-GGUF"
    other = write_recurrent(tmp_path / "deeper.gguf", "qwen35", seed=3, mtp=1, part="mtp", pattern="RARARARA")
    hub = FakeHub()
    hub.add(repo, {"Qwen-tiny-Q8_0.gguf": split[0].read_bytes(), "Qwen-tiny-Q4_0.gguf": split[0].read_bytes(),
                   "MTP/mtp-Qwen-tiny-Q4_0.gguf": split[1].read_bytes(),
                   "MTP/mtp-Qwen-other-Q8_0.gguf": other.read_bytes()}, downloads=5)
    env = child_env(hub.url, tmp_path)
    try:
        listed = specchat(env, "files", repo).stdout.splitlines()  # models first, side files after, said to be
        assert [line.split()[-1] for line in listed[:2]] == ["Qwen-tiny-Q4_0.gguf", "Qwen-tiny-Q8_0.gguf"], listed
        assert all(line.endswith("(side file (mtp): a draft for its model)") for line in listed[2:]) and len(listed) == 4
        r = specchat(env, "check", "-hf", f"{repo}:Q8_0")
        assert r.returncode == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  ")]
        assert rows[0][:2] == ["OK", f"{repo}:MTP/mtp-Qwen-tiny-Q4_0.gguf"] and "in the target's repo" in r.stdout
        assert "compatible: the draft is a side file of a model's MTP layers" in r.stdout
        assert "mtp-Qwen-other" not in r.stdout
        assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.gguf"))
        script = ("from app.ui.models_tab import ModelsView\n"  # the Models tab: the repo's first file, its drafts
                  "view = ModelsView(lambda r: 'tab', lambda: None)\n"
                  "print(view.pick_repo(%r)[2])\n"
                  "drafts, *_ = view.suggest_drafts(%r, 'Qwen-tiny-Q8_0.gguf')\n"
                  "print(drafts.choices)" % (repo, repo))
        r = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "Qwen-tiny-Q4_0.gguf"  # (the smallest model, not the smaller side file)
        assert f"('{repo} — MTP/mtp-Qwen-tiny-Q4_0.gguf, " in r.stdout and "mtp-Qwen-other" not in r.stdout
        r = specchat(env, "pull", "-hf", f"{repo}:Q8_0", "-hfd", f"{repo}:MTP/mtp-Qwen-tiny-Q4_0.gguf")
        assert r.returncode == 0 and "the draft is a side file of a model's MTP layers" in r.stdout + r.stderr, r.stderr
        target, side = cached(env, repo, "Qwen-tiny-Q8_0.gguf"), cached(env, repo, "MTP/mtp-Qwen-tiny-Q4_0.gguf")
        runs = [json.loads(specchat(env, "generate", "-m", target, *extra, "--prompt", "the cat", "-n", "24",
                                    "--temp", "0", "--json").stdout) for extra in (["-md", side], ["--drafter", "none"])]
        assert runs[0]["drafter"] == "mtp" and runs[0]["n_drafted"] > 0 and runs[0]["token_ids"] == runs[1]["token_ids"]
        no_traffic_beyond_loopback(env)
    finally:
        hub.close()
