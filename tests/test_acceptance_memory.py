"""How a pair's drafters' tokens fared, kept across launches (``acceptance_memory``): the real engine on tiny GGUF
pairs the tests write, the real file in the app's data folder."""
import json
import math
import shutil
from pathlib import Path

import pytest

from app.chat.acceptance_memory import FILE, memory_for
from app.chat.method_ranking import pair_key
from app.engine import Done, DraftParams, Engine, GenerationParams, ModelSettings
from app.engine.measured import Measured
from app.paths import data_dir

PROMPT = [1, 5, 9, 13, 17, 21, 25, 29]
ADAPTIVE = GenerationParams(max_tokens=60, draft=DraftParams(draft_max=8, draft_p_min=0.0, adaptive=True))


@pytest.fixture
def pair_files(models, tmp_path):
    """Copies of the tiny pairs' files that no other test loads (the memory is per file: path and size)."""
    return {name: Path(shutil.copy(models[name], tmp_path / f"{name}.gguf"))
            for name in ("target", "close_draft", "draft")}


def launch(files, draft="close_draft") -> Engine:
    """What loading the pair does (``load_engine`` with the memory for its files)."""
    target, d = files["target"], files[draft]
    return Engine(ModelSettings(target, n_ctx=512), ModelSettings(d, n_ctx=512), memory=memory_for(target, d))


def answer(engine: Engine) -> Done:
    *_, done = engine.generate(PROMPT, ADAPTIVE, "model")
    assert isinstance(done, Done) and done.stats.n_drafted > 0
    return done


def test_the_first_answer_after_a_launch_starts_from_what_the_last_launch_learned(pair_files):
    first = launch(pair_files)
    try:
        answer(first)
        learned = first._measured_for("model")
        kept = learned.profile()
    finally:
        first.close()
    entry = json.loads((data_dir() / FILE).read_text())
    assert any(e.get("model", {}).get("profile") == json.loads(json.dumps({**kept, "offload": [0, 0]}))
               for e in entry.values())  # (with the layers each model offloaded: see the next test)
    assert kept["judged"] > 0 and sum(acc for acc, _ in kept["buckets"]) > 0

    again = launch(pair_files)
    try:
        m = again._measured_for("model")
        assert m.profile() == json.loads(json.dumps(kept))  # how its tokens fared: from the last launch...
        assert not m.fresh() and not m.verify  # ...its costs, the host's: timed again
        answer(again)
    finally:
        again.close()
    other = launch(pair_files, draft="draft")  # another pair (other files) starts from the drafter's priors
    try:
        assert other._measured_for("model").judged == 0
    finally:
        other.close()


def test_what_a_long_batch_weighed_is_kept_for_the_same_offload_only(pair_files):
    """A long verification batch's weight against a plain step (``Measured.long_batch``) is the kernels': one timed
    on the CPU says nothing of a launch that offloads layers to a GPU (-ngl), whose long batches cost far less."""
    first = launch(pair_files)
    try:
        answer(first)
    finally:
        first.close()
    path = data_dir() / FILE
    saved = json.loads(path.read_text())
    entry = saved[pair_key(pair_files["target"], pair_files["close_draft"])]
    entry["model"]["profile"]["long_batch"] = [0.9, 0.01]
    for offload, kept in (([0, 0], (0.9, 0.01)), ([99, 99], None)):
        entry["model"]["profile"]["offload"] = offload
        path.write_text(json.dumps(saved))
        again = launch(pair_files)
        try:
            m = again._measured_for("model")
            assert m.kept_long_batch == kept and m.judged > 0  # (the rest of the profile adopted either way)
        finally:
            again.close()
    entry["model"]["profile"] = "edited by hand"  # not a profile at all: the priors, and the answer goes on
    path.write_text(json.dumps(saved))
    again = launch(pair_files)
    try:
        assert again._measured_for("model").judged == 0
        answer(again)
    finally:
        again.close()


def test_a_damaged_memory_is_set_aside_and_the_answer_goes_on(pair_files):
    path = data_dir() / FILE
    path.write_text("{ not json")
    engine = launch(pair_files)
    try:
        assert engine._measured_for("model").judged == 0
        answer(engine)  # and it keeps what this launch learned in a fresh file
    finally:
        engine.close()
    assert json.loads(path.read_text())
    assert list(path.parent.glob(f"{FILE}.corrupt-*"))


def test_a_profile_of_the_wrong_shape_is_left_out():
    m = Measured()
    m.per_bucket(2)
    good = {"first": [1.0, 2.0], "after": [[0.5, 0.5], [1.0, 0.0]], "buckets": [[1.0, 2.0], [3.0, 3.0]],
            "accepted": 4.0, "judged": 5.0}
    bad = [{**good, "after": [[0.5], [1.0, 0.0]]}, {**good, "buckets": [[3.0, 2.0], [3.0, 3.0]]},
           {**good, "first": [-1.0, 2.0]}, {**good, "first": [math.nan, 2.0]}, {**good, "accepted": 6.0},
           {**good, "first": "ab"}, {**good, "judged": None}, {k: v for k, v in good.items() if k != "after"}, {},
           {**good, "long_batch": [0.9]}, {**good, "long_batch": [-0.1, 0.05]}, {**good, "long_batch": [0.9, 0.0]},
           {**good, "long_batch": [math.nan, 0.05]}, {**good, "long_batch": "ab"}]
    for profile in bad:
        assert not m.adopt(profile) and m.judged == 0.0 and m.first == [0.0, 0.0] and m.kept_long_batch is None
    assert m.adopt(json.loads(json.dumps(good))) and m.profile() == good
    timed = {**good, "long_batch": [0.9, 0.05]}  # what a long batch's positions weighed, at what plain step
    assert m.adopt(json.loads(json.dumps(timed))) and m.profile() == timed and m.kept_long_batch == (0.9, 0.05)


def test_bench_says_when_adaptive_drafting_started_from_a_kept_profile(pair_files, tmp_path):
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat", "category": "a", "chat": false}\n')

    def bench(*more):
        r = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(pair_files["target"]), "--draft",
                            str(pair_files["close_draft"]), "--prompts", str(prompts), "--max-tokens", "24",
                            "--draft-p-min", "0", "--adaptive", *more], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert json.loads(bench("--json"))["draft"]["started_from_kept"] is False  # (a first launch: the priors)
    assert json.loads(bench("--json"))["draft"]["started_from_kept"] is True
    assert "started from how this drafter's tokens fared on this pair in earlier launches" in bench()


def test_a_profile_this_launch_kept_is_not_taken_for_an_earlier_launchs_after_the_threads_change(pair_files):
    """On a busy machine the target's threads follow the free cores: a new thread count starts a new Measured, which
    finds the profile this same launch kept. It may start from it, but it is no earlier launch's (CI met this: bench's
    first launch said it started from a kept profile)."""
    engine = launch(pair_files)
    try:
        answer(engine)  # keeps this launch's profile
        assert not engine.started_from_kept("model")
        ctx = engine._pair.target.ctx
        ctx.set_threads(ctx.n_threads + 1)  # what the thread chooser does when the machine gets quieter or busier
        assert engine._measured_for("model").judged > 0  # this launch's profile, adopted at the new thread count
        assert not engine.started_from_kept("model")
    finally:
        engine.close()
    again = launch(pair_files)
    try:
        again._measured_for("model")
        assert again.started_from_kept("model")  # an earlier launch's, in the next launch
    finally:
        again.close()
