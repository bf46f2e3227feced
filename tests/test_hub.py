"""Hub downloads against a local stand-in for the Hub (tests/support/fake_hub.py, selected with HF_ENDPOINT): the real
huggingface_hub client, the real `specchat pull / list / remove`, tiny GGUF pairs the tests write."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fake_hub import FakeHub, child_env
from support.tiny_gguf import write_model

from app.models import hub

ROOT = Path(__file__).resolve().parent.parent
TINY_REPO, SPLIT_REPO, BIG_REPO, DRAFT_REPO = "tests/tiny-target", "tests/tiny-split", "tests/big", "tests/tiny-draft"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub-files")
    split_first = write_model(d / "split.gguf", seed=1, split_max_tensors=8)
    return {
        "target": write_model(d / "target.gguf", seed=1).read_bytes(),
        "draft": write_model(d / "draft.gguf", seed=2, base_seed=1, noise=0.3).read_bytes(),
        "shards": {p.name: p.read_bytes() for p in sorted(d.glob("split-*.gguf"))},
        "split_first": split_first.name,
        "big": os.urandom(3 << 20),
    }


@pytest.fixture
def fake(files):
    h = FakeHub(tokens={"hf_good"})
    h.add(TINY_REPO, {"target-Q8_0.gguf": files["target"]})
    h.add(DRAFT_REPO, {"draft-Q8_0.gguf": files["draft"]})
    h.add(SPLIT_REPO, files["shards"])
    h.add(BIG_REPO, {"big-Q4_K_M.gguf": files["big"]})
    h.add("tests/private", {"p.gguf": b"GGUF"}, private=True)
    h.add("tests/gated", {"g.gguf": b"GGUF"}, gated=True)
    yield h
    h.close()


@pytest.fixture
def env(tmp_path, fake, files):
    """Environment for a `specchat` child: the fake Hub, a fresh cache, a catalog of pairs on the fake Hub."""
    catalog = tmp_path / "models.toml"
    catalog.write_text(f"""
