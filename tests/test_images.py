"""Images in the prompt (libmtmd): a tiny random-weight llama target with a llava-type projector the tests write,
proven first in llama.cpp's own llama-mtmd-cli; speculation on an image prompt stays exact; bad input gets words."""
from __future__ import annotations

import json
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from support import llama_tools
from support.tiny_gguf import write_model
from support.tiny_vision import png_bytes, write_png, write_projector, write_qwen2vl_projector

from app.engine import Engine, EngineError, GenerationParams, ModelSettings, SamplingParams
from app.engine.draft_control import DraftParams
from app.engine.drafters.ngram import NgramParams
from app.engine.images import prepare_image, text_view
from app.prompts import chat_tokens

MTMD_CLI = Path("/work/llama-ref/build/bin/llama-mtmd-cli")
GREEDY = GenerationParams(max_tokens=40, sampling=SamplingParams(temperature=0), draft=DraftParams(adaptive=False))
# prompt lookup with short keys, which find repeats in a tiny random model's short answers (llama.cpp's are 12 long)
SHORT_LOOKUP = GenerationParams(max_tokens=40, sampling=SamplingParams(temperature=0),
                                draft=DraftParams(adaptive=False, ngram=NgramParams(simple_size_n=2, simple_size_m=8)))


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-vision")
    return {
        "target": write_model(d / "target.gguf", seed=3),
        "draft": write_model(d / "draft.gguf", seed=4, base_seed=3, noise=0.3),  # same vocabulary, noisy copy
        "mmproj": write_projector(d / "mmproj-target.gguf", n_embd_text=64),
        "a": write_png(d / "a.png", seed=1),
        "b": write_png(d / "b.png", seed=2),
        "dir": d,
    }


@pytest.fixture(scope="module")
def mrope(tmp_path_factory):
    """Qwen2-VL's shape: M-RoPE positions, so an image takes fewer positions than cache cells."""
    d = tmp_path_factory.mktemp("tiny-qwen2vl")
    sections = (2, 3, 3, 0)
    return {
        "target": write_model(d / "target.gguf", seed=5, rope_sections=sections),
        "draft": write_model(d / "draft.gguf", seed=6, base_seed=5, noise=0.3, rope_sections=sections),
        "mmproj": write_qwen2vl_projector(d / "mmproj-target.gguf", n_embd_text=64),
        "a": write_png(d / "a.png", seed=1),
        "b": write_png(d / "b.png", seed=2),
    }


def _engine(files):
    return Engine(ModelSettings(files["target"], n_ctx=512), ModelSettings(files["draft"], n_ctx=512), files["mmproj"])


@pytest.fixture(scope="module")
def engine(vision):
    e = _engine(vision)
    yield e
    e.close()


@pytest.fixture(scope="module")
def mrope_engine(mrope):
    e = _engine(mrope)
    yield e
    e.close()


BOTH = pytest.mark.parametrize("kind", ["llava", "qwen2vl"])


def pick(request, kind):
    """The tiny set and its engine: llava's projector, or Qwen2-VL's (M-RoPE)."""
    if kind == "llava":
        return request.getfixturevalue("vision"), request.getfixturevalue("engine")
    return request.getfixturevalue("mrope"), request.getfixturevalue("mrope_engine")


def ask(image: bytes, text: str = "the cat sat on") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


def answer(engine, messages, drafter="none", params=GREEDY):
    engine.reset()
    ids = chat_tokens(engine.model, messages, engine.projector)
    return ids, list(engine.generate(ids, params, drafter))[-1]


def mtmd_cli(files, image, expected: str) -> str:
    """llama-mtmd-cli's greedy answer. It prints through llama.cpp's asynchronous log, which can lose its tail when
    the process exits on a busy machine (common/log.cpp says so), so it is asked up to five times for the whole."""
    outputs = []
    for _ in range(5):
        run = subprocess.run([str(MTMD_CLI), "-m", str(files["target"]), "--mmproj", str(files["mmproj"]), "--image",
                              str(files[image]), "-p", "the cat sat on", "-n", "8", "--temp", "0",
                              "-t", str(llama_tools.threads())],
                             capture_output=True, timeout=120, env=llama_tools.environment())
        assert run.returncode == 0, llama_tools.death_report("llama-mtmd-cli", run.returncode,
                                                             run.stderr.decode("utf-8", "replace"))
        outputs.append(run.stdout.decode("utf-8", "replace").strip())
        if outputs[-1] == expected:
            break
    assert all(expected.startswith(o) for o in outputs)  # a lost tail, never another answer
    return max(outputs, key=len)


