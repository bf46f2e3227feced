"""Heads draft on prompts with images (issue 39): MTP layers, EAGLE-3, Gemma 4's assistant and the block drafts read
the target's own state, which saw the image, so they keep drafting where a draft model only sees the text around it.
Each tiny head of support.heads gets a projector for its target (llava's type, written by support.tiny_vision):
greedy output identical to speculation off with drafts accepted, a second turn that keeps the image in the cached
prefix, the target's distribution when sampling (MTP), and a chain with prompt lookup."""
import pytest
from support.heads import HEADS, run
from support.tiny_vision import png_bytes, write_projector

from app.engine import Engine, GenerationParams, ModelSettings, SamplingParams
from app.prompts import chat_tokens


@pytest.fixture(scope="module", params=list(HEADS))
def head(request):
    return HEADS[request.param]


@pytest.fixture(scope="module")
def engine(head, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{head.name}-vision")
    target, file = head.write(folder)
    probe = Engine(ModelSettings(target, n_ctx=256))
    n_embd = probe.model.n_embd
    probe.close()
    e = Engine(ModelSettings(target, n_ctx=1024), file and ModelSettings(file, n_ctx=1024),
               write_projector(folder / "mmproj.gguf", n_embd_text=n_embd))
    yield e
    e.close()


def ask(image: bytes, text: str = "the cat sat on the mat") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


def test_greedy_drafting_on_an_image_prompt_is_token_identical_to_plain(head, engine):
    answers = []
    for seed in (1, 2):
        ids = chat_tokens(engine.model, ask(png_bytes(seed)), engine.projector)
        assert min(ids) < 0  # the image's positions
        engine.reset()
        plain = run(engine, ids, "none", max_tokens=80)
        engine.reset()
        spec = run(engine, ids, head.drafter, max_tokens=80, draft_max=4, draft_p_min=0.0)
        assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 80
        assert spec.stats.n_accepted > 0 and spec.stats.n_drafted > spec.stats.n_accepted
        answers.append(plain.token_ids)
    assert answers[0] != answers[1] or first_logprob(engine, 1) != first_logprob(engine, 2)  # the image matters


def first_logprob(engine, seed: int) -> float:
    """The target's log-probability of its first answer token after the image (some tiny targets, nearly bigram
    models, give two images the same greedy answer: their probabilities still differ)."""
    ids = chat_tokens(engine.model, ask(png_bytes(seed)), engine.projector)
    engine.reset()
    params = GenerationParams(max_tokens=1, sampling=SamplingParams(temperature=0), logprobs=0)
    return list(engine.generate(ids, params, "none"))[-1].logprobs[0].logprob


def test_a_second_turn_keeps_the_image_in_the_cached_prefix_and_stays_exact(head, engine):
    engine.reset()
    turn1 = ask(png_bytes(1))
    first = run(engine, chat_tokens(engine.model, turn1, engine.projector), head.drafter, max_tokens=30,
                draft_max=4, draft_p_min=0.0)
    turn2 = chat_tokens(engine.model, turn1 + [{"role": "assistant", "content": first.text},
                                               {"role": "user", "content": "and then?"}], engine.projector)
    second = run(engine, turn2, head.drafter, max_tokens=40, draft_max=4, draft_p_min=0.0)
    last_image = max(i for i, tok in enumerate(turn2) if tok < 0)
    assert second.stats.prompt_cached > last_image  # the image was not evaluated again
    assert second.stats.n_accepted > 0
    engine.reset()
    assert run(engine, turn2, "none", max_tokens=40).token_ids == second.token_ids


@pytest.mark.parametrize("head", ["mtp"], indirect=True)
def test_mtp_on_an_image_prompt_samples_the_target_distribution(head, engine):
    from test_exact_sampling import N, compare, samples

    ids = chat_tokens(engine.model, ask(png_bytes(1), "the cat"), engine.projector)
    engine.reset()
    plain, _ = samples(engine, ids, "none", seed0=20_000)
    spec, drafted = samples(engine, ids, head.drafter, draft_max=3, draft_p_min=0.0)
    assert drafted > N
    compare(plain, spec)


@pytest.mark.parametrize("head", ["mtp", "eagle3"], indirect=True)
def test_a_chain_of_the_head_and_prompt_lookup_on_an_image_prompt_stays_exact(head, engine):
    """The head reads the target's state, prompt lookup the text around the image, in the same chain."""
    ids = chat_tokens(engine.model, ask(png_bytes(2)), engine.projector)
    engine.reset()
    plain = run(engine, ids, "none", max_tokens=80)
    engine.reset()
    spec = run(engine, ids, f"{head.drafter},ngram-simple", max_tokens=80, draft_max=4, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.n_accepted > 0


@pytest.mark.parametrize("head", ["mtp", "dflash"], indirect=True)
def test_an_image_longer_than_a_batch_still_drafts_exactly(head, tmp_path):
    """libmtmd decodes such an image a batch at a time and only the last batch's rows can be read: MTP needs only
    the image's last state, a block draft gets zero features for the rest."""
    target, file = head.write(tmp_path)
    probe = Engine(ModelSettings(target, n_ctx=256))
    n_embd = probe.model.n_embd
    probe.close()
    e = Engine(ModelSettings(target, n_ctx=1024, n_batch=6), file and ModelSettings(file, n_ctx=1024, n_batch=6),
               write_projector(tmp_path / "mmproj.gguf", n_embd_text=n_embd))
    try:
        ids = chat_tokens(e.model, ask(png_bytes(1)), e.projector)
        assert ids.count(min(ids)) > 2 * 6  # the image (16 positions) takes three batches
        plain = run(e, ids, "none", max_tokens=60)
        e.reset()
        spec = run(e, ids, head.drafter, max_tokens=60, draft_max=4, draft_p_min=0.0)
        assert spec.token_ids == plain.token_ids and spec.stats.n_accepted > 0
    finally:
        e.close()
