"""Drafting from what was already said (``suffix``), after SuffixDecoding (Arctic Inference; vLLM's ``suffix``
method): the continuation most often seen after the longest stretch of earlier text that ends as the history ends.

Earlier text is the history itself (the prompt and the answer so far, as the n-gram kinds see it) and the pair's
``AnswerMemory``: every earlier generation's prompt and answer, kept per scope (the app's own, or one API key's) and
bounded, so a regenerated answer drafts from the one it replaces and an agent loop from its earlier requests. Like
every drafter it only proposes: the target verifies each token, so the output is speculation off's.

Instead of a suffix tree, an index of every 3-gram's occurrences: the longest match is found by reading back from
each occurrence (at most ``MATCH_MAX`` tokens), and the continuation is read forward across the occurrences that
match longest, token by token by majority, while the share that agree (the tree's frequency estimate) stays above
``P_MIN``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque

from .base import Draft, stop_at
from .ngram import Lookup

KEY = 3  # tokens an occurrence must share with the history's end to be looked at
RECENT = 256  # occurrences of that key looked at, the latest (a common 3-gram has thousands in a long memory)
MATCH_MAX = 32  # tokens compared backwards: matches this long count as equally good
P_MIN = 0.3  # a continuation token is proposed while this share of the occurrences (so far) agree on it
LENGTH = 32  # tokens drafted at most (under --adaptive the controller sets the length)


class _Store:
    """Token sequences with an index of each 3-gram's occurrences: ``(sequence, position after the 3-gram)``."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {}
        self.index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self.n_tokens = 0
        self._next_id = 0

    def add(self, tokens: list[int]) -> int:
        sid, self._next_id = self._next_id, self._next_id + 1
        self.seqs[sid] = tokens
        for i in range(len(tokens) - KEY):
            self.index.setdefault(tuple(tokens[i:i + KEY]), []).append((sid, i + KEY))
        self.n_tokens += len(tokens)
        return sid

    def drop_oldest(self, sid: int) -> None:
        """Forget sequence ``sid``, the oldest kept: its occurrences lead each of its keys' lists (added in order)."""
        tokens = self.seqs.pop(sid)
        for i in range(len(tokens) - KEY):
            key = tuple(tokens[i:i + KEY])
            found = self.index.get(key)
            if found is None:
                continue  # (a key the sequence holds more than once: cleared at its first)
            n = 0
            while n < len(found) and found[n][0] == sid:
                n += 1
            if n == len(found):
                del self.index[key]
            else:
                del found[:n]
        self.n_tokens -= len(tokens)