@BOTH
@pytest.mark.skipif(not MTMD_CLI.exists(), reason="llama.cpp's reference llama-mtmd-cli is not built here")
def test_llama_mtmd_cli_reads_the_tiny_set_and_we_answer_as_it_does(request, kind):
    vision, engine = pick(request, kind)
    texts = []
    for key in ("a", "b"):
        _, done = answer(engine, ask(vision[key].read_bytes()), params=GenerationParams(
            max_tokens=8, sampling=SamplingParams(temperature=0)))
        cli = mtmd_cli(vision, key, done.text.strip())
        assert cli == done.text.strip()
        texts.append(cli)
    assert texts[0] != texts[1]  # the image matters


@BOTH
@pytest.mark.parametrize("drafter", ["model", "ngram-simple"])
def test_greedy_output_with_speculation_is_the_same_on_an_image_prompt(request, kind, drafter):
    _, engine = pick(request, kind)
    outputs, drafted = [], 0
    for seed in (1, 2):
        ids, off = answer(engine, ask(png_bytes(seed)))
        assert min(ids) < 0 and off.stats.prompt_tokens == len(ids)  # image positions count as prompt tokens
        _, on = answer(engine, ask(png_bytes(seed)), drafter, SHORT_LOOKUP)
        assert on.token_ids == off.token_ids and on.stats.drafter == drafter
        drafted += on.stats.n_drafted
        outputs.append(off.token_ids)
    assert drafted > 0  # (n-gram lookup finds nothing to repeat in one of the random answers)
    assert outputs[0] != outputs[1]  # two images, two answers


@BOTH
def test_sampling_with_speculation_on_an_image_prompt_keeps_the_target_distribution(request, kind):
    from test_exact_sampling import compare, samples

    _, engine = pick(request, kind)
    ids = chat_tokens(engine.model, ask(png_bytes(1)), engine.projector)
    plain, _ = samples(engine, ids, "none", seed0=10_000)
    spec, drafted = samples(engine, ids, "model", draft_max=3, adaptive=False)
    assert drafted > 0
    compare(plain, spec)


def test_the_draft_reads_the_text_around_the_image(engine):
    ids = chat_tokens(engine.model, ask(png_bytes(1)), engine.projector)
    n_image = engine.projector.n_tokens(min(ids))
    assert ids.count(min(ids)) == n_image == 16
    view = text_view(ids)
    assert min(view) >= 0 and len(view) == len(ids) - n_image
    assert view == [t for t in ids if t >= 0]


@BOTH
def test_a_second_turn_does_not_evaluate_the_image_again(request, kind):
    _, engine = pick(request, kind)
    first = ask(png_bytes(1))
    ids, done = answer(engine, first, "model")
    image_end = max(i for i, t in enumerate(ids) if t < 0) + 1
    turn2 = first + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "and the dog"}]
    ids2 = chat_tokens(engine.model, turn2, engine.projector)
    done2 = list(engine.generate(ids2, GREEDY, "model"))[-1]
    assert done2.stats.prompt_cached >= image_end
    assert done2.stats.prompt_tokens == len(ids2) - done2.stats.prompt_cached
    engine.reset()  # the same turn from an empty cache: the same answer
    assert list(engine.generate(ids2, GREEDY, "none"))[-1].token_ids == done2.token_ids


def test_a_model_without_a_projector_refuses_an_image_in_words(vision):
    e = Engine(ModelSettings(vision["target"], n_ctx=256))
    try:
        with pytest.raises(EngineError, match="takes no images"):
            chat_tokens(e.model, ask(png_bytes(1)), e.projector)
    finally:
        e.close()


