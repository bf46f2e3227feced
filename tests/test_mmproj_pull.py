"""Vision projectors come down with their model, as llama.cpp's `-hf` fetches a repo's mmproj file: a catalog target's
`mmproj = true` (or a named file), `specchat pull -hf`, `--no-mmproj`; the pulled pair then reads images. Against the
local stand-in for the Hub (tests/support/fake_hub.py) with the real huggingface_hub client and tiny real files: the
tiny target of test_hub.py and projectors for it from tests/support/tiny_vision.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_vision import write_png, write_projector
from test_hub import DRAFT_REPO, ROOT, TINY_REPO, cached, env, fake, files, no_traffic_beyond_loopback, specchat  # noqa: F401

from app.engine import EngineError
from app.models import hf_files
from app.models.catalog import load_catalog

VISION_REPO, TWO_REPO = "tests/tiny-vision", "tests/two-projectors"


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-files")
    return {"f16": write_projector(d / "a.gguf", n_embd_text=64, seed=7).read_bytes(),
            "q8_0": write_projector(d / "b.gguf", n_embd_text=64, seed=8).read_bytes(),
            "image": write_png(d / "cat.png", seed=1)}


@pytest.fixture
def hub_env(tmp_path, fake, files, vision, env):
    """The target in a Q8_0/ folder with its projector at the repo's top (llama.cpp looks in the model's folder and
    above); a repo with two projectors beside the model; pairs of both in a catalog."""
    fake.add(VISION_REPO, {"Q8_0/Tiny-Q8_0.gguf": files["target"], "mmproj-F16.gguf": vision["f16"]})
    fake.add(TWO_REPO, {"Tiny-Q8_0.gguf": files["target"], "mmproj-F16.gguf": vision["f16"],
                        "mmproj-Q8_0.gguf": vision["q8_0"]})
    catalog = tmp_path / "vision.toml"
    draft = f'{{ repo = "{DRAFT_REPO}", file = "draft-Q8_0.gguf", quantization = "F32", size_gb = 0.0003 }}'
    catalog.write_text(f"""
[pairs.vis]
description = "a target and its projector"
license = "test"
target = {{ repo = "{VISION_REPO}", quantization = "Q8_0", size_gb = 0.0003, mmproj = true }}
draft = {draft}

[pairs.named]
description = "a projector named in full (in another case): not the one the rule picks"
license = "test"
target = {{ repo = "{TWO_REPO}", quantization = "Q8_0", size_gb = 0.0003, mmproj = {{ file = "mmproj-f16.gguf" }} }}

[pairs.gone]
description = "a projector the repo no longer has"
license = "test"
target = {{ repo = "{TWO_REPO}", quantization = "Q8_0", size_gb = 0.0003, mmproj = {{ file = "mmproj-F32.gguf" }} }}