class AnswerMemory:
    """Earlier generations (prompt and answer) of one loaded pair, per scope, for ``suffix``: at most ``max_tokens``
    per scope (the oldest go first) and ``max_scopes`` scopes (the least recently used go first). Only in memory:
    a reload or another pair starts empty. Thread-safe (answers end on the engine's thread, requests read on theirs)."""

    def __init__(self, max_tokens: int = 1 << 18, max_scopes: int = 16):
        self.max_tokens, self.max_scopes = max_tokens, max_scopes
        self._scopes: OrderedDict[str, tuple[_Store, deque[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, scope: str, tokens: list[int]) -> None:
        if len(tokens) <= KEY:
            return
        tokens = list(tokens[-self.max_tokens:])
        with self._lock:
            if scope not in self._scopes:
                self._scopes[scope] = (_Store(), deque())
            self._scopes.move_to_end(scope)  # (most recently used last)
            store, order = self._scopes[scope]
            order.append(store.add(tokens))
            while store.n_tokens > self.max_tokens:
                store.drop_oldest(order.popleft())
            while len(self._scopes) > self.max_scopes:
                self._scopes.popitem(last=False)

    def store(self, scope: str) -> _Store | None:
        with self._lock:
            found = self._scopes.get(scope)
            return found[0] if found else None

    def tokens(self, scope: str | None = None) -> int:
        """Tokens kept (in one scope, or in all)."""
        with self._lock:
            return sum(s.n_tokens for k, (s, _) in self._scopes.items() if scope is None or k == scope)

    def clear(self, scope: str | None = None) -> None:
        """Forget one scope's earlier answers, or every scope's."""
        with self._lock:
            if scope is None:
                self._scopes.clear()
            else:
                self._scopes.pop(scope, None)


class SuffixDrafter(Lookup):
    """``suffix``: drafts what most often followed the longest earlier match of the history's end, in the history
    and in the earlier answers of its scope (``AnswerMemory``). A token's confidence signal is the share of the
    matching occurrences that agree on it, times how long the match is (a 3-token match counts for less)."""

    name = METHOD = "suffix"
    label = "earlier answers"
    SIGNAL_EDGES: tuple[float, ...] = (0.3, 0.5, 0.7, 0.85)
    SIGNAL_PRIOR: tuple[float, ...] = (0.3, 0.45, 0.6, 0.75, 0.9)
    SIGNAL_GROWS = False

    def __init__(self, memory: AnswerMemory | None = None, scope: str = ""):
        self.memory, self.scope = memory, scope
        self.length = LENGTH
        self._own = _Store()  # the history, indexed as it grows
        self._own_id = self._own.add([])
        self._indexed = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self._own = _Store()
        self._own_id = self._own.add([])
        self._indexed = 0

    def _index_history(self, history: list[int]) -> None:
        """The history's 3-grams that end before its last token (a match must be followed by something)."""
        self._own.seqs[self._own_id] = history
        for i in range(self._indexed, len(history) - KEY):
            self._own.index.setdefault(tuple(history[i:i + KEY]), []).append((self._own_id, i + KEY))
        self._indexed = max(self._indexed, len(history) - KEY)

    def lookup(self, history: list[int]) -> list[int]:
        return [t for t, _ in self.continuation(history, self.length)]

    def continuation(self, history: list[int], n_max: int) -> list[tuple[int, float]]:
        """Up to ``n_max`` (token, signal) pairs: the majority continuation of the longest matches."""
        if len(history) <= KEY or n_max <= 0:
            return []
        self._index_history(history)
        key = tuple(history[-KEY:])
        found = [(s, pos) for s in (self._own, self.memory.store(self.scope) if self.memory else None) if s
                 for pos in s.index.get(key, ())[-RECENT:]]
        if not found:
            return []
        end = len(history)
        best, matches = 0, list[tuple[list[int], int]]()
        for store, (sid, pos) in found:
            seq = store.seqs[sid]
            n = KEY
            while n < MATCH_MAX and pos - 1 - n >= 0 and end - 1 - n >= 0 and seq[pos - 1 - n] == history[end - 1 - n]:
                n += 1
            if n > best:
                best, matches = n, []
            if n == best:
                matches.append((seq, pos))
        weight = best / (best + 2)
        out, share = [], 1.0
        for i in range(n_max):
            counts: dict[int, int] = {}
            for seq, pos in matches:
                if pos + i < len(seq):
                    counts[seq[pos + i]] = counts.get(seq[pos + i], 0) + 1
            if not counts:
                break
            tok = max(counts, key=counts.__getitem__)
            share *= counts[tok] / len(matches)
            if share < P_MIN:
                break
            out.append((tok, share * weight))
            matches = [(seq, pos) for seq, pos in matches if pos + i < len(seq) and seq[pos + i] == tok]
        return out

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        found = self.continuation(history, n_max)
        if gate is None:
            tokens = [t for t, _ in found]
            return Draft(tokens=tokens[: stop_at(tokens, stop)])
        draft, signals = Draft(), list[float]()
        draft.signals = signals
        for tok, signal in found:
            if not gate.take(signal):
                break
            draft.tokens.append(tok)
            signals.append(signal)
            if stop and stop(tok):
                break
        return draft

