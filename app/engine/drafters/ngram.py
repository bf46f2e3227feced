"""Model-free drafting from the history's own repeats: what llama.cpp's n-gram kinds share (``Lookup``), their
settings (``NgramParams``, named as llama.cpp's flags), and its two simplest kinds, ``ngram-simple`` and
``ngram-mod`` (common/ngram-map.cpp, common/ngram-mod.cpp and common/speculative.cpp, ported as they are).

As in llama.cpp, an n-gram kind drafts up to its own length (``--spec-ngram-*-size-m``, ``--spec-ngram-mod-n-max``),
not ``--draft-max`` (which sizes a draft model's drafts), within what the batch and the answer have room for; a
round that ``--draft-max 0`` or the adaptive controller turns off drafts nothing. llama.cpp's drafters see the
history without its newest token (``prompt``) and that token apart (``id_last``); here ``history`` holds both.
Their state lives for one generation: llama-server keeps it per slot across requests, whose prompts carry the
conversation anyway.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..errors import EngineError
from .base import Draft, Drafter, stop_at


@dataclass(frozen=True)
class NgramParams:
    """The n-gram kinds' settings, llama.cpp's defaults (common/common.h); each field is the flag
    ``--spec-ngram-`` + the field's name with dashes (``simple_size_n``: ``--spec-ngram-simple-size-n``)."""

    simple_size_n: int = 12  # length of the n-gram looked up
    simple_size_m: int = 48  # length of the m-gram drafted after it
    simple_min_hits: int = 1  # (llama.cpp accepts it; ngram-simple does not use it)
    map_k_size_n: int = 12
    map_k_size_m: int = 48
    map_k_min_hits: int = 1
    map_k4v_size_n: int = 12
    map_k4v_size_m: int = 48
    map_k4v_min_hits: int = 1  # occurrences of the key before its values are weighed
    mod_n_match: int = 24  # n-gram length hashed
    mod_n_min: int = 48  # a draft shorter than this is dropped
    mod_n_max: int = 64
    lookup_cache_static: str = ""  # -lcs: a static n-gram cache file (llama-lookup-create), for ngram-cache
    lookup_cache_dynamic: str = ""  # -lcd: a dynamic one

    def validate(self) -> None:
        """llama.cpp's limits (common/arg.cpp), in its words."""
        for f in fields(self):
            value, flag = getattr(self, f.name), "--spec-ngram-" + f.name.replace("_", "-")
            if f.name.startswith("lookup_cache"):  # file names, read when ngram-cache starts
                if not isinstance(value, str):
                    raise EngineError(f"Invalid --{f.name.replace('_', '-')} {value!r}: give a file name.")
                continue
            low = 0 if f.name in ("mod_n_min", "mod_n_max") else 1
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 1024:
                raise EngineError(f"Invalid {flag} {value!r}: use a whole number from {low} to 1024.")
        if self.mod_n_min > self.mod_n_max:
            raise EngineError(f"Invalid --spec-ngram-mod-n-min {self.mod_n_min}: it must not exceed "
                              f"--spec-ngram-mod-n-max ({self.mod_n_max}).")


class Lookup(Drafter):
    """An n-gram kind: ``lookup`` proposes a continuation of the history (llama.cpp's draft), ``accept`` hears how
    many of its tokens the target accepted (llama.cpp's accept callback)."""

    METHOD = "ngram"  # the method the kinds belong to (--drafter ngram: the default kind)
    label = "n-gram lookup"
    # one bucket: a proposal carries no confidence of its own; an exact match of a long key
    SIGNAL_PRIOR: tuple[float, ...] = (0.9,)
    SUPPORT_MAX = 64  # a copying kind's support (``support``; its SIGNAL_GROWS): tokens compared backwards at most
    # Not after tokens a grammar forced: a lookup keyed on them (`": "` and a key) finds the structure that repeats
    # at every key and proposes what followed the last one.
    AFTER_FORCED = False
    length = 0  # its own most tokens per draft
    copied_from: int | None = None  # a copying kind's last lookup: where in the history its proposal starts

    def lookup(self, history: list[int]) -> list[int]:
        raise NotImplementedError

    def support(self, history: list[int]) -> int:
        """How many tokens before the span the last lookup copied agree with the history's end (its key and more)."""
        src, end, n = self.copied_from or 0, len(history), 0
        while n < min(src, self.SUPPORT_MAX) and history[src - 1 - n] == history[end - 1 - n]:
            n += 1
        return n

    def draft_round(self, history, n_max, limit, sp, rng, gate) -> Draft:
        # its own length, as llama.cpp's; the adaptive controller's say where it has one; 0 turns the round off
        n = min(self.length if gate is None and n_max > 0 else n_max, limit)
        return self.propose(history, n, sp, rng, gate) if n > 0 else Draft()

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        tokens = self.lookup(history)[:n_max] if n_max > 0 else []
        if gate is None:
            return Draft(tokens=tokens[: stop_at(tokens, stop)])
        draft = Draft(signals=[])
        # A copying kind's token is as sure as the context agrees with what it copies: the support, and the tokens
        # drafted before it (accepted, they agree too). Other kinds' proposals carry no confidence: one bucket.
        support = self.support(history) if self.SIGNAL_GROWS and tokens else 0
        for i, tok in enumerate(tokens):  # (looking further costs nothing here)
            signal = float(support + i) if self.SIGNAL_GROWS else 0.0
            if not gate.take(signal):
                break
            draft.tokens.append(tok)
            draft.signals.append(signal)
            if stop and stop(tok):
                break
        return draft