def test_a_projector_for_another_model_or_a_damaged_one_is_a_clear_error(vision, tmp_path):
    wrong = write_projector(tmp_path / "mmproj-wrong.gguf", n_embd_text=32)
    with pytest.raises(EngineError, match="could not load the projector.*(n_embd|mismatch)"):
        Engine(ModelSettings(vision["target"], n_ctx=256), None, wrong)
    cut = tmp_path / "mmproj-cut.gguf"
    cut.write_bytes(vision["mmproj"].read_bytes()[:3000])
    with pytest.raises(EngineError, match="mmproj-cut.gguf"):
        Engine(ModelSettings(vision["target"], n_ctx=256), None, cut)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims a size and holds no pixels (a huge image without the memory)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data)))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_bad_images_get_one_clear_message_each(engine):
    png = png_bytes(1)
    cases = [(b"just some text", "not an image"), (png[: len(png) // 2], "damaged or cut short"),
             (_png_header(12_000, 9_000), "108 megapixels"), (b"", "empty")]
    for data, words in cases:
        with pytest.raises(EngineError, match=words):
            chat_tokens(engine.model, ask(data), engine.projector)
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="WEBP")
    with pytest.raises(EngineError, match="WEBP.*PNG or JPEG"):
        prepare_image(buf.getvalue())


def test_a_large_image_is_scaled_down_and_answered(engine):
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (5000, 40), (200, 30, 30)).save(buf, format="PNG")
    small = prepare_image(buf.getvalue())
    assert Image.open(io.BytesIO(small)).size == (4096, 33)
    _, done = answer(engine, ask(buf.getvalue()), "model")
    assert done.token_ids and done.finish_reason in ("length", "stop")


# --- the command line ---------------------------------------------------------------------------------------------
def cli(*args, timeout=300):
    import sys

    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def generate_json(vision, *flags) -> dict:
    r = cli("generate", "--target", vision["target"], "--chat", "-p", "the cat sat on", "-n", "24", "--temperature",
            "0", "--no-adaptive", "--json", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_generate_with_an_image_speculates_exactly_and_finds_the_projector_beside_the_target(vision):
    a = ("--image", vision["a"])
    off = generate_json(vision, *a, "--drafter", "none")  # mmproj-target.gguf sits beside the target: found
    on = generate_json(vision, "--draft", vision["draft"], "--mmproj", vision["mmproj"], *a)
    assert on["token_ids"] == off["token_ids"] and on["n_drafted"] > 0 and on["n_images"] == 1
    assert off["prompt_tokens"] > 16  # the image's 16 positions count as prompt tokens
    other = generate_json(vision, "--image", vision["b"], "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
                          "--spec-ngram-simple-size-m", "8")
    assert other["token_ids"] != off["token_ids"] and other["n_drafted"] > 0
    two = generate_json(vision, *a, "--image", vision["b"], "--drafter", "none")
    assert two["n_images"] == 2 and two["prompt_tokens"] == off["prompt_tokens"] + 16


def test_no_mmproj_turns_the_projector_off_and_an_image_is_refused_in_one_line(vision, tmp_path):
    r = cli("generate", "--target", vision["target"], "--no-mmproj", "-p", "hi", "--image", vision["a"], "-n", "4")
    assert_one_line_error(r, "takes no images")
    r = cli("generate", "--target", vision["target"], "-p", "hi", "--image", tmp_path / "missing.png", "-n", "4")
    assert_one_line_error(r, "Cannot read the image")
    bad = tmp_path / "bad.png"
    bad.write_bytes(png_bytes(1)[:200])
    r = cli("generate", "--target", vision["target"], "-p", "hi", "--image", bad, "-n", "4")
    assert_one_line_error(r, "damaged or cut short")


def assert_one_line_error(r, words):
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr


# --- the API ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(vision, specchat_home):
    from support.servers import specchat_serve

    models = ("--target", str(vision["target"]), "--draft", str(vision["draft"]), "--mmproj", str(vision["mmproj"]),
              "--ctx", "512")
    with specchat_serve(specchat_home, None, models=models) as url:
        yield url


def data_url(data: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat(url, image_url, n_max=None, text="the cat sat on"):
    import httpx

    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": text},
                                                      {"type": "image_url", "image_url": {"url": image_url}}]}],
            "max_tokens": 24, "temperature": 0}
    if n_max is not None:
        body["speculative.n_max"] = n_max
    return httpx.post(f"{url}/chat/completions", json=body, timeout=120)