[pairs.tiny]
description = "tiny pair"
license = "test"
target = {{ repo = "{TINY_REPO}", file = "target-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}
draft = {{ repo = "{DRAFT_REPO}", file = "draft-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}

[pairs.split]
description = "split target"
license = "test"
target = {{ repo = "{SPLIT_REPO}", file = "{files['split_first']}", quantization = "F32", size_gb = 0.0003 }}
draft = {{ repo = "{DRAFT_REPO}", file = "draft-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}

[pairs.big]
description = "a 3 MB download"
license = "test"
target = {{ repo = "{BIG_REPO}", file = "big-Q4_K_M.gguf", quantization = "Q4_K_M", size_gb = 0.003 }}
draft = {{ repo = "{DRAFT_REPO}", file = "draft-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}
""")
    return child_env(fake.url, tmp_path, SPECCHAT_MODELS=str(catalog))


def specchat(env, *args, **kw) -> subprocess.CompletedProcess:
    """`specchat ARGS` under tests/support/net_guard.py, which logs any connection beyond loopback."""
    return subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "net_guard.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


def no_traffic_beyond_loopback(env):
    assert Path(env["SPECCHAT_NET_LOG"]).read_text() == ""


def cached(env, repo, name) -> Path:
    folder = Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "snapshots"
    return next(folder.glob(f"*/{name}"))


def test_pull_list_generate_remove(env, fake, files):
    before = json.loads(specchat(env, "list", "--json").stdout)
    assert {r["pair"]: r["ready"] for r in before}["tiny"] is False
    r = specchat(env, "pull", "tiny")
    assert r.returncode == 0, r.stderr
    assert "target-Q8_0.gguf" in r.stderr and "100%" in r.stderr  # tqdm bars
    assert cached(env, TINY_REPO, "target-Q8_0.gguf").read_bytes() == files["target"]
    assert cached(env, DRAFT_REPO, "draft-Q8_0.gguf").read_bytes() == files["draft"]
    rows = {r["pair"]: r for r in json.loads(specchat(env, "list", "--json").stdout)}
    assert rows["tiny"]["ready"] and rows["tiny"]["target_status"] == "downloaded"
    assert not rows["big"]["ready"] and rows["big"]["draft_status"] == "downloaded"

    # the pulled pair loads from the cache like any catalog pair
    g = specchat(env, "generate", "--pair", "tiny", "--prompt", "the cat", "--max-tokens", "8", "--json")
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout)["n_tokens"] == 8

    # a second pull finds everything in place: verified by hash, nothing fetched again (the file lists are read
    # again: that is how a catalog tag finds today's file)
    served = len([q for q in fake.log if q.method == "GET" and not q.path.startswith("/api/")])
    assert specchat(env, "pull", "tiny").returncode == 0
    assert len([q for q in fake.log if q.method == "GET" and not q.path.startswith("/api/")]) == served

    r = specchat(env, "remove", "tiny")
    assert r.returncode == 0 and "Removed 2 file(s)" in r.stdout
    assert not list((Path(env["HF_HUB_CACHE"]) / "models--tests--tiny-target" / "blobs").iterdir())
    no_traffic_beyond_loopback(env)


def test_remove_keeps_a_draft_another_downloaded_pair_uses(env):
    assert specchat(env, "pull", "tiny").returncode == 0
    assert specchat(env, "pull", "split").returncode == 0
    r = specchat(env, "remove", "tiny")
    assert "Kept draft-Q8_0.gguf: another downloaded pair uses it." in r.stdout
    assert cached(env, DRAFT_REPO, "draft-Q8_0.gguf").exists()
    rows = {r["pair"]: r["ready"] for r in json.loads(specchat(env, "list", "--json").stdout)}
    assert rows == {"tiny": False, "split": True, "big": False}


def test_split_gguf_comes_down_whole_and_loads(env, fake, files):
    r = specchat(env, "pull", "split")
    assert r.returncode == 0, r.stderr
    for name, data in files["shards"].items():
        assert cached(env, SPLIT_REPO, name).read_bytes() == data
    assert len(files["shards"]) == 3
    g = specchat(env, "generate", "--pair", "split", "--prompt", "the cat", "--max-tokens", "4", "--json")
    assert g.returncode == 0, g.stderr
    no_traffic_beyond_loopback(env)


def test_a_pull_killed_halfway_resumes_where_it_stopped(env, fake, files):
    size = len(files["big"])
    fake.rate = 1 << 20  # 1 MB/s: the 3 MB file takes about 3 s
    blobs = Path(env["HF_HUB_CACHE"]) / "models--tests--big" / "blobs"
    child = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "net_guard.py"), "pull", "big"], env=env,
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    part = None
    while time.monotonic() < deadline:
        parts = list(blobs.glob("*.incomplete")) if blobs.is_dir() else []
        if parts and parts[0].stat().st_size > size // 3:
            part = parts[0]
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert part is not None, "the download never got a third of the way"
    kept = part.stat().st_size
    assert 0 < kept < size
    rows = {r["pair"]: r for r in json.loads(specchat(env, "list", "--json").stdout)}
    assert rows["big"]["target_status"].startswith("partly downloaded")

    fake.rate = 0
    first_log = len(fake.log)
    r = specchat(env, "pull", "big")
    assert r.returncode == 0, r.stderr
    sha = hashlib.sha256(files["big"]).hexdigest()
    resumed = [q for q in fake.log[first_log:] if q.method == "GET" and q.path.endswith(sha)]
    assert len(resumed) == 1 and resumed[0].range == f"bytes={kept}-"
    assert resumed[0].sent == size - kept  # only the rest came over the wire
    assert cached(env, BIG_REPO, "big-Q4_K_M.gguf").read_bytes() == files["big"]
    assert not list(blobs.glob("*.incomplete"))
    no_traffic_beyond_loopback(env)


def test_a_file_corrupted_on_disk_is_detected_and_fetched_again(env, fake, files):
    assert specchat(env, "pull", "tiny").returncode == 0
    path = cached(env, TINY_REPO, "target-Q8_0.gguf")
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    sha = fake.sha(TINY_REPO, "target-Q8_0.gguf")
    before = fake.bytes_sent(sha)
    r = specchat(env, "pull", "tiny")
    assert r.returncode == 0, r.stderr
    assert fake.bytes_sent(sha) - before == len(files["target"])
    assert path.read_bytes() == files["target"]


def test_a_download_corrupted_in_transit_is_fetched_again(tmp_path, fake, files):
    fake.corrupt_next.add("target-Q8_0.gguf")
    [path] = hub.pull_files([(TINY_REPO, "target-Q8_0.gguf")], cache=tmp_path, endpoint=fake.url)
    assert path.read_bytes() == files["target"]
    assert fake.bytes_sent(fake.sha(TINY_REPO, "target-Q8_0.gguf")) == 2 * len(files["target"])


def test_a_download_that_never_matches_its_hash_is_refused(tmp_path, fake):
    fake.corrupt_always.add("target-Q8_0.gguf")
    with pytest.raises(hub.HubError, match="failed its integrity check twice"):
        hub.pull_files([(TINY_REPO, "target-Q8_0.gguf")], cache=tmp_path, endpoint=fake.url)
    assert hub.cached_path(TINY_REPO, "target-Q8_0.gguf", tmp_path) is None


def test_a_pull_cut_mid_file_resumes_in_the_same_command(env, fake, files):
    """Two dropped connections: the one `specchat pull` goes on with Range requests and ends verified."""
    size, sha = len(files["big"]), hashlib.sha256(files["big"]).hexdigest()
    fake.cut["big-Q4_K_M.gguf"] = 2
    r = specchat(env, "pull", "big")
    assert r.returncode == 0, r.stderr
    gets = [q for q in fake.log if q.method == "GET" and q.path.endswith(sha)]
    assert [q.range for q in gets] == [None, f"bytes={size // 2}-", f"bytes={size // 2 + (size - size // 2) // 2}-"]
    assert sum(q.sent for q in gets) == size  # no byte came twice
    assert "Connection lost: resuming in 1 s (retry 1 of 5)" in r.stderr
    assert "resuming in 2 s (retry 2 of 5)" in r.stderr
    assert cached(env, BIG_REPO, "big-Q4_K_M.gguf").read_bytes() == files["big"]
    no_traffic_beyond_loopback(env)


def test_a_stalled_transfer_is_resumed(tmp_path, fake, files, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)  # the read timeout: silence this long = stalled
    monkeypatch.setattr(hub, "BACKOFF_S", 0.01)
    fake.stall["big-Q4_K_M.gguf"] = 5
    notes = []
    [path] = hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url,
                            on_progress=lambda p: p.note and notes.append(p.note))
    assert path.read_bytes() == files["big"]
    assert notes == ["Connection lost: resuming in 0.01 s (retry 1 of 5)."]
    gets = [q for q in fake.log if q.method == "GET" and "/lfs/" in q.path]
    assert [q.range for q in gets] == [None, f"bytes={len(files['big']) // 2}-"]


def test_a_busy_hub_is_asked_again_and_each_wait_is_said_as_it_begins(tmp_path, fake, files, monkeypatch):
    """huggingface_hub retries a 503 with backoff (1 s, then 2 s...), in silence: each wait is said as it starts,
    while the file is being looked up and, after the bytes, while it is linked into the cache."""
    fake.busy["big-Q4_K_M.gguf"] = 1
    notes = []
    [path] = hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url,
                            on_progress=lambda p: p.note and notes.append((p.done, p.note)))
    assert path.read_bytes() == files["big"]
    assert notes == [(0, "The Hub answered 503: trying again in 1 s (retry 1 of 5).")]
    fake.busy["big-Q4_K_M.gguf"] = 99  # more than the retries: the error says what the Hub answered
    from types import SimpleNamespace

    from huggingface_hub.utils import _http
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=lambda s: None))  # (its 23 s of waits, skipped)
    with pytest.raises(hub.HubError, match=r"answered 503 for tests/big/big-Q4_K_M.gguf. Try again later"):
        hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path / "again", endpoint=fake.url,
                       on_progress=lambda p: p.note and notes.append((p.done, p.note)))
    waits = [f"The Hub answered 503: trying again in {s} s (retry {i} of 5)." for i, s in enumerate((1, 2, 4, 8, 8), 1)]
    assert [n for _, n in notes[1:]] == waits


def test_a_pull_cut_more_often_than_the_retry_budget_stops_with_the_clear_message(tmp_path, fake, files, monkeypatch):
    monkeypatch.setattr(hub, "BACKOFF_S", 0.01)
    fake.cut["big-Q4_K_M.gguf"] = hub.RETRIES + 1
    with pytest.raises(hub.HubError, match=r"The connection to 127\.0\.0\.1:\d+ broke while downloading big-Q4_K_M\.gguf "
                                           r"\(RemoteProtocolError\) at [\d,]+ of 3,145,728 bytes\. .*run the pull again: "
                                           r"it resumes where it stopped\. \(gave up after 5 retries\)"):
        hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url)
    kept = hub.partial_bytes(BIG_REPO, "big-Q4_K_M.gguf", tmp_path)
    assert len(files["big"]) // 2 <= kept < len(files["big"])  # what came is kept for the next pull
    [path] = hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url)
    assert path.read_bytes() == files["big"]


def test_stop_interrupts_the_wait_between_retries(tmp_path, fake, monkeypatch):
    import threading

    monkeypatch.setattr(hub, "BACKOFF_S", 60)
    fake.cut["big-Q4_K_M.gguf"] = 1
    cancel = threading.Event()

    def on_progress(p):
        if p.note:
            cancel.set()  # the person presses Stop while we wait to retry

    start = time.monotonic()
    with pytest.raises(hub.DownloadCancelled):
        hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url,
                       on_progress=on_progress, cancel=cancel)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("repo,name,token,words", [
    ("tests/nope", "x.gguf", None, r"not found or is private \(401\).*set HF_TOKEN"),
    ("tests/private", "p.gguf", None, r"not found or is private \(401\).*set HF_TOKEN"),
    ("tests/private", "p.gguf", "hf_good", None),
    ("tests/private", "p.gguf", "hf_bad", r"refused the token \(401 invalid credentials\)"),
    ("tests/gated", "g.gguf", None, r"tests/gated is gated: accept its license at http://127\.0\.0\.1:\d+/tests/gated"),
    ("tests/gated", "g.gguf", "hf_good", r"is gated"),
    (TINY_REPO, "missing.gguf", None, r"has no file missing\.gguf \(404\)"),
])
def test_hub_errors_are_explained(tmp_path, fake, monkeypatch, repo, name, token, words):
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    if words is None:
        [path] = hub.pull_files([(repo, name)], cache=tmp_path, endpoint=fake.url)
        assert path.read_bytes() == b"GGUF"
        return
    with pytest.raises(hub.HubError, match=words):
        hub.pull_files([(repo, name)], cache=tmp_path, endpoint=fake.url)


def test_unreachable_hub_and_offline_mode_are_explained(env, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = specchat({**env, "HF_ENDPOINT": dead}, "pull", "tiny")
    assert r.returncode == 1 and "Cannot reach http://127.0.0.1" in r.stderr and "Traceback" not in r.stderr
    assert "Retrying in" not in r.stderr  # said at once, not after HfApi's five silent retries (23 s)
    r = specchat({**env, "HF_HUB_OFFLINE": "1"}, "pull", "tiny")
    assert r.returncode == 1 and "HF_HUB_OFFLINE is set" in r.stderr


def test_not_enough_disk_space_is_refused_before_downloading(tmp_path, fake, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda p: real(p)._replace(free=100 << 20))
    with pytest.raises(hub.HubError, match=r"Not enough disk space.*HF_HUB_CACHE"):
        hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url)
    assert not [q for q in fake.log if q.method == "GET"]


def test_cli_usage_errors(env):
    r = specchat(env, "pull")
    assert r.returncode == 1 and "Name a pair to pull" in r.stderr
    r = specchat(env, "pull", "nope")
    assert r.returncode == 1 and "Unknown pair 'nope'" in r.stderr
    r = specchat(env, "pull", "--repo", TINY_REPO)
    assert r.returncode == 1 and "--repo and --file" in r.stderr
    r = specchat(env, "pull", "--repo", TINY_REPO, "--file", "target-Q8_0.gguf")
    assert r.returncode == 0 and r.stdout.strip().endswith("target-Q8_0.gguf")
    r = specchat(env, "generate", "--pair", "big", "--prompt", "x")
    assert r.returncode == 1 and "specchat pull big" in r.stderr


def test_stop_keeps_the_partial_download_and_remove_frees_it(tmp_path, fake, files):
    import threading

    fake.rate = 1 << 20
    stop = threading.Event()

    def progress(p):
        if p.done > 0:
            stop.set()  # what the Models view's Stop button does

    with pytest.raises(hub.DownloadCancelled, match="run the pull again to resume"):
        hub.pull_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path, endpoint=fake.url, on_progress=progress,
                       cancel=stop)
    kept = hub.partial_bytes(BIG_REPO, "big-Q4_K_M.gguf", tmp_path)
    assert 0 < kept < len(files["big"])
    freed, removed = hub.remove_files([(BIG_REPO, "big-Q4_K_M.gguf")], cache=tmp_path)
    assert (freed, removed) == (kept, ["big-Q4_K_M.gguf"])
    assert hub.partial_bytes(BIG_REPO, "big-Q4_K_M.gguf", tmp_path) == 0
    assert not list((tmp_path / "models--tests--big").rglob("*.incomplete"))


RENAMED_REPO, CASE_REPO, SIDE_REPO = "tests/renamed-target", "tests/renamed-case", "tests/renamed-side"


def test_a_catalog_pair_whose_files_were_renamed_upstream_still_pulls(tmp_path, fake, files, env):
    """The catalog names a repo and a tag (or a file in yesterday's case); upstream the target became three shards
    in a Q8_0/ folder beside a UD- variant, the file took upper case, the draft moved into MTP/ with an mtp- prefix
    beside a model of the same tag. `specchat pull` resolves each against today's file list (as llama.cpp's -hf
    repo:TAG does), downloads every shard, and the pair loads from the cache."""
    shards = {f"Q8_0/Tiny-Q8_0-{i:05d}-of-00003.gguf": data
              for i, (_, data) in enumerate(sorted(files["shards"].items()), 1)}
    fake.add(RENAMED_REPO, {**shards, "Tiny-UD-Q8_0.gguf": files["draft"]})  # the UD file is not the plain tag's
    fake.add(CASE_REPO, {"Tiny-MXFP4.gguf": files["target"]})
    fake.add(SIDE_REPO, {"MTP/mtp-Tiny-Q8_0.gguf": files["draft"], "Tiny-Q8_0.gguf": files["target"]})
    catalog = tmp_path / "renamed.toml"
    catalog.write_text(f"""
[pairs.renamed]
description = "tagged entries"
license = "test"
target = {{ repo = "{RENAMED_REPO}", quantization = "q8_0", size_gb = 0.0003 }}
draft = {{ repo = "{SIDE_REPO}", quantization = "Q8_0", side_file = "mtp", size_gb = 0.0003 }}

[pairs.case]
description = "an explicit file named in yesterday's case"
license = "test"
target = {{ repo = "{CASE_REPO}", file = "tiny-mxfp4.gguf", quantization = "MXFP4", size_gb = 0.0003 }}
draft = {{ repo = "{SIDE_REPO}", quantization = "Q8_0", side_file = "mtp", size_gb = 0.0003 }}
""")
    env = {**env, "SPECCHAT_MODELS": str(catalog)}
    assert not json.loads(specchat(env, "list", "--json").stdout)[0]["ready"]
    r = specchat(env, "pull", "renamed")
    assert r.returncode == 0, r.stderr
    assert f"target: {RENAMED_REPO}/Q8_0/Tiny-Q8_0-00001-of-00003.gguf" in r.stderr and "3 files" in r.stderr
    assert f"draft: {SIDE_REPO}/MTP/mtp-Tiny-Q8_0.gguf" in r.stderr
    for name, data in shards.items():
        assert cached(env, RENAMED_REPO, name).read_bytes() == data
    assert cached(env, SIDE_REPO, "MTP/mtp-Tiny-Q8_0.gguf").read_bytes() == files["draft"]
    rows = {r["pair"]: r for r in json.loads(specchat(env, "list", "--json").stdout)}
    assert rows["renamed"]["ready"] and rows["renamed"]["target"] == f"{RENAMED_REPO}:q8_0"
    assert rows["case"]["draft_status"] == "downloaded" and rows["case"]["target_status"] == "not downloaded"
    g = specchat(env, "generate", "--pair", "renamed", "--prompt", "the cat", "--max-tokens", "8", "--json")
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout)["n_tokens"] == 8

    r = specchat(env, "pull", "case")
    assert r.returncode == 0, r.stderr
    assert cached(env, CASE_REPO, "Tiny-MXFP4.gguf").read_bytes() == files["target"]
    g = specchat(env, "generate", "--pair", "case", "--prompt", "the cat", "--max-tokens", "4", "--json")
    assert g.returncode == 0, g.stderr

    r = specchat(env, "remove", "renamed")
    assert "Removed 3 file(s)" in r.stdout and "Kept MTP/mtp-Tiny-Q8_0.gguf" in r.stdout, r.stdout
    no_traffic_beyond_loopback(env)


def test_a_tag_that_names_nothing_or_several_files_is_explained(tmp_path, fake, files, env):
    fake.add(RENAMED_REPO, {"Tiny-Q8_0.gguf": files["target"], "MTP/mtp-Tiny-Q8_0.gguf": files["draft"]})
    fake.add(CASE_REPO, {"a-Q8_0.gguf": files["target"], "b-Q8_0.gguf": files["draft"]})
    catalog = tmp_path / "stale.toml"
    catalog.write_text(f"""
[pairs.gone]
description = "a quantization the repo no longer has"
license = "test"
target = {{ repo = "{RENAMED_REPO}", quantization = "Q2_K", size_gb = 0.0003 }}

[pairs.twice]
description = "a tag two models carry"
license = "test"
target = {{ repo = "{CASE_REPO}", quantization = "Q8_0", size_gb = 0.0003 }}
""")
    env = {**env, "SPECCHAT_MODELS": str(catalog)}
    r = specchat(env, "pull", "gone")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (f"{RENAMED_REPO} has no Q2_K GGUF; it has: MTP/mtp-Tiny-Q8_0.gguf, Tiny-Q8_0.gguf. The catalog entry may "
            f"be out of date: see `specchat files {RENAMED_REPO}`.") in r.stderr
    r = specchat(env, "pull", "twice")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"Q8_0 fits more than one GGUF in {CASE_REPO}: a-Q8_0.gguf, b-Q8_0.gguf. Name it in full" in r.stderr
    assert not [q for q in fake.log if "/lfs/" in q.path]  # nothing was downloaded
    r = specchat(env, "generate", "--pair", "gone", "--prompt", "x")
    assert r.returncode == 1 and f"{RENAMED_REPO}:Q2_K is not downloaded yet" in r.stderr
    assert "specchat pull gone" in r.stderr


def test_a_pair_pulled_before_an_upstream_rename_keeps_working_and_pulls_the_new_files(tmp_path, fake, files, env):
    """Pulled at one revision; upstream then publishes the model as three shards under new names. Until the next pull
    the pair loads from the files it has (the cache's snapshot of the old revision); the next pull finds the new
    names by the same tag and the pair loads from them."""
    fake.add(RENAMED_REPO, {"tiny-q8_0.gguf": files["target"]}, commit="1" * 40)
    catalog = tmp_path / "moving.toml"
    catalog.write_text(f"""
[pairs.moving]
description = "a tag across an upstream rename"
license = "test"
target = {{ repo = "{RENAMED_REPO}", quantization = "Q8_0", size_gb = 0.0003 }}
draft = {{ repo = "{DRAFT_REPO}", file = "draft-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}
""")
    env = {**env, "SPECCHAT_MODELS": str(catalog)}
    assert specchat(env, "pull", "moving").returncode == 0
    assert cached(env, RENAMED_REPO, "tiny-q8_0.gguf").read_bytes() == files["target"]

    shards = {f"Tiny-Q8_0-{i:05d}-of-00003.gguf": data
              for i, (_, data) in enumerate(sorted(files["shards"].items()), 1)}
    fake.add(RENAMED_REPO, shards, commit="2" * 40)
    assert json.loads(specchat(env, "list", "--json").stdout)[0]["ready"]
    args = ("generate", "--pair", "moving", "--prompt", "the cat", "--max-tokens", "6", "--temperature", "0", "--json")
    before = specchat(env, *args)
    assert before.returncode == 0, before.stderr

    r = specchat(env, "pull", "moving")
    assert r.returncode == 0, r.stderr
    assert f"target: {RENAMED_REPO}/Tiny-Q8_0-00001-of-00003.gguf" in r.stderr
    snapshot = Path(env["HF_HUB_CACHE"]) / "models--tests--renamed-target" / "snapshots" / ("2" * 40)
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(shards)
    after = specchat(env, *args)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["token_ids"] == json.loads(before.stdout)["token_ids"]  # the same model, resplit
    assert "Removed 4 file(s)" in specchat(env, "remove", "moving").stdout  # today's three shards and the draft
    no_traffic_beyond_loopback(env)
