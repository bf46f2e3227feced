"""Prompt progress (llama-server's ``return_progress``): the engine reports a prompt's evaluation batch by batch when
asked (``GenerationParams.prompt_progress``), in the same batches one decode makes, so the answer is the same; the
API streams it as llama-server does (``prompt_progress`` chunks before the first token, ``-b`` sets the batch)."""
from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from support.servers import serve_in_thread
from support.tiny_vision import png_bytes, write_projector

from app.engine import DraftParams, Engine, GenerationParams, ModelSettings, PromptProgress, SamplingParams
from app.prompts import chat_tokens

GREEDY = GenerationParams(max_tokens=24, sampling=SamplingParams(temperature=0), draft=DraftParams(adaptive=False))
LONG = " ".join(f"w{i} the cat sat on the mat" for i in range(3))  # (about 140 tokens on the tiny vocabulary)


def events(engine, ids, drafter="model", progress=True):
    engine.reset()
    return list(engine.generate(ids, replace(GREEDY, prompt_progress=progress), drafter))


def check_progress(steps: list[PromptProgress], n_prompt: int, n_batch: int, cached: int = 0) -> None:
    """llama-server's shape: a first report before any batch (processed = cache), then one per batch, each further,
    the last the whole prompt."""
    assert steps[0].processed == steps[0].cache == cached and all(s.total == n_prompt for s in steps)
    assert all(a.processed < b.processed for a, b in zip(steps, steps[1:])) and steps[-1].processed == n_prompt
    assert len(steps) == 1 + -(-(n_prompt - cached) // n_batch)
    assert all(a.seconds <= b.seconds for a, b in zip(steps, steps[1:]))


@pytest.fixture(scope="module")
def engine(models):
    e = Engine(ModelSettings(models["target"], n_ctx=512, n_batch=16), ModelSettings(models["draft"], n_ctx=512))
    yield e
    e.close()


def test_the_prompt_is_reported_batch_by_batch_and_the_answer_is_the_same(engine):
    ids = chat_tokens(engine.model, [{"role": "user", "content": LONG}])
    assert len(ids) > 3 * 16
    with_progress = events(engine, ids)
    steps = [e for e in with_progress if isinstance(e, PromptProgress)]
    check_progress(steps, len(ids), 16)
    assert not isinstance(with_progress[len(steps)], PromptProgress)  # all of them before the first token
    plain = events(engine, ids, progress=False)
    assert not any(isinstance(e, PromptProgress) for e in plain)
    assert with_progress[-1].token_ids == plain[-1].token_ids and with_progress[-1].stats.n_drafted > 0
    # the next turn: the cached prefix is reported as such, and only the rest is evaluated
    turn2 = chat_tokens(engine.model, [{"role": "user", "content": LONG},
                                       {"role": "assistant", "content": with_progress[-1].text},
                                       {"role": "user", "content": "and then?"}])
    steps2 = [e for e in engine.generate(turn2, replace(GREEDY, prompt_progress=True), "model")
              if isinstance(e, PromptProgress)]
    check_progress(steps2, len(turn2), 16, cached=steps2[0].cache)
    assert steps2[0].cache > len(ids) - 2


def test_a_recurrent_target_and_an_image_prompt_report_progress_with_the_same_answer(tmp_path):
    from support.heads import HEADS

    target = HEADS["mtp"].write(tmp_path)[0]  # a tiny Qwen3.5: recurrent state, checkpoints, an MTP layer
    e = Engine(ModelSettings(target, n_ctx=512, n_batch=16), None,
               write_projector(tmp_path / "mmproj.gguf", n_embd_text=64))
    try:
        for content in (LONG, [{"type": "image", "image": png_bytes(1)}, {"type": "text", "text": LONG}]):
            ids = chat_tokens(e.model, [{"role": "user", "content": content}], e.projector)
            with_progress, plain = events(e, ids, "mtp"), events(e, ids, "none", progress=False)
            assert with_progress[-1].token_ids == plain[-1].token_ids
            steps = [s for s in with_progress if isinstance(s, PromptProgress)]
            assert steps[-1].processed == len(ids) and len(steps) > 4
    finally:
        e.close()


# --- the API ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(models):
    from fastapi import FastAPI

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.guard import Access, Guard
    from app.server.apis.llama_server import LlamaAliases
    from app.server.app import ApiServer

    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["draft"]), ctx=512, batch=16))
    api = ApiServer(rt)

    def app(port):
        root = FastAPI()
        root.mount("/v1", api.app())
        return LlamaAliases(Guard(root, Access.serving(port, listen=False)))

    with serve_in_thread(app) as url:
        yield url
    rt.close()


def stream(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def reported(chunks: list[dict]) -> list[dict]:
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


def test_the_api_streams_prompt_progress_as_llama_server_does(server):
    messages = [{"role": "user", "content": LONG}]
    chunks = stream(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                     "return_progress": True, "timings_per_token": True})
    progress = reported(chunks)
    assert len(progress) > 3 and progress[0]["processed"] == progress[0]["cache"] == 0
    assert progress[-1]["processed"] == progress[-1]["total"] == chunks[-1]["timings"]["prompt_n"]
    assert all(a["processed"] < b["processed"] and a["time_ms"] <= b["time_ms"] for a, b in zip(progress, progress[1:]))
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert all("prompt_progress" not in c for c in chunks[first_text:])  # before the first token only
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in chunks if "prompt_progress" in c)
    plain = stream(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0})
    assert not reported(plain)
    text = lambda cs: "".join(c["choices"][0]["delta"].get("content") or "" for c in cs if c["choices"])  # noqa: E731
    assert text(chunks) == text(plain)
    again = reported(stream(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                             "return_progress": True}))
    assert again[0]["cache"] > 0 and len(again) == 2  # the prompt cached but its last token: one batch


def test_completion_routes_and_responses_report_progress_too(server):
    chunks = stream(server, "/completion", {"prompt": LONG, "n_predict": 4, "return_progress": True,
                                             "timings_per_token": True})
    native = reported(chunks)
    assert len(native) > 3 and native[-1]["processed"] == native[-1]["total"]
    timed = [c["timings"] for c in chunks if "prompt_progress" in c]  # the prompt's figures so far
    assert timed[0]["prompt_n"] == 0 and timed[0]["prompt_ms"] == 0 and timed[0]["predicted_n"] == 0
    assert [t["prompt_n"] for t in timed] == [p["processed"] - p["cache"] for p in native]
    assert all(a["prompt_ms"] <= b["prompt_ms"] for a, b in zip(timed, timed[1:])) and timed[-1]["prompt_ms"] > 0
    legacy = reported(stream(server, "/v1/completions", {"prompt": LONG + " again", "max_tokens": 4,
                                                         "return_progress": True}))
    assert len(legacy) > 1 and legacy[-1]["processed"] == legacy[-1]["total"]
    with httpx.stream("POST", f"{server}/v1/responses", json={"input": LONG + " once more", "max_output_tokens": 4,
                                                               "stream": True, "return_progress": True},
                      timeout=120) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    progress = [d for d in data if "prompt_progress" in d]
    assert progress and all(d["type"] == "response.in_progress" for d in progress)
    assert data[-1]["type"] == "response.completed"
    whole = httpx.post(f"{server}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": LONG}], "max_tokens": 4, "return_progress": True}).json()
    assert "prompt_progress" not in whole  # (streams only, as llama-server)
