"""llama.cpp's n-gram kinds (ngram-simple, -map-k, -map-k4v, -mod, -cache): each against a line-by-line port of
llama.cpp's C++ loop where one is short enough to write out, their rules where not, and each on the starter pair:
greedy output identical to speculation off, drafts made where the answer repeats the prompt."""
import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from app.engine import Done, DraftParams, EngineError, GenerationParams
from app.engine.drafters import NgramParams, registry
from app.engine.drafters.ngram import NgramLongest, NgramMod, NgramSimple
from app.engine.drafters.ngram_cache import NgramCache
from app.engine.drafters.ngram_map import NgramMapK, NgramMapK4v
from app.prompts import chat_tokens

KINDS = list(registry.KINDS)
REPEAT = [json.loads(line) for line in (Path(__file__).parent / "prompts" / "repeat.jsonl").read_text().splitlines()]
# settings that draft early on the short passages of the bench's repeat prompts
SMALL = NgramParams(simple_size_n=3, simple_size_m=8, map_k_size_n=3, map_k_size_m=8, map_k4v_size_n=2,
                    map_k4v_size_m=4, mod_n_match=4, mod_n_min=2, mod_n_max=8)


def history(seed: int, n: int = 300, vocab: int = 12) -> list[int]:
    """Tokens with many repeats: random runs copied from earlier in the sequence."""
    rng = random.Random(seed)
    out = [rng.randrange(vocab) for _ in range(20)]
    while len(out) < n:
        if rng.random() < 0.5:
            start = rng.randrange(len(out) - 8)
            out += out[start : start + rng.randrange(4, 30)]
        else:
            out += [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
    return out[:n]


def simple_reference(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common_ngram_simple_draft, loop for loop."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1 :] + [sampled]
    match = 0
    for j in range(cur - n - 1, 0, -1):
        if tokens[j : j + n] == pattern:
            match = j
            break
    if match == 0:
        return []
    copy = min(m, cur - (match + n))
    return [] if copy < n else tokens[match + n : match + n + copy]


def mod_reference(table: dict, window: list[int], n_min: int, n_max: int) -> list[int]:
    out = []
    for i in range(n_max):
        tok = table.get(tuple(window))
        if tok is None:
            return [] if i < n_min else out
        out.append(tok)
        window = window[1:] + [tok]
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,m", [(2, 6), (3, 8), (5, 8), (5, 4), (12, 48)])
def test_ngram_simple_matches_llama_cpp_loop(seed, n, m):
    h = history(seed)
    d = NgramSimple(NgramParams(simple_size_n=n, simple_size_m=m))
    d.begin(h[:40])
    drafted = 0
    for end in range(40, len(h)):  # the history grows a token or a few at a time, as rounds commit them
        got = d.lookup(h[: end + 1])
        want = simple_reference(h[:end], h[end], n, m)
        assert got == want, end
        drafted += bool(got)
    assert drafted > 0 if n <= m < 48 else m >= n or drafted == 0  # (llama.cpp drafts no fewer than n)


@pytest.mark.parametrize("seed", range(6))
def test_ngram_longest_copies_after_the_longest_key_that_occurred_before(seed):
    """SpecChat's kind: llama.cpp's ngram-simple loop with a key of 4, else 3, else 2, round after round."""
    tokens = history(seed, n=400, vocab=8)
    d = NgramLongest(NgramParams(simple_size_m=10))
    keyed = 0
    for cur in range(20, len(tokens)):
        want = next((r for n in (4, 3, 2) if (r := simple_reference(tokens[:cur - 1], tokens[cur - 1], n, 10))), [])
        got = d.lookup(tokens[:cur])
        assert got == want, cur
        keyed += bool(got)
        if got:  # its support starts from the span it copied (the signal of each token it drafts)
            assert d.support(tokens[:cur]) >= 2
    assert keyed > 100


@pytest.mark.parametrize("seed", range(4))
def test_ngram_mod_chains_its_table_and_adds_new_ngrams_in_chunks_of_32(seed):
    h = history(seed, 400)
    p = NgramParams(mod_n_match=3, mod_n_min=2, mod_n_max=10)
    d = NgramMod(p)
    d.begin(h[:100])
    table = {tuple(h[i : i + 3]): h[i + 3] for i in range(100 - 3)}
    i_last = 100 - 3
    drafted = 0
    for end in range(100, len(h)):
        cur = end  # llama.cpp's prompt: the history without its newest token
        if i_last + 32 < cur:
            table.update({tuple(h[i : i + 3]): h[i + 3] for i in range(i_last, cur - 3)})
            i_last = cur - 3
        got = d.lookup(h[: end + 1])
        assert got == mod_reference(table, h[end - 2 : end + 1], 2, 10), end
        drafted += bool(got)
    assert drafted > 0


def test_ngram_mod_clears_its_table_after_five_poor_drafts():
    h = list(range(10)) * 4
    d = NgramMod(NgramParams(mod_n_match=2, mod_n_min=1, mod_n_max=8))
    d.begin(h)
    for _ in range(4):
        assert d.lookup(h + [0]) and d.accept(1) is None  # 1 of 8: under a quarter
    assert d.lookup(h + [0])
    d.accept(1)
    assert d._next == {}  # the fifth in a row: cleared, and rebuilt from the whole history at the next lookup
    assert d.lookup(h + [0]) == [1, 2, 3, 4, 5, 6, 7, 8]


class TakeAll:
    """A gate that proposes every token, noting each one's signal."""

    def __init__(self):
        self.signals = []

    def take(self, signal: float) -> bool:
        self.signals.append(signal)
        return True

    def look_further(self) -> bool:
        return True


def test_ngram_simple_signals_each_tokens_support():
    """The signal of a token ngram-simple copies: how many tokens before the copied span agree with the history's
    end (the key of 2, and one more here), plus the tokens drafted before it."""
    d = NgramSimple(NgramParams(simple_size_n=2, simple_size_m=3))
    history = [7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 0, 2, 3, 4]  # [3, 4] last occurred at 3, after [2]
    gate = TakeAll()
    draft = d.propose(history, 3, None, None, gate)
    assert draft.tokens == [5, 6, 8] and draft.signals == gate.signals == [3.0, 4.0, 5.0]
    assert d.propose(history[:-3] + [9, 3, 4], 3, None, None, gate).signals == [2.0, 3.0, 4.0]  # the key alone
    # kinds that do not copy one span (ngram-mod chains its table) keep one bucket
    mod = NgramMod(NgramParams(mod_n_match=2, mod_n_min=1, mod_n_max=3))
    mod.begin(history)
    assert mod.propose(history, 3, None, None, TakeAll()).signals == [0.0, 0.0, 0.0]


def test_ngram_map_k_drafts_after_the_key_and_shortens_to_what_was_accepted():
    p = NgramParams(map_k_size_n=2, map_k_size_m=4)
    prompt = [7, 8, 1, 2, 3, 4, 5, 6, 9, 9, 9, 9, 9]
    d = NgramMapK(p)
    d.begin(prompt)
    assert d.lookup(prompt + [1, 2]) == [3, 4, 5, 6]  # the key [1, 2] occurred at 2: the m tokens after it
    d.accept(2)
    assert d.lookup(prompt + [1, 2, 3, 4, 1, 2]) == [3, 4]  # this key's value was accepted 2 deep last time
    assert d.lookup(prompt + [0, 0]) == []


def test_ngram_map_k4v_wants_a_clear_favourite_after_min_hits():
    p = NgramParams(map_k4v_size_n=1, map_k4v_size_m=1, map_k4v_min_hits=2)
    d = NgramMapK4v(p)
    base = [9, 5, 1, 5, 2, 8, 8, 8]
    d.begin(base)
    assert d.lookup(base + [5]) == []  # first hit: under min_hits
    assert d.lookup(base + [5, 3, 3, 5]) == []  # after 5 came 1 and 2 (and 1 again): no clear favourite
    d2 = NgramMapK4v(p)
    clear = [9, 5, 1, 5, 1, 5, 1, 8, 8, 8]
    d2.begin(clear)
    d2.lookup(clear + [5])
    assert d2.lookup(clear + [5, 1, 4, 5]) == [1]


def test_ngram_cache_drafts_the_clear_favourite_and_reads_llama_cpp_files(tmp_path):
    d = NgramCache(NgramParams())
    h = [1, 2, 3, 4] * 5
    assert d.lookup(h) == [1, 2, 3, 4, 1, 2, 3, 4]  # 8 tokens at most, as llama.cpp's
    path = tmp_path / "static.bin"  # llama.cpp's layout: 4 tokens, a count, then (token, count) pairs
    path.write_bytes(struct.pack("<4ii2i", 5, 6, -1, -1, 1, 7, 3))
    d = NgramCache(NgramParams(lookup_cache_static=str(path)))
    assert d.static == {(5, 6, -1, -1): {7: 3}}
    assert d.lookup([5, 6]) == [7]  # nothing in the context: the static cache alone
    path.write_bytes(struct.pack("<4ii", 5, 6, -1, -1, 2))
    with pytest.raises(EngineError, match="not an n-gram cache file"):
        NgramCache(NgramParams(lookup_cache_static=str(path)))
    with pytest.raises(EngineError, match="Cannot read the --lookup-cache-dynamic file"):
        NgramCache(NgramParams(lookup_cache_dynamic=str(tmp_path / "nowhere.bin")))


def test_settings_are_checked_in_llama_cpps_words():
    with pytest.raises(EngineError, match="--spec-ngram-mod-n-match 0"):
        DraftParams(ngram=NgramParams(mod_n_match=0)).validate()
    with pytest.raises(EngineError, match="--spec-ngram-mod-n-min 9"):
        DraftParams(ngram=NgramParams(mod_n_min=9, mod_n_max=8)).validate()
    assert registry.drafter_for("ngram-map-k4v") == "ngram-map-k4v"
    assert registry.drafter_for(["draft-simple", "ngram-mod"]) == registry.drafter_for("draft-simple,ngram-mod")
    with pytest.raises(EngineError, match="same drafter twice"):
        registry.parts("ngram,ngram-longest")
    with pytest.raises(EngineError, match="cannot be part of a chain"):
        registry.parts("none,ngram-mod")


def generate(engine, ids, drafter, n, **draft):
    engine.reset()
    params = GenerationParams(max_tokens=n, draft=DraftParams(**draft))
    done = list(engine.generate(ids, params, drafter))[-1]
    assert isinstance(done, Done)
    return done


@pytest.fixture(scope="module")
def repeat_ids(starter_engine):
    return [chat_tokens(starter_engine.model, [{"role": "user", "content": p["prompt"]}]) for p in REPEAT[:2]]


@pytest.fixture(scope="module")
def plain(starter_engine, repeat_ids):
    return [generate(starter_engine, ids, "none", 128).token_ids for ids in repeat_ids]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("settings", ["defaults", "small"])
def test_every_kind_is_greedy_identical_to_speculation_off(starter_engine, repeat_ids, plain, kind, settings):
    ngram = NgramParams() if settings == "defaults" else SMALL
    drafted = 0
    for ids, want in zip(repeat_ids, plain):
        done = generate(starter_engine, ids, kind, 128, draft_max=8, ngram=ngram)
        assert done.token_ids == want
        assert done.stats.drafter == kind
        drafted += done.stats.n_drafted
    if settings == "small" or kind in ("ngram-map-k", "ngram-mod", "ngram-cache"):
        assert drafted > 0  # the answers repeat the prompt: every kind finds it
    if settings == "small":  # (one adaptive run per kind: it is the same run under either settings id)
        adaptive = generate(starter_engine, repeat_ids[0], kind, 128, adaptive=True, ngram=SMALL)
        assert adaptive.token_ids == plain[0]


@pytest.mark.slow
def test_drafter_ngram_is_the_default_kind(starter_engine, repeat_ids, plain):
    done = generate(starter_engine, repeat_ids[0], registry.Lookup.METHOD, 128)
    assert done.stats.drafter == registry.DEFAULT_KIND and done.token_ids == plain[0]
    assert registry.label(registry.Lookup.METHOD).endswith(f"({registry.DEFAULT_KIND})")


def test_a_kind_drafts_its_own_length_not_draft_max():
    h = list(range(60)) * 2
    d = NgramSimple(NgramParams(simple_size_n=2, simple_size_m=20))
    rng = np.random.default_rng(0)
    assert len(d.draft_round(h[:70], 4, 64, None, rng, None).tokens) == 20  # its size_m, not --draft-max 4
    assert len(d.draft_round(h[:70], 4, 5, None, rng, None).tokens) == 5  # within the room there is
    assert d.draft_round(h[:70], 0, 64, None, rng, None).tokens == []  # --draft-max 0: off
