"""Drafting from earlier answers (``suffix``): the memory it reads (bounded, per scope, cleared on demand), its
majority continuation, and on the starter pair, through the engine and through the API: a regenerated answer
drafts from the one it replaces, with speculation off's tokens, and never from another key's answers."""
from __future__ import annotations

import httpx
import pytest
from support.servers import serve_in_thread

from app.engine import DraftParams, GenerationParams, SamplingParams
from app.engine.drafters import registry
from app.engine.drafters.suffix import KEY, P_MIN, AnswerMemory, SuffixDrafter
from app.prompts import chat_tokens

QUESTION = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def test_the_memory_is_bounded_per_scope_and_forgets_on_demand():
    mem = AnswerMemory(max_tokens=100, max_scopes=2)
    mem.add("a", list(range(60)))
    mem.add("a", list(range(100, 160)))  # 120 tokens: the oldest answer goes
    assert mem.tokens("a") == 60 and (100, 101, 102) in mem.store("a").index and (0, 1, 2) not in mem.store("a").index
    mem.add("b", [1, 2, 3, 4, 5])
    mem.add("a", [7, 8, 9, 10])  # "a" used last: "b" is the least recently used scope
    mem.add("c", [1, 2, 3, 4, 5])
    assert mem.store("b") is None and mem.store("a") is not None and mem.store("c") is not None
    mem.add("c", [1, 2])  # too short to draft from: not kept
    assert mem.tokens("c") == 5
    mem.clear("c")
    assert mem.store("c") is None and mem.tokens() == 64
    mem.clear()
    assert mem.tokens() == 0


def test_it_drafts_the_majority_continuation_of_the_longest_match():
    mem = AnswerMemory()
    mem.add("", [9, 1, 2, 3, 4, 5, 6])
    mem.add("", [8, 1, 2, 3, 4, 5, 7])
    mem.add("", [8, 1, 2, 3, 4, 5, 7])
    d = SuffixDrafter(mem, "")
    # "8 1 2 3" matches the two answers that agree, longer than the first: their continuation, with full agreement
    assert d.lookup([0, 8, 1, 2, 3]) == [4, 5, 7]
    got = d.continuation([0, 0, 1, 2, 3], 8)  # a 3-token match of all three: 4 5 by all, then 7 by two of three
    assert [t for t, _ in got] == [4, 5, 7] and got[0][1] > got[2][1] >= P_MIN * KEY / (KEY + 2)
    assert d.lookup([5, 5, 5, 5]) == []  # nothing earlier ends this way
    assert SuffixDrafter(mem, "someone else").lookup([0, 8, 1, 2, 3]) == []  # another scope's answers are not read
    # the history itself counts too, as the n-gram kinds see it
    assert SuffixDrafter(None).lookup([4, 5, 6, 7, 0, 4, 5, 6]) == [7, 0, 4, 5, 6]


def test_it_is_a_method_of_its_own_usable_by_every_pair_and_in_chains():
    assert registry.method("suffix").choice == "Earlier answers" and registry.label("suffix") == "earlier answers"
    assert registry.parts("model,suffix") == ("model", "suffix") and registry.drafter_for("suffix") == "suffix"


def _run(engine, drafter, seed, scope=""):
    engine.reset()
    params = GenerationParams(max_tokens=96, sampling=SamplingParams(temperature=0.7, seed=seed),
                              draft=DraftParams(draft_max=12, adaptive=True, scope=scope))
    return list(engine.generate(chat_tokens(engine.model, QUESTION), params, drafter))[-1]


@pytest.mark.slow
def test_a_regenerated_answer_drafts_from_the_one_it_replaces_with_speculation_offs_tokens(starter_engine):
    starter_engine.forget_answers()
    first = _run(starter_engine, "none", 5)  # every answer joins the memory, whatever drafted it
    again = _run(starter_engine, "suffix", 5)
    assert again.token_ids == first.token_ids and again.stats.drafter == "suffix"
    assert again.stats.n_accepted >= len(first.token_ids) // 2  # most of it drafted from the answer it replaces
    other = _run(starter_engine, "suffix", 5, scope="key:other")
    assert other.token_ids == first.token_ids and other.stats.n_accepted < again.stats.n_accepted // 2
    starter_engine.forget_answers()
    assert starter_engine.answers_kept() == 0
    starter_engine.reset()  # Compare's and a bench's runs are not remembered: one must not draft from the other
    params = GenerationParams(max_tokens=8, draft=DraftParams(remember=False))
    list(starter_engine.generate(chat_tokens(starter_engine.model, QUESTION), params, "none"))
    assert starter_engine.answers_kept() == 0
    forgot = _run(starter_engine, "suffix", 5)
    assert forgot.token_ids == first.token_ids and forgot.stats.n_accepted < again.stats.n_accepted // 2
    chained = _run(starter_engine, "model,suffix", 5)  # in a chain, the earlier answer drafts where it holds
    assert chained.token_ids == first.token_ids and "," in chained.stats.drafter
    assert chained.stats.by_drafter["suffix"][2] >= len(first.token_ids) // 2


@pytest.fixture(scope="module")
def api(specchat_home):
    from fastapi import FastAPI

    from app.chat.runtime import Runtime
    from app.models.loader import LoadSpec
    from app.server.app import ApiServer
    from app.server.guard import Access, Guard

    rt = Runtime()
    rt.load(LoadSpec(pair="starter"))
    server = ApiServer(rt)
    root = FastAPI()
    root.mount("/v1", server.app())
    with serve_in_thread(lambda port: Guard(root, Access.serving(port, listen=False))) as url:
        yield url
    rt.close()


@pytest.mark.slow
def test_through_the_api_a_regenerated_answer_drafts_from_the_last_and_never_from_another_keys(api):
    def ask(drafter: str, key: str) -> dict:
        body = {"messages": QUESTION, "max_tokens": 64, "temperature": 0.7, "seed": 11, "drafter": drafter}
        r = httpx.post(f"{api}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                       timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    off = ask("none", "alice")
    again = ask("suffix", "alice")
    text = lambda r: r["choices"][0]["message"]["content"]  # noqa: E731
    assert text(again) == text(off) and again["timings"]["draft_n"] > 0
    assert again["timings"]["draft_n_accepted"] >= again["usage"]["completion_tokens"] // 2
    bob = ask("suffix", "bob")  # another key: alice's answers are not his to draft from
    assert text(bob) == text(off) and bob["timings"]["draft_n_accepted"] < again["timings"]["draft_n_accepted"] // 2


def test_forgetting_the_oldest_answers_leaves_the_index_of_those_kept():
    import random

    rng = random.Random(3)
    mem = AnswerMemory(max_tokens=500)
    for _ in range(40):
        mem.add("", [rng.randrange(6) for _ in range(rng.randrange(5, 80))])  # small vocabulary: keys repeat
        store = mem.store("")
        want: dict = {}
        for sid, seq in store.seqs.items():
            for i in range(len(seq) - KEY):
                want.setdefault(tuple(seq[i:i + KEY]), []).append((sid, i + KEY))
        assert store.index == want and store.n_tokens == sum(map(len, store.seqs.values())) <= 500
