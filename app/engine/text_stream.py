"""Turning token bytes into text safely: whole UTF-8 characters only, and stop strings cut before they show."""
from __future__ import annotations

import codecs


class TextStream:
    """Feed token bytes, get text that is safe to show.

    A character split across tokens is held until complete; text that might be the start of a stop string is held
    until it is clearly not one. ``stopped`` turns true once a stop string appeared; the text before it is final.
    """

    def __init__(self, stop: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.text = ""  # everything released so far
        self.stopped = False

    def feed(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release(final=False)

    def flush(self) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        pending = self._pending
        if self._stop:
            # A stop string may straddle what was already released only if we released part of its prefix,
            # which _hold() prevents; so searching the pending text is enough.
            cut = min((i for i in (pending.find(s) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                out, self._pending = pending[:cut], ""
                self.text += out
                return out
            keep = 0 if final else self._hold(pending)
        else:
            keep = 0
        out = pending[: len(pending) - keep]
        self._pending = pending[len(pending) - keep :]
        self.text += out
        return out

    def _hold(self, pending: str) -> int:
        """Length of the longest suffix of ``pending`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(pending)), best, -1):
                if pending.endswith(s[:n]):
                    best = n
                    break
        return best