def test_the_api_takes_a_data_url_and_answers_the_same_with_speculation_on_and_off(served):
    on, off = chat(served, data_url(png_bytes(1))), chat(served, data_url(png_bytes(1)), n_max=0)
    assert on.status_code == 200 and off.status_code == 200, on.text + off.text
    assert on.json()["choices"][0]["message"]["content"] == off.json()["choices"][0]["message"]["content"]
    t_on, t_off = on.json()["timings"], off.json()["timings"]
    assert t_on["draft_n"] > 0 and t_off["draft_n"] == 0
    # the image's 16 positions are prompt tokens, as llama-server counts them (the cached prefix left out)
    assert off.json()["usage"]["prompt_tokens"] > 16
    other = chat(served, data_url(png_bytes(2)))
    assert other.json()["choices"][0]["message"]["content"] != on.json()["choices"][0]["message"]["content"]
    import httpx

    props = httpx.get(served.removesuffix("/v1") + "/props", timeout=30).json()
    assert props["modalities"]["vision"] is True  # as llama-server says it takes images


def test_the_api_refuses_a_remote_image_url_and_bad_images_with_a_400_in_words(served):
    r = chat(served, "https://example.com/cat.png")
    assert r.status_code == 400 and "not fetched" in r.json()["error"]["message"]
    r = chat(served, "data:image/png;base64,@@@")
    assert r.status_code == 400 and "base64" in r.json()["error"]["message"]
    r = chat(served, data_url(b"GIF89a but not really"))
    assert r.status_code == 400 and "not an image" in r.json()["error"]["message"]
    assert chat(served, data_url(png_bytes(1))).status_code == 200  # and it keeps serving


def anthropic(url, source, text="the cat sat on"):
    import httpx

    body = {"model": "x", "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": text}, {"type": "image", "source": source}]}]}  # in chat()'s order
    return httpx.post(f"{url}/messages", json=body, timeout=120)


def test_anthropic_image_blocks_take_the_chat_endpoints_path(served):
    """/v1/messages: a base64 image block answers as the same image as an OpenAI part does; a url source is refused
    as a remote image_url is."""
    import base64

    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_bytes(1)).decode()}
    r = anthropic(served, source)
    assert r.status_code == 200, r.text
    openai = chat(served, data_url(png_bytes(1)), text="the cat sat on").json()["choices"][0]["message"]["content"]
    assert r.json()["content"][0]["text"] == openai
    other = anthropic(served, {**source, "data": base64.b64encode(png_bytes(2)).decode()})
    assert other.json()["content"][0]["text"] != openai  # the image is read
    r = anthropic(served, {"type": "url", "url": "https://example.com/cat.png"})
    assert r.status_code == 400 and "not fetched" in r.json()["error"]["message"]
    r = anthropic(served, {"type": "base64", "media_type": "image/png"})
    assert r.status_code == 400 and "an image block needs a source" in r.json()["error"]["message"]


def test_an_image_for_a_model_without_a_projector_is_a_400(vision, specchat_home):
    from support.servers import specchat_serve

    with specchat_serve(specchat_home, None, models=("--target", str(vision["target"]), "--no-mmproj")) as url:
        r = chat(url, data_url(png_bytes(1)))
        assert r.status_code == 400 and "takes no images" in r.json()["error"]["message"]


@BOTH
def test_another_image_in_the_same_place_is_evaluated_afresh(request, kind):
    _, engine = pick(request, kind)
    answer(engine, ask(png_bytes(1)), "model")  # leaves image 1 and its answer in the cache
    ids = chat_tokens(engine.model, ask(png_bytes(2)), engine.projector)
    cached = list(engine.generate(ids, GREEDY, "model"))[-1]
    assert cached.stats.prompt_cached <= ids.index(min(ids))  # the text before the image, no more
    engine.reset()
    assert list(engine.generate(ids, GREEDY, "none"))[-1].token_ids == cached.token_ids