[pairs.plain]
description = "mmproj = true on a repo without one"
license = "test"
target = {{ repo = "{TINY_REPO}", file = "target-Q8_0.gguf", quantization = "F32", size_gb = 0.0003, mmproj = true }}
draft = {draft}
""")
    return {**env, "SPECCHAT_MODELS": str(catalog)}


def snapshot(env, repo) -> list[str]:
    folder = Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "snapshots"
    return sorted(p.relative_to(s).as_posix() for s in folder.iterdir() for p in s.rglob("*") if p.is_file())


def generate(env, *args):
    return specchat(env, "generate", *args, "--prompt", "the cat", "--max-tokens", "4", "--temperature", "0", "--json")


# llama.cpp's find_best_mmproj: the model's folder or above, deepest first; then closest in bits; then first by name.
LISTING = [("Q4_K_M/M-Q4_K_M.gguf", 5), ("M-Q8_0.gguf", 8), ("M-F16.gguf", 9), ("mmproj-F16.gguf", 1),
           ("mmproj-BF16.gguf", 1), ("mmproj-F32.gguf", 1), ("Q4_K_M/mmproj-M-Q8_0.gguf", 1),
           ("other/mmproj-Q4_0.gguf", 1), ("M-imatrix.gguf", 1)]


@pytest.mark.parametrize("model,projector", [
    ("Q4_K_M/M-Q4_K_M.gguf", "Q4_K_M/mmproj-M-Q8_0.gguf"),  # its own folder before the top
    ("M-Q8_0.gguf", "mmproj-BF16.gguf"),  # 16 bits both: the first by name; not other/ (not above the model)
    ("M-F16.gguf", "mmproj-BF16.gguf"),
])
def test_the_projector_is_picked_as_llama_cpps_hf_picks_it(model, projector):
    choices = hf_files.group("o/r", LISTING)
    assert hf_files.projector(choices, model).file == projector
    assert [c.file for c in hf_files.models(choices)] == ["Q4_K_M/M-Q4_K_M.gguf", "M-Q8_0.gguf", "M-F16.gguf"]
    assert hf_files.projector(hf_files.models(choices), model) is None  # no projector: none
    assert hf_files.projector(hf_files.group("o/r", [("M-Q8_0.gguf", 8), ("mmproj-F32.gguf", 1),
                                                     ("mmproj-F16.gguf", 1)]), "M-Q8_0.gguf").file == "mmproj-F16.gguf"


@pytest.mark.parametrize("mmproj,words", [
    ("'yes'", "mmproj must be true"),
    ("{ file = 'proj.bin' }", "mmproj must be true"),
    ("{ repo = 'a/b', file = 'p.gguf', size = 1 }", "mmproj must be true"),
])
def test_bad_projector_entries_are_explained(tmp_path, mmproj, words):
    f = tmp_path / "models.toml"
    f.write_text(f"[pairs.x]\ntarget = {{ repo = 'a/b', quantization = 'Q4_K_M', mmproj = {mmproj} }}\n")
    with pytest.raises(EngineError, match=words):
        load_catalog(f)
    f.write_text("[pairs.x]\ntarget = { repo = 'a/b', quantization = 'Q4_K_M' }\n"
                 "draft = { repo = 'a/c', quantization = 'Q8_0', mmproj = true }\n")
    with pytest.raises(EngineError, match="only the target carries a vision projector"):
        load_catalog(f)
    f.write_text("[pairs.x]\ntarget = { builtin = 'smollm2-135m-instruct-f32', mmproj = true }\n")
    with pytest.raises(EngineError, match="only a Hub target has a vision projector"):
        load_catalog(f)


def test_a_pair_pulls_its_projector_and_reads_images_and_no_mmproj_leaves_it_out(hub_env, fake, files, vision):
    image = ("--image", str(vision["image"]))
    r = specchat(hub_env, "pull", "vis", "--no-mmproj")
    assert r.returncode == 0, r.stderr
    assert "projector" not in r.stderr and snapshot(hub_env, VISION_REPO) == ["Q8_0/Tiny-Q8_0.gguf"]
    row = {p["pair"]: p for p in json.loads(specchat(hub_env, "list", "--json").stdout)}["vis"]
    assert row["ready"] and row["images"] == "reads images with its projector, not downloaded"
    r = generate(hub_env, "--pair", "vis", *image)
    assert r.returncode == 1 and "takes no images" in r.stderr and "Traceback" not in r.stderr

    r = specchat(hub_env, "pull", "vis")
    assert r.returncode == 0, r.stderr
    assert f"projector: {VISION_REPO}/mmproj-F16.gguf" in r.stderr and "mmproj-F16.gguf" in r.stdout
    assert cached(hub_env, VISION_REPO, "mmproj-F16.gguf").read_bytes() == vision["f16"]
    assert "images: reads images (mmproj-F16.gguf)" in specchat(hub_env, "list").stdout
    # The projector sits above the target's folder: the catalog finds it where a look beside the target would not.
    with_image = generate(hub_env, "--pair", "vis", *image)
    assert with_image.returncode == 0, with_image.stderr
    out = json.loads(with_image.stdout)
    assert out["n_images"] == 1 and out["prompt_tokens"] > 16  # the image's 16 positions
    text = json.loads(generate(hub_env, "--pair", "vis").stdout)
    assert text["prompt_tokens"] < out["prompt_tokens"] and text["n_images"] == 0

    r = specchat(hub_env, "remove", "vis")
    assert "Removed 3 file(s)" in r.stdout, r.stdout
    assert not list((Path(hub_env["HF_HUB_CACHE"]) / "models--tests--tiny-vision" / "blobs").iterdir())
    no_traffic_beyond_loopback(hub_env)


def test_hf_takes_the_projector_closest_to_the_model_and_a_named_one_is_taken_as_named(hub_env, fake, files, vision):
    r = specchat(hub_env, "pull", "-hf", f"{TWO_REPO}:Q8_0", "--no-mmproj")
    assert r.returncode == 0, r.stderr
    assert snapshot(hub_env, TWO_REPO) == ["Tiny-Q8_0.gguf"]
    r = specchat(hub_env, "pull", "-hf", f"{TWO_REPO}:Q8_0")
    assert r.returncode == 0, r.stderr
    assert f"projector: {TWO_REPO}/mmproj-Q8_0.gguf" in r.stderr  # 8 bits from the Q8_0 model, F16 is 8 further
    assert snapshot(hub_env, TWO_REPO) == ["Tiny-Q8_0.gguf", "mmproj-Q8_0.gguf"]
    assert cached(hub_env, TWO_REPO, "mmproj-Q8_0.gguf").read_bytes() == vision["q8_0"]
    target = cached(hub_env, TWO_REPO, "Tiny-Q8_0.gguf")
    r = generate(hub_env, "--target", str(target), "--image", str(vision["image"]))  # found beside the target
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_images"] == 1

    r = specchat(hub_env, "pull", "named")
    assert r.returncode == 0, r.stderr
    assert f"projector: {TWO_REPO}/mmproj-F16.gguf" in r.stderr
    r = generate(hub_env, "--pair", "named", "--image", str(vision["image"]))  # two beside it: the named one
    assert r.returncode == 0 and json.loads(r.stdout)["n_images"] == 1, r.stderr
    r = specchat(hub_env, "pull", "gone")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (f"{TWO_REPO} has no projector mmproj-F32.gguf; its projectors: mmproj-F16.gguf, mmproj-Q8_0.gguf"
            in r.stderr)
    no_traffic_beyond_loopback(hub_env)


def test_a_repo_without_a_projector_pulls_as_before(hub_env, fake, files):
    r = specchat(hub_env, "pull", "plain")
    assert r.returncode == 0, r.stderr
    assert "projector" not in r.stderr and len(r.stdout.split()) == 2  # the target and the draft
    r = specchat(hub_env, "pull", "-hf", f"{TINY_REPO}:Q8_0")
    assert r.returncode == 0 and "projector" not in r.stderr and len(r.stdout.split()) == 1, r.stderr
    assert snapshot(hub_env, TINY_REPO) == ["target-Q8_0.gguf"]
    assert json.loads(generate(hub_env, "--pair", "plain").stdout)["n_tokens"] == 4


def test_the_models_tab_downloads_the_projector_with_its_progress(hub_env, vision):
    """The app's Models tab: a catalog pair and a target picked from the Hub come down with their projector, each
    file with its own progress bar."""
    script = """
from app.ui.models_tab import ModelsView
view = ModelsView(lambda request: "tab", lambda: None)
*_, (html, *_) = view.pull_pair("vis", None)
print(html)
*_, (html, _, _, target, *_) = view.pull_file("%s", "Tiny-Q8_0.gguf", "target", None, None)
print(html)
print(target)
""" % TWO_REPO
    r = subprocess.run([sys.executable, "-c", script], env={**hub_env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pair_html, file_html, target = r.stdout.strip().splitlines()[-3:]
    assert 'data-file="mmproj-F16.gguf"' in pair_html and "Downloaded and verified 3 file(s)" in pair_html
    assert 'data-file="mmproj-Q8_0.gguf"' in file_html and "Downloaded and verified 2 file(s)" in file_html
    assert Path(target).name == "Tiny-Q8_0.gguf" and (Path(target).parent / "mmproj-Q8_0.gguf").is_file()
    assert cached(hub_env, VISION_REPO, "mmproj-F16.gguf").read_bytes() == vision["f16"]
