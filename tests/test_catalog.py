"""models.toml: the shipped catalog loads, bad catalogs are explained, pairs resolve to local files."""
import pytest

from app.models import hf_files
from app.models.catalog import get_pair, load_catalog, local_path
from app.engine import EngineError


def test_shipped_catalog_has_the_starter_pair():
    pairs = load_catalog()
    starter = pairs["starter"]
    assert starter.target.builtin and starter.draft.builtin
    assert starter.draft_params.adaptive and starter.draft_params.draft_p_min == 0.0
    for p in pairs.values():
        assert p.description and p.license and p.target.describe() and (p.draft is None or p.draft.describe())


@pytest.mark.parametrize("body,words", [
    ("[pairs.x]\nfoo = 1\n", "unknown keys: foo"),
    ("[pairs.x]\ndraft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "target is missing"),
    ("[pairs.x]\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\ndraft = 'small'\n", "draft must be a table"),
    ("[pairs.x]\ntarget = { repo = 'a/b' }\ndraft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "repo = ... and file"),
    ("[pairs.x]\ntarget = { builtin = 'nope' }\ndraft = { builtin = 'nope' }\n", "unknown builtin"),
    ("[pairs.x]\ndraft_max = 999\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "draft-max"),
    ("[pairs.x\n", "Cannot read the model catalog"),
    ("[pairs.x]\nuse = 'poetry'\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "use must be one of chat, code, reasoning"),
    ("[pairs.x]\ntarget = { repo = 'no-owner', file = 'a.gguf' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "repo must look like owner/name"),
    ("[pairs.x]\ntarget = { repo = 'a/b', file = 'model.safetensors' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "must be a .gguf file"),
    ("[pairs.x]\ntarget = { repo = 'a/b', file = 'a.gguf', size_gb = 'big' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "size_gb must be a number"),
    ("[pairs.x]\ntarget = { repo = 'a/b', quantization = 'Q4_K_M' }\n"
     "draft = { repo = 'a/b', quantization = 'Q8_0', side_file = 'medusa' }\n",
     "side_file must be one of mtp, eagle3, dflash, dspark, not 'medusa'"),
    ("[pairs.x]\nreleased = 'spring 2026'\ntarget = { builtin = 'smollm2-135m-instruct-f32' }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "released must be a month as YYYY-MM"),
    ("[pairs.x]\ntarget = { repo = 'a/b', file = 'a.gguf', size_gb = 2.0, active_gb = 3.0 }\n"
     "draft = { builtin = 'smollm2-135m-instruct-q4_1' }\n", "active_gb must be the GB one token reads"),
])
def test_bad_catalog_entries_are_explained(tmp_path, body, words):
    f = tmp_path / "models.toml"
    f.write_text(body)
    with pytest.raises(EngineError, match=words):
        load_catalog(f)


def test_unknown_pair_lists_the_known_ones():
    with pytest.raises(EngineError, match="Known pairs: starter"):
        get_pair("nope")


def test_hub_pair_not_downloaded_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pair = get_pair("qwen2.5-7b-instruct")
    with pytest.raises(EngineError, match=r"qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf is not downloaded yet\. "
                       r"Download it with: specchat pull qwen2.5-7b-instruct"):
        local_path(pair.target, pair.name)


def test_catalog_offers_real_pairs_for_every_use():
    pairs = load_catalog()
    hub_pairs = [p for p in pairs.values() if p.target.repo]
    assert len(hub_pairs) >= 8
    assert {p.use for p in hub_pairs} == {"chat", "code", "reasoning"}
    for p in hub_pairs:
        for src in p.sources:
            assert src.repo.count("/") == 1 and src.quantization and src.size_gb > 0
            assert src.file is None or src.file.endswith(".gguf")
        assert (p.draft is None or p.target.size_gb > p.draft.size_gb) and p.context >= 8192
        assert 1 <= p.draft_params.draft_max <= 32
    assert pairs["qwen2.5-7b-instruct"].target.files() == [
        "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"]


# A repo's listing today, as llama.cpp's -hf repo:TAG sees it (common/download.cpp: find_best_model, find_best_sibling).
LISTING = [("Qwen3.8-27B-Q4_K_M.gguf", 16), ("Qwen3.8-27B-UD-Q4_K_M.gguf", 17), ("Qwen3.8-27B-Q4_K_M_L.gguf", 18),
           ("Q8_0/Qwen3.8-27B-Q8_0-00002-of-00002.gguf", 14), ("Q8_0/Qwen3.8-27B-Q8_0-00001-of-00002.gguf", 15),
           ("mtp-Qwen3.8-27B-Q4_0.gguf", 1), ("MTP/gemma-4-12B-it-Q8_0-MTP.gguf", 1),
           ("MTP/mtp-gemma-4-12B-it-BF16.gguf", 1),
           ("eagle3-Qwen3.8-27B-Q8_0.gguf", 1), ("dflash-Qwen3.8-27B-F16.gguf", 1),
           ("Q6_K/Qwen3.8-27B-Q6_K-00001-of-00002.gguf", 9), ("README.md", 1)]


@pytest.mark.parametrize("tag,kind,file", [
    ("q4_k_m", "", "Qwen3.8-27B-Q4_K_M.gguf"),  # any case; the plainest name, not UD- nor _L
    ("UD-Q4_K_M", "", "Qwen3.8-27B-UD-Q4_K_M.gguf"),
    ("Q4_K_M_L", "", "Qwen3.8-27B-Q4_K_M_L.gguf"),
    ("Q8_0", "", "Q8_0/Qwen3.8-27B-Q8_0-00001-of-00002.gguf"),  # split in a folder: named by its first shard
    ("Q4_0", "mtp", "mtp-Qwen3.8-27B-Q4_0.gguf"),
    ("Q8_0", "mtp", "MTP/gemma-4-12B-it-Q8_0-MTP.gguf"),  # an MTP/ folder also marks the kind
    ("bf16", "mtp", "MTP/mtp-gemma-4-12B-it-BF16.gguf"),
    ("Q8_0", "eagle3", "eagle3-Qwen3.8-27B-Q8_0.gguf"),
    ("F16", "dflash", "dflash-Qwen3.8-27B-F16.gguf"),
    ("qwen3.8-27b-ud-q4_k_m.gguf", "", "Qwen3.8-27B-UD-Q4_K_M.gguf"),  # a file name in another case
    ("Qwen3.8-27B-Q8_0-00002-of-00002.gguf", "", "Q8_0/Qwen3.8-27B-Q8_0-00001-of-00002.gguf"),
])
def test_a_tag_picks_todays_file_as_llama_cpps_hf_form_does(tag, kind, file):
    choices = hf_files.group("o/r", LISTING)
    found = hf_files.pick(choices, "o/r", tag, kind)
    assert found.file == file
    assert found.shards == (("Q8_0/Qwen3.8-27B-Q8_0-00001-of-00002.gguf", "Q8_0/Qwen3.8-27B-Q8_0-00002-of-00002.gguf")
                            if file.startswith("Q8_0/") else (file,))


@pytest.mark.parametrize("tag,kind,words", [
    ("Q4_K", "", r"o/r has no Q4_K GGUF; it has: .*Qwen3.8-27B-Q4_K_M.gguf"),  # a whole label, not a prefix
    ("Q6_K", "", "o/r has no Q6_K GGUF"),  # one shard of two uploaded: nothing that loads
    ("Q8_0", "dspark", "o/r has no Q8_0 dspark file"),
    ("Q4_0", "", "o/r has no Q4_0 GGUF"),  # a side file is never the model
    ("27B", "", r"27B fits more than one GGUF in o/r: .*Name it in full"),
])
def test_a_tag_that_fits_nothing_or_several_is_explained(tag, kind, words):
    with pytest.raises(EngineError, match=words):
        hf_files.pick(hf_files.group("o/r", LISTING), "o/r", tag, kind)


def test_side_files_are_told_from_models_that_carry_mtp_layers():
    assert [hf_files.side_kind(n) for n in ("MTP/mtp-gemma-4-31B-it-Q8_0.gguf", "MTP/gemma-4-12B-it-Q8_0-MTP.gguf",
                                            "Qwen3.6-27B-MTP-Q4_K_M.gguf", "Qwen3.8-27B-GSQ-RCO-IQ3_XXS-mtp.gguf",
                                            "Qwen3-8B-speculator.eagle3-F16.gguf", "dspark-x-Q8_0.gguf")] == [
        "mtp", "mtp", "", "", "eagle3", "dspark"]


def test_a_tag_source_is_found_in_the_local_cache_as_on_the_hub(tmp_path, monkeypatch):
    """After a pull, the tag is matched against the snapshot huggingface_hub serves: the files a pair loads."""
    from app.models.catalog import Source, status

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    folder = tmp_path / "models--o--r"
    snap = folder / "snapshots" / "abc"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc")
    for name in ("Q8_0/M-Q8_0-00001-of-00002.gguf", "Q8_0/M-Q8_0-00002-of-00002.gguf", "MTP/mtp-M-Q8_0.gguf"):
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_bytes(b"GGUF" + bytes(60))
    target, side = Source(repo="o/r", quantization="Q8_0"), Source(repo="o/r", quantization="Q8_0", side_file="mtp")
    assert local_path(target) == snap / "Q8_0/M-Q8_0-00001-of-00002.gguf"
    assert local_path(side) == snap / "MTP/mtp-M-Q8_0.gguf"
    assert status(target).state == "downloaded" and status(target).have_bytes == 128
    missing = Source(repo="o/r", quantization="Q4_K_M", size_gb=1.0)
    assert status(missing).state == "missing" and missing.files() == []
    with pytest.raises(EngineError, match=r"o/r:Q4_K_M is not downloaded yet\. Download it with: specchat pull -hf "
                                          r"o/r:Q4_K_M"):
        local_path(missing)


# File lists of the repos behind the entries fixed on 2026-11-25, as stored public listings and pinned downloads show
# them (models.toml says where each name was seen), and the 2025 layouts the entries named before.
TODAY = {
    "ggml-org/gpt-oss-120b-GGUF": ["gpt-oss-120b-MXFP4.gguf"],
    "ggml-org/gpt-oss-20b-GGUF": ["gpt-oss-20b-MXFP4.gguf", "eagle3-gpt-oss-20b-Q8_0.gguf"],
    "unsloth/gemma-4-12B-it-qat-GGUF": ["gemma-4-12B-it-qat-UD-Q4_K_XL.gguf", "mmproj-F16.gguf",
                                        "mtp-gemma-4-12B-it.gguf", "mtp-gemma-4-12B-it-Q4_0.gguf",
                                        "MTP/mtp-gemma-4-12B-it-Q8_0.gguf"],
    "ggml-org/gemma-4-31B-it-GGUF": ["gemma-4-31B-it-Q4_0.gguf", "gemma-4-31B-it-Q4_K_M.gguf",
                                     "mmproj-gemma-4-31B-it-Q8_0.gguf", "mtp-gemma-4-31B-it-Q8_0.gguf"],
    # (a model of the side file's quantization beside it: the tag alone would be ambiguous without side_file)
    "unsloth/Qwen3.8-27B-GGUF": ["Qwen3.8-27B-Q4_0.gguf", "Qwen3.8-27B-UD-Q4_K_M.gguf", "Qwen3.8-27B-UD-Q4_K_XL.gguf",
                                 "mmproj-F16.gguf", "MTP/mtp-Qwen3.8-27B-Q4_0.gguf"],
}
BEFORE = {
    "ggml-org/gpt-oss-120b-GGUF": [f"gpt-oss-120b-mxfp4-{i:05d}-of-00003.gguf" for i in (1, 2, 3)],
    "ggml-org/gpt-oss-20b-GGUF": ["gpt-oss-20b-mxfp4.gguf", "eagle3-gpt-oss-20b-Q8_0.gguf"],
    "unsloth/gemma-4-12B-it-qat-GGUF": ["gemma-4-12B-it-qat-UD-Q4_K_XL.gguf", "MTP/gemma-4-12B-it-Q8_0-MTP.gguf"],
}


@pytest.mark.parametrize("pair,target,draft", [
    ("gpt-oss-120b", "gpt-oss-120b-MXFP4.gguf", "gpt-oss-20b-MXFP4.gguf"),
    ("gpt-oss-20b-eagle3", "gpt-oss-20b-MXFP4.gguf", "eagle3-gpt-oss-20b-Q8_0.gguf"),
    ("gemma-4-12b-it-assistant", "gemma-4-12B-it-qat-UD-Q4_K_XL.gguf", "MTP/mtp-gemma-4-12B-it-Q8_0.gguf"),
    ("gemma-4-31b-it", "gemma-4-31B-it-Q4_K_M.gguf", "mtp-gemma-4-31B-it-Q8_0.gguf"),
    ("qwen3.8-27b", "Qwen3.8-27B-UD-Q4_K_XL.gguf", "MTP/mtp-Qwen3.8-27B-Q4_0.gguf"),
])
def test_the_fixed_entries_find_todays_files_and_would_have_found_yesterdays(pair, target, draft):
    p = load_catalog()[pair]
    found = [hf_files.pick(hf_files.group(s.repo, [(n, 1) for n in TODAY[s.repo]]), s.repo, s.tag, s.side_file).file
             for s in p.sources]
    assert found == [target, draft]
    for s in p.sources:  # the same tags found the 2025 names (shards, lower case, the old assistant in MTP/)
        if s.repo in BEFORE:
            old = hf_files.pick(hf_files.group(s.repo, [(n, 1) for n in BEFORE[s.repo]]), s.repo, s.tag, s.side_file)
            assert old.file in BEFORE[s.repo] and len(old.shards) == (3 if "120b" in s.repo else 1)


def test_the_catalog_lists_the_newest_families_first_each_with_its_speed_here_and_one_recommended():
    """`specchat list` and the Models view: 2026's families before 2024's Qwen2.5, a decoding speed estimated for
    every pair that runs on this machine's CPU (from its size and the memory bandwidth measured here), a pair that
    fits but would crawl said to, and one pair recommended."""
    from app.models import downloads
    from app.models.expected_speed import CRAWL_TPS, cpu_tps, expected, ram_bandwidth

    rows = downloads.rows()
    released = [r["released"] for r in rows]
    assert released == sorted(released, reverse=True) and released[0].startswith("2026")
    names = [r["pair"] for r in rows]
    assert names.index("qwen3.5-9b") < names.index("qwen2.5-7b-instruct")
    assert sum(r["recommended"] for r in rows) == 1
    on_cpu = [r for r in rows if r["fit"].startswith(("fits in RAM", "tight"))]
    assert on_cpu and all(r["expected_tps"] > 0 and "tok/s here before speculation" in r["expected"] for r in on_cpu)
    assert 1e9 < ram_bandwidth() < 1e13  # bytes/s: measured, and of a real machine's order
    assert cpu_tps(2.0) == pytest.approx(cpu_tps(1.0) / 2)  # twice the weights read, half the speed
    assert cpu_tps(1.0, "F16") > cpu_tps(1.0, "Q4_K_M")  # unpacking quantized weights costs a small CPU its time
    slow = expected(ram_bandwidth() / CRAWL_TPS / 1e9, "Q8_0", "fits in RAM (x GiB of weights)")  # under the line
    assert "would crawl" in slow.note and not slow.runs_well
    assert not expected(1.0, "Q4_K_M", "too large: 70 GiB of weights").runs_well
    gpt_oss = next(r for r in rows if r["pair"] == "gpt-oss-120b")  # a mixture of experts: its active share is read
    if gpt_oss["expected_tps"] is not None:
        assert gpt_oss["expected_tps"] > 10 * cpu_tps(63.39)