class NgramSimple(Lookup):
    """``ngram-simple``: the latest earlier occurrence of the last ``size_n`` tokens, and the ``size_m`` after it
    (common_ngram_simple_draft). An index of every n-gram's latest start replaces the backward scan: the same
    answer, without scanning the history each round."""

    name = "ngram-simple"
    # Its tokens' support (Lookup.propose). On the starter's answers, keys of 2 tokens, the target accepted 52-54% of
    # tokens with a support of 2, 54-78% of 3-9, 85-100% of 10 and more (repeating text dips at the end of a block
    # that repeats: the list item's number). The priors are a little above that.
    SIGNAL_EDGES, SIGNAL_PRIOR, SIGNAL_GROWS = (4.0, 8.0, 16.0, 32.0), (0.7, 0.8, 0.9, 0.95, 0.97), True

    def __init__(self, p: NgramParams):
        self.n, self.m = p.simple_size_n, p.simple_size_m
        self.length = self.m
        self._latest: dict[tuple[int, ...], int] = {}
        self._indexed = 1  # starts below this are in the index (llama.cpp never matches at 0)

    def lookup(self, history: list[int]) -> list[int]:
        n, m = self.n, self.m
        cur = len(history) - 1  # llama.cpp's cur_len: the history without its newest token
        if cur <= n + m + 1:
            return []
        for j in range(self._indexed, cur - n):  # starts up to cur_len - n - 1: not the current occurrence
            self._latest[tuple(history[j : j + n])] = j
        self._indexed = max(self._indexed, cur - n)
        match = self._latest.get(tuple(history[-n:]))
        self.copied_from = None if match is None else match + n
        if match is None:
            return []
        copy = min(m, cur - (match + n))
        return [] if copy < n else history[match + n : match + n + copy]


class NgramLongest(NgramSimple):
    """``ngram-longest``, SpecChat's own kind and what ``ngram`` means: ``ngram-simple``'s latest earlier occurrence,
    of the longest key that has one, 4 tokens, else 3, else 2. llama.cpp's keys of 12 to 24 tokens must be written
    before anything is drafted and rarely match in chat; a key of 2 drafts most of a repeat, and a longer one, where
    there is one, picks the occurrence whose context agrees (docs/benchmarks/ngram.md, issue 69's table)."""

    name = "ngram-longest"
    KEYS = (4, 3, 2)

    def __init__(self, p: NgramParams):
        self.m = self.length = p.simple_size_m
        self._by_key = [NgramSimple(replace(p, simple_size_n=n)) for n in self.KEYS]

    def lookup(self, history: list[int]) -> list[int]:
        for kind in self._by_key:  # (a key not asked this round indexes what it missed at its next lookup)
            tokens = kind.lookup(history)
            if tokens:
                self.copied_from = kind.copied_from
                return tokens
        self.copied_from = None
        return []


class NgramMod(Lookup):
    """``ngram-mod``: a table from each ``n_match``-gram to the token that last followed it, chained token by token
    (common_ngram_mod); a chain shorter than ``n_min`` is no draft. The history's new n-grams join the table in
    chunks of 32 tokens, and five drafts in a row with under a quarter accepted clear it, as in llama.cpp. Exact
    keys stand in for llama.cpp's 4M-slot hash table (whose rare collisions this does not reproduce)."""

    name = "ngram-mod"
    CHUNK = 32
    LOW_ACCEPTANCE, LOW_STREAK = 0.25, 5
    SIZE = 4 * 1024 * 1024  # llama.cpp's table slots: beyond a quarter used, begin() clears it

    def __init__(self, p: NgramParams):
        self.n, self.n_min, self.n_max = p.mod_n_match, p.mod_n_min, p.mod_n_max
        self.length = self.n_max
        self._next: dict[tuple[int, ...], int] = {}
        self._i_last = 0  # n-grams starting before this are in the table
        self._n_draft_last = 0
        self._n_low = 0

    def _add(self, tokens: list[int], start: int, end: int) -> None:
        n = self.n
        for i in range(start, end):
            self._next[tuple(tokens[i : i + n])] = tokens[i + n]

    def begin(self, prompt_ids: list[int]) -> None:
        self._i_last = self._n_draft_last = 0
        n = self.n
        if len(prompt_ids) < n:
            return
        self._add(prompt_ids, 0, len(prompt_ids) - n)
        self._i_last = len(prompt_ids) - n
        if len(self._next) > self.SIZE // 4:
            self._next.clear()

    def lookup(self, history: list[int]) -> list[int]:
        self._n_draft_last = 0
        n, cur = self.n, len(history) - 1
        if cur < n:
            return []
        if self._i_last + self.CHUNK < cur:
            self._add(history, self._i_last, cur - n)
            self._i_last = cur - n
        window = history[-n:]
        out: list[int] = []
        for i in range(self.n_max):
            tok = self._next.get(tuple(window))
            if tok is None:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            window = window[1:] + [tok]
        self._n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self._n_draft_last > 0:
            if n_accepted / self._n_draft_last < self.LOW_ACCEPTANCE:
                self._n_low += 1
                if self._n_low >= self.LOW_STREAK:
                    self._next.clear()
                    self._n_low = self._i_last = 0
            else:
                self._n_low = 0