def test_chat_in_the_terminal_takes_an_image_with_the_first_message(vision):
    import sys

    args = ["chat", "--target", vision["target"], "--draft", vision["draft"], "--image", vision["a"], "-n", "8",
            "--temperature", "0"]
    r = subprocess.run([sys.executable, "-m", "app", *map(str, args)], input="the cat sat on\nand then\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("drafter model") == 2  # two answers, each with its summary line
    first = generate_json(vision, "--image", vision["a"], "-n", "8", "--drafter", "none")
    assert r.stdout.startswith("> " + first["text"])  # the first answer saw the image, as generate's does


def test_a_grammar_on_an_image_prompt_stays_exact_with_speculation(engine):
    from dataclasses import replace

    from app.engine.grammar import Grammar

    grammar = Grammar.gbnf('root ::= ("the" | " cat" | " dog" | " sat" | " on" | " mat" | "," | ".")+')
    params = replace(GREEDY, grammar=grammar)
    _, off = answer(engine, ask(png_bytes(1)), "none", params)
    assert off.text.strip() and set(off.text) <= set("the cat dog sat on mat,.")  # (max_tokens may cut a word)
    for drafter in ("model", "ngram"):
        _, on = answer(engine, ask(png_bytes(1)), drafter, params)
        assert on.token_ids == off.token_ids and on.stats.n_drafted > 0


def test_the_pair_check_judges_the_projector_from_its_header(vision, tmp_path):
    r = cli("check", "--target", vision["target"], "--draft", vision["draft"])  # the projector beside it is found
    assert r.returncode == 0, r.stderr
    assert "projector: mmproj-target.gguf [mlp" in r.stdout and "takes images into this target's 64-wide" in r.stdout
    wrong = write_projector(tmp_path / "mmproj-wrong.gguf", n_embd_text=32)
    r = cli("check", "--target", vision["target"], "--mmproj", wrong)
    assert "made for a model 32 wide, not this target (64): it will be refused" in r.stdout
    assert "projector" not in cli("check", "--target", vision["target"], "--no-mmproj").stdout


def test_the_runtime_answers_a_message_with_image_parts_as_the_ui_will_send_it(vision, engine):
    """The app's core below any UI: a chat message whose content holds text and image parts (images as bytes)."""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    rt = Runtime()
    rt.load(LoadSpec(target=str(vision["target"]), draft=str(vision["draft"]), ctx=512))  # projector found beside
    try:
        assert rt.info()["mmproj"] == "mmproj-target.gguf"
        settings = Settings(max_tokens=24, temperature=0.0, adaptive=False)
        *_, live = rt.answer(ask(png_bytes(1)), settings)
        _, plain = answer(engine, ask(png_bytes(1)), "none", GenerationParams(
            max_tokens=24, sampling=SamplingParams(temperature=0)))
        assert live.done.token_ids == plain.token_ids and live.stats.n_drafted > 0
    finally:
        rt.close()


def test_compare_encodes_the_prompts_image_once_and_both_runs_start_from_it(vision, monkeypatch):
    """Compare's runs start from the same cache, holding the prompt's images and nothing else: the image a chat turn
    encoded is not encoded again, and a fresh Compare encodes it once, before either run."""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.engine.llama.vision import Projector
    from app.models.loader import LoadSpec

    encoded = []
    evaluate = Projector.evaluate
    monkeypatch.setattr(Projector, "evaluate", lambda self, *a, **k: (encoded.append(a[1]), evaluate(self, *a, **k)))
    rt = Runtime()
    rt.load(LoadSpec(target=str(vision["target"]), draft=str(vision["draft"]), ctx=512))
    try:
        settings = Settings(max_tokens=24, temperature=0.0, adaptive=False)
        *_, live = rt.answer(ask(png_bytes(1)), settings)
        assert len(encoded) == 1
        *_, cmp = rt.compare(ask(png_bytes(1)), settings)
        assert len(encoded) == 1  # the chat's image served both runs
        ids = chat_tokens(rt.engine.model, ask(png_bytes(1)), rt.engine.projector)
        n_image = max(i for i, tok in enumerate(ids) if tok < 0) + 1
        for side in (cmp.off, cmp.on):
            assert side.done.token_ids == live.done.token_ids and side.stats.prompt_cached == n_image
        assert cmp.on.stats.n_drafted > 0 and cmp.off.stats.n_drafted == 0
        *_, cmp = rt.compare(ask(png_bytes(2)), settings)  # another image: encoded once for both
        assert len(encoded) == 2 and cmp.off.done.token_ids == cmp.on.done.token_ids
    finally:
        rt.close()


def test_keeping_an_image_prefix_on_a_recurrent_target_restores_it_without_encoding_again(tmp_path, monkeypatch):
    """Engine.reset(keep) on a hybrid target (Qwen3.5's gated DeltaNet): the prefix through the image is held with a
    checkpoint, so each run after it goes back there instead of reading the image again."""
    from support.heads import HEADS

    from app.engine.images import through_images
    from app.engine.llama.vision import Projector

    target = HEADS["mtp"].write(tmp_path)[0]
    e = Engine(ModelSettings(target, n_ctx=512), None, write_projector(tmp_path / "mmproj.gguf", n_embd_text=64))
    encoded = []
    evaluate = Projector.evaluate
    monkeypatch.setattr(Projector, "evaluate", lambda self, *a, **k: (encoded.append(a[1]), evaluate(self, *a, **k)))
    try:
        assert e.model.recurrent
        ids = chat_tokens(e.model, ask(png_bytes(1)), e.projector)
        keep = ids[: through_images(ids)]
        runs = []
        for drafter in ("none", "mtp", "none"):
            e.reset(keep)
            runs.append(list(e.generate(ids, GREEDY, drafter))[-1])
            assert runs[-1].stats.prompt_cached == len(keep)
        assert len(encoded) == 1 and runs[0].token_ids == runs[1].token_ids == runs[2].token_ids
        assert runs[1].stats.n_drafted > 0
    finally:
        e.close()


def test_the_apps_runtime_sends_images_to_a_server_that_reads_them(served, vision):
    """The app's core with a server as its backend (here `specchat serve` with the tiny vision set): /props says it
    reads images, the chat sends them inline, and the answer is the local engine's; Compare gets them too."""
    from app.chat.runtime import Runtime
    from app.chat.settings import Settings
    from app.models.loader import LoadSpec

    rt = Runtime()
    try:
        rt.load(LoadSpec(server=served))
        assert rt.takes_images
        settings = Settings(max_tokens=24, temperature=0.0)
        answers = [list(rt.answer(ask(png_bytes(seed)), settings))[-1] for seed in (1, 2)]
        assert all(a.done.finish_reason in ("stop", "length") and a.stats.n_drafted > 0 for a in answers)
        assert answers[0].text != answers[1].text  # the server read each image
        local = Runtime()
        try:
            local.load(LoadSpec(target=str(vision["target"]), draft=str(vision["draft"]), ctx=512))
            assert list(local.answer(ask(png_bytes(1)), settings))[-1].text == answers[0].text
        finally:
            local.close()
        cmp = list(rt.compare(ask(png_bytes(2)), settings))[-1]
        assert cmp.off.text == cmp.on.text == answers[1].text
    finally:
        rt.close()


def test_a_server_whose_model_takes_no_images_says_so_before_anything_is_sent(specchat_home):
    from support.servers import specchat_serve

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec

    with specchat_serve(specchat_home, None) as url:  # the starter pair: no projector
        rt = Runtime()
        try:
            rt.load(LoadSpec(server=url))
            assert not rt.takes_images
        finally:
            rt.close()


def test_generate_with_a_server_sends_the_image_inline(served, vision):
    r = cli("generate", "--server", served, "--image", vision["a"], "--prompt", "the cat sat on", "-n", "24",
            "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    remote = json.loads(r.stdout)
    local = generate_json(vision, "--draft", vision["draft"], "--image", vision["a"])  # (a chat turn, as served)
    assert remote["text"] == local["text"] and remote["n_drafted"] > 0
