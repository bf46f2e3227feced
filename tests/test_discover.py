"""Any GGUF pair from the Hub: search, a repo's file list, pairing advice before the draft comes down, and a pair
assembled from search results that loads and speculates exactly. Against the stand-in Hub (tests/support/fake_hub.py)
with the real huggingface_hub client and the real `specchat search / files / check / pull / generate`."""
from __future__ import annotations

import json

import pytest
from support.fake_hub import FakeHub, child_env
from support.tiny_gguf import write_model
from test_hub import cached, no_traffic_beyond_loopback, specchat

from app.engine.compat import AS_TEXT
from app.models import discover

TARGET_REPO, DRAFT_REPO = "tests/Tiny-7B-Instruct-GGUF", "tests/Tiny-0.5B-Instruct-GGUF"
WRONG_REPO, OTHER_REPO = "tests/Tiny-1B-Instruct-GGUF", "tests/Other-0.5B-GGUF"
LONE_REPO, MID_REPO, HUGE_REPO = "tests/Lone-7B-Instruct-GGUF", "tests/Mid-2B-GGUF", "tests/Huge-3B-GGUF"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """Repo id -> {file name: bytes}. The 0.5B draft shares the target's tokenizer; the 1B one has the family's name
    but one token spelled differently (llama.cpp's rule refuses it); Other is another family altogether. Lone is a
    target whose family has no draft on the Hub, with its tokens at other ids than everyone else's; Mid and Huge
    are drafts of other families at about 1:6 and 1:2 of its size."""
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
        LONE_REPO: {"Lone-7B-Instruct-Q8_0.gguf": write_model(d / "l.gguf", seed=6, permute_seed=7, **big).read_bytes()},
        MID_REPO: {"Mid-2B-Q8_0.gguf": write_model(d / "m.gguf", seed=8, n_embd=64, n_layer=2, n_ff=128).read_bytes()},
        HUGE_REPO: {"Huge-3B-Q8_0.gguf": write_model(d / "h.gguf", seed=9, n_embd=128, n_layer=2, n_ff=256).read_bytes()},
        "_split_first": first.name,
    }


@pytest.fixture
def fake(repos):
    h = FakeHub()
    downloads = {TARGET_REPO: 900, DRAFT_REPO: 500, WRONG_REPO: 700, OTHER_REPO: 50, LONE_REPO: 40, MID_REPO: 30,
                 HUGE_REPO: 20}
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
    return child_env(fake.url, tmp_path)


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

    wrong = discover.advise(target, candidates[0][1], endpoint=fake.url)  # not refused: it drafts as text
    assert wrong.checked and wrong.ok and wrong.as_text and wrong.mark == "TXT"
    assert wrong.lines[-1].startswith(AS_TEXT) and "'▁zebra' to the draft" in wrong.lines[-1]
    good = discover.advise(target, candidates[1][1], endpoint=fake.url)
    assert good.ok and good.checked and good.mark == "OK" and good.lines[-1].startswith("compatible: the tokenizers")
    assert good.lines[1].startswith("size: 1:22 of the target's size")
    other = discover.advise(target, discover.choose(OTHER_REPO, "draft", endpoint=fake.url), read_headers=False,
                            endpoint=fake.url)
    assert other.ok and other.as_text and not other.checked and "tiny and other (different)" in other.lines[0]

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
    assert f"OK  {DRAFT_REPO}:Q8_0" in r.stdout and f"TXT {WRONG_REPO}:Q8_0" in r.stdout
    assert r.stdout.index(DRAFT_REPO) < r.stdout.index(WRONG_REPO)  # the target's own tokens first
    assert "from the catalog" not in r.stdout  # it has a draft of its own vocabulary: nothing else offered

    # (--no-mmproj: the repo's mmproj-Tiny-7B-F16.gguf is a text model under a projector's name)
    r = specchat(env, "pull", "-hf", f"{TARGET_REPO}:Q8_0", "-hfd", WRONG_REPO, "--no-mmproj")  # another vocabulary:
    assert r.returncode == 0 and AS_TEXT in r.stderr, r.stderr  # said before it comes down, not refused
    assert r.stdout.split()[1] == str(cached(env, WRONG_REPO, "Tiny-1B-Instruct-Q8_0.gguf"))

    r = specchat(env, "pull", "-hf", f"{TARGET_REPO}:Q8_0", "-hfd", DRAFT_REPO, "--no-mmproj")
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


@pytest.fixture
def catalog(tmp_path, repos):
    """A catalog whose drafts are on the stand-in Hub: Other and Tiny-0.5B at about 1:22 of Lone, Mid at 1:6,
    Huge at 1:2 (over a third: never offered); sizes in GB as the real catalog gives them."""
    size = {r: len(next(b for n, b in repos[r].items())) / 1e9 for r in (DRAFT_REPO, OTHER_REPO, MID_REPO, HUGE_REPO)}
    pairs = "".join(f"""
[pairs.p{i}]
target = {{ repo = "{TARGET_REPO}", file = "Tiny-7B-Instruct-Q8_0.gguf", size_gb = 0.003 }}
draft = {{ repo = "{r}", file = "{next(iter(repos[r]))}", size_gb = {size[r]:.9f} }}
""" for i, r in enumerate((HUGE_REPO, MID_REPO, OTHER_REPO, DRAFT_REPO)))
    path = tmp_path / "models.toml"
    path.write_text(pairs)
    return path


def test_a_target_without_a_draft_of_its_vocabulary_is_offered_other_families_ranked_by_size_ratio(
        fake, repos, catalog, env, monkeypatch):
    monkeypatch.setenv("SPECCHAT_MODELS", str(catalog))
    lone = discover.choose(LONE_REPO, endpoint=fake.url)
    assert discover.drafts_for(lone, endpoint=fake.url) == []  # nothing of its family on the Hub
    judged = discover.judged_drafts(lone, endpoint=fake.url)
    # nearest to 1:20 first (Other and Tiny-0.5B at 1:22, in catalog order), then Mid at 1:6; Huge left out
    assert [c.repo for _, c, _ in judged] == [OTHER_REPO, DRAFT_REPO, MID_REPO]
    assert all(hit is None and a.checked and a.mark == "TXT" for hit, _, a in judged)
    assert "token " in judged[0][2].lines[-1] and "size: 1:22" in judged[0][2].lines[-2]

    e = {**env, "SPECCHAT_MODELS": str(catalog)}
    r = specchat(e, "check", "-hf", LONE_REPO)
    assert r.returncode == 0, r.stderr
    rows = [line.split()[:2] for line in r.stdout.splitlines() if "from the catalog" in line]
    assert rows == [["TXT", f"{OTHER_REPO}:Q8_0"], ["TXT", f"{DRAFT_REPO}:Q8_0"], ["TXT", f"{MID_REPO}:Q8_0"]]

    r = specchat(e, "pull", "-hf", LONE_REPO, "-hfd", OTHER_REPO)
    assert r.returncode == 0 and AS_TEXT in r.stderr, r.stderr
    target, draft = r.stdout.split()
    runs = [json.loads(specchat(e, "generate", "-m", target, *extra, "--prompt", "the cat", "-n", "24",
                                "--temp", "0", "--json").stdout) for extra in (["-md", draft], ["--drafter", "none"])]
    assert runs[0]["drafter"] == "model (as text)" and runs[0]["n_drafted"] > 0
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    no_traffic_beyond_loopback(env)
