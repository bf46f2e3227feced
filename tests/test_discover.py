"""Any GGUF pair from the Hub: search, a repo's file list, pairing advice before the draft comes down, and a pair
assembled from search results that loads and speculates exactly. Against the stand-in Hub (tests/fake_hub.py) with
the real huggingface_hub client and the real `specchat search / files / check / pull / generate`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_hub import FakeHub
from test_hub import cached, no_traffic_beyond_loopback, specchat
from tiny_gguf import write_model

from app.models import discover

TARGET_REPO, DRAFT_REPO = "tests/Tiny-7B-Instruct-GGUF", "tests/Tiny-0.5B-Instruct-GGUF"
WRONG_REPO, OTHER_REPO = "tests/Tiny-1B-Instruct-GGUF", "tests/Other-0.5B-GGUF"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """Repo id -> {file name: bytes}. The 0.5B draft shares the target's tokenizer; the 1B one has the family's name
    but one token spelled differently (llama.cpp's rule refuses it); Other is another family altogether."""
    d = tmp_path_factory.mktemp("discover")
    big = dict(n_embd=128, n_layer=4, n_ff=256)
    small = dict(n_embd=32, n_layer=1, n_ff=64)
    first = write_model(d / "Tiny-7B-Instruct-F32.gguf", seed=1, split_max_tensors=10, **big)
    split = {p.name: p.read_bytes() for p in d.glob("Tiny-7B-Instruct-F32-*.gguf")}
    return {
        TARGET_REPO: {"Tiny-7B-Instruct-Q8_0.gguf": write_model(d / "t.gguf", seed=1, **big).read_bytes(),
                      **split, "mmproj-Tiny-7B-F16.gguf": write_model(d / "mm.gguf", seed=9, **small).read_bytes(),
                      "README.md": b"# tiny"},
        DRAFT_REPO: {"Tiny-0.5B-Instruct-Q8_0.gguf": write_model(d / "d8.gguf", seed=2, **small).read_bytes(),
                     "Tiny-0.5B-Instruct-Q4_K_M.gguf": write_model(d / "d4.gguf", seed=3, **small).read_bytes()},
        WRONG_REPO: {"Tiny-1B-Instruct-Q8_0.gguf":
                     write_model(d / "w.gguf", seed=4, rename={300: "▁zebra"}, **small).read_bytes()},
        OTHER_REPO: {"Other-0.5B-Q8_0.gguf": write_model(d / "o.gguf", seed=5, **small).read_bytes()},
        "_split_first": first.name,
    }


@pytest.fixture
def fake(repos):
    h = FakeHub()
    downloads = {TARGET_REPO: 900, DRAFT_REPO: 500, WRONG_REPO: 700, OTHER_REPO: 50}
    for repo, files in repos.items():
        if repo.startswith("tests/"):
            h.add(repo, files, downloads=downloads[repo], likes=3,
                  gguf={"architecture": "llama", "total": 7_000_000 if "7B" in repo else 500_000,
                        "context_length": 512})
    h.add("tests/no-gguf-here", {"model.safetensors": b"x"}, downloads=10_000)
    yield h
    h.close()


@pytest.fixture
def env(tmp_path, fake):
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(HF_ENDPOINT=fake.url, HF_HUB_CACHE=str(tmp_path / "hub"), SPECCHAT_NET_LOG=str(tmp_path / "net.log"),
             HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    (tmp_path / "net.log").write_text("")
    return e


def test_search_lists_gguf_repos_most_downloaded_first(fake):
    hits = discover.search("tiny", endpoint=fake.url)
    assert [h.repo for h in hits] == [TARGET_REPO, WRONG_REPO, DRAFT_REPO]
    assert hits[0].downloads == 900 and hits[0].architecture == "llama" and hits[0].parameters == 7_000_000
    assert [h.family for h in hits] == ["tiny", "tiny", "tiny"]
    assert [h.repo for h in discover.search("", limit=2, endpoint=fake.url)] == [TARGET_REPO, WRONG_REPO]
    assert discover.search("nothing-like-this", endpoint=fake.url) == []
    query = next(q for q in fake.log if q.path.startswith("/api/models?"))
    assert "filter=gguf" in query.path and "sort=downloads" in query.path


def test_a_repos_files_are_grouped_with_size_and_quantization(fake, repos):
    files = discover.list_gguf(TARGET_REPO, endpoint=fake.url)
    split = sorted(n for n in repos[TARGET_REPO] if "-of-" in n)
    assert len(split) > 1
    by_file = {c.file: c for c in files}
    assert set(by_file) == {"Tiny-7B-Instruct-Q8_0.gguf", repos["_split_first"]}  # no mmproj, no README
    grouped = by_file[repos["_split_first"]]
    assert grouped.shards == tuple(split) and grouped.quantization == "F32"
    assert grouped.size == sum(len(repos[TARGET_REPO][n]) for n in split)
    assert by_file["Tiny-7B-Instruct-Q8_0.gguf"].quantization == "Q8_0"
    assert {c.file: c.quantization for c in discover.list_gguf(DRAFT_REPO, endpoint=fake.url)} == {
        "Tiny-0.5B-Instruct-Q4_K_M.gguf": "Q4_K_M", "Tiny-0.5B-Instruct-Q8_0.gguf": "Q8_0"}


def test_pairing_advice_reads_only_the_headers_before_any_download(fake, repos, tmp_path, monkeypatch):
    monkeypatch.setattr(discover, "HEADER_FIRST_READ", 2048)  # grow the read as a big vocabulary would need
    target = discover.choose(f"{TARGET_REPO}:Q8_0", endpoint=fake.url)
    candidates = discover.drafts_for(target, endpoint=fake.url)
    assert [(h.repo, c.file) for h, c in candidates] == [(WRONG_REPO, "Tiny-1B-Instruct-Q8_0.gguf"),
                                                        (DRAFT_REPO, "Tiny-0.5B-Instruct-Q8_0.gguf")]
    by_name = discover.advise(target, candidates[0][1], read_headers=False, endpoint=fake.url)
    assert by_name.ok and not by_name.checked  # the name alone cannot tell the 1B draft's tokenizer differs

    wrong = discover.advise(target, candidates[0][1], endpoint=fake.url)
    assert wrong.checked and not wrong.ok
    assert "NOT compatible" in wrong.lines[-1] and "'▁zebra' to the draft" in wrong.lines[-1]
    good = discover.advise(target, candidates[1][1], endpoint=fake.url)
    assert good.ok and good.checked and good.lines[-1].startswith("compatible: the tokenizers match")
    other = discover.advise(target, discover.choose(OTHER_REPO, "draft", endpoint=fake.url), read_headers=False,
                            endpoint=fake.url)
    assert other.ok is False and "tiny and other (different)" in other.lines[0]

    for repo, name in [(TARGET_REPO, "Tiny-7B-Instruct-Q8_0.gguf"), (DRAFT_REPO, "Tiny-0.5B-Instruct-Q8_0.gguf")]:
        sha = fake.sha(repo, name)
        reads = [q for q in fake.log if q.path.endswith(sha)]
        assert reads and all(q.range and q.range.startswith("bytes=0-") for q in reads)
        assert 0 < fake.bytes_sent(sha) < len(repos[repo][name]) // 2  # a header, not the model


def test_choose_follows_llama_cpps_hf_form(fake, repos):
    assert discover.choose(TARGET_REPO, endpoint=fake.url).file == "Tiny-7B-Instruct-Q8_0.gguf"  # no Q4_K_M: smallest
    assert discover.choose(f"{DRAFT_REPO}:q4_k_m", endpoint=fake.url).file == "Tiny-0.5B-Instruct-Q4_K_M.gguf"
    assert discover.choose(DRAFT_REPO, "draft", endpoint=fake.url).quantization == "Q8_0"
    assert discover.choose(f"{TARGET_REPO}:{repos['_split_first']}", endpoint=fake.url).file == repos["_split_first"]
    with pytest.raises(discover.EngineError, match=r"has no IQ2_XS GGUF; it has: .*Q8_0"):
        discover.choose(f"{TARGET_REPO}:IQ2_XS", endpoint=fake.url)
    with pytest.raises(discover.EngineError, match="is not a Hub repo"):
        discover.choose("just-a-name", endpoint=fake.url)
    with pytest.raises(discover.EngineError, match="no GGUF model files"):
        discover.choose("tests/no-gguf-here", endpoint=fake.url)


def test_a_pair_assembled_from_search_results_downloads_and_speculates_exactly(env, fake, repos):
    r = specchat(env, "search", "tiny", "--json")
    assert r.returncode == 0, r.stderr
    assert [h["repo"] for h in json.loads(r.stdout)][0] == TARGET_REPO
    r = specchat(env, "files", TARGET_REPO)
    assert r.returncode == 0 and "Q8_0" in r.stdout and "F32" in r.stdout and "mmproj" not in r.stdout

    r = specchat(env, "check", "-hf", f"{TARGET_REPO}:Q8_0")  # drafts suggested from the Hub, headers checked
    assert r.returncode == 0, r.stderr
    assert f"OK  {DRAFT_REPO}:Q8_0" in r.stdout and f"NO  {WRONG_REPO}:Q8_0" in r.stdout

    r = specchat(env, "pull", "-hf", f"{TARGET_REPO}:Q8_0", "-hfd", WRONG_REPO)
    assert r.returncode == 1 and "cannot draft for" in r.stderr and "Traceback" not in r.stderr
    assert not (Path(env["HF_HUB_CACHE"]) / "models--tests--Tiny-1B-Instruct-GGUF" / "snapshots").exists()

    r = specchat(env, "pull", "-hf", f"{TARGET_REPO}:Q8_0", "-hfd", DRAFT_REPO)
    assert r.returncode == 0, r.stderr
    target = cached(env, TARGET_REPO, "Tiny-7B-Instruct-Q8_0.gguf")
    draft = cached(env, DRAFT_REPO, "Tiny-0.5B-Instruct-Q8_0.gguf")
    assert r.stdout.split() == [str(target), str(draft)]

    r = specchat(env, "check", "-m", target, "-md", draft)  # the rule again, now on the files on disk
    assert "compatible: the draft shares the target's tokenizer" in r.stdout, r.stdout + r.stderr
    runs = [json.loads(specchat(env, "generate", "-m", target, *extra, "--prompt", "the cat", "-n", "24",
                                "--temp", "0", "--json").stdout) for extra in (["-md", draft], ["--drafter", "none"])]
    assert runs[0]["n_drafted"] > 0 and runs[0]["token_ids"] == runs[1]["token_ids"]
    no_traffic_beyond_loopback(env)
