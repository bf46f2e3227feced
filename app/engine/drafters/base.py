"""What every drafter is: the ``Drafter`` base the loop and the engine use, the ``Draft`` it proposes, and the hooks
(``Gate``, ``Stop``) through which the draft-length controller and a grammar have their say. ``NoDrafter`` is
speculation off: the same loop, verifying one token per round.

A drafter sees the committed history (prompt + accepted output, ending with the newest token, which the target
has not evaluated yet) and proposes up to ``n_max`` continuation tokens. When sampling, it also returns the
distribution each token was drawn from (``None`` = a deterministic proposal, treated as one-hot).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..sampling import Noise, SamplingParams


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    signals: list[float] | None = None  # per token: the drafter's confidence signal, when asked for
    n_evals: int = 0  # draft-model decode calls spent (the marginal cost of a token is one call)
    first_s: float = 0.0  # seconds of the first call, which also catches up on the tokens made since the last draft
    n_first: int = 0  # tokens the first call evaluated
    forced: list[bool] = field(default_factory=list)  # per token, under a grammar: forced by it, not drafted
    source: str = ""  # which drafter of several made it (a chain's member), for Stats
    sized: bool = True  # made by the drafter whose drafts the adaptive controller sizes (not another chain member)
    unsure: bool = False  # it ends where the drafter was too unsure to draft the token it computed (--draft-p-min)


class Gate(Protocol):
    """The adaptive controller's say in a draft, token by token (``DraftLength``)."""

    def take(self, signal: float) -> bool:
        """Propose this token (already drafted: its cost is paid), whose confidence signal is ``signal``?"""

    def look_further(self) -> bool:
        """Pay for one more draft step, to see the token after the last one taken?"""

    def prices(self) -> tuple[float, float]:
        """What one more verified position and one more draft step cost, in accepted tokens' worth (a chain weighs
        its members' drafts with them)."""


Stop = Callable[[int], bool]  # a grammar's say in a draft: end it after this token?


def stop_at(tokens: list[int], stop: Stop | None) -> int:
    """How many of ``tokens`` a draft keeps: through the first one ``stop`` ends it after."""
    if stop is not None:
        for i, tok in enumerate(tokens):
            if stop(tok):
                return i + 1
    return len(tokens)


class Drafter:
    """A drafting method's proposer. It sees the committed history (prompt + accepted output, ending with the newest
    token, which the target has not evaluated yet) and proposes continuation tokens; the target verifies them."""

    name = ""  # in Stats and events (a method's variant may have its own: a draft model drafting as text)
    label = ""  # how people read the name: Stats, Compare, the API's model list
    SIGNAL_EDGES: tuple[float, ...] = ()  # buckets of the confidence signal, for the adaptive controller
    SIGNAL_PRIOR: tuple[float, ...] = (0.9,)  # expected acceptance per bucket before any measurement
    # The signal grows along a draft (a lookup's support): its low buckets open rounds, where a model's unsure
    # tokens come anywhere, in runs. The adaptive controller then ends rounds by each token's worth alone.
    SIGNAL_GROWS = False
    AFTER_FORCED = True  # under a grammar, may draft after tokens the grammar forced in the round
    speculates = True  # proposes anything at all (False: speculation off)
    p_min = 0.0  # --draft-p-min, where the method drafts from a distribution
    # Drafts from tokens: on a prompt with images it sees the text around them (``images.TextOnly``). A head reads
    # the target's state by position instead, which saw the images, and takes the image positions as they are.
    READS_TEXT = True

    def with_p_min(self, p_min: float) -> Drafter:
        """This drafter, for a generation with this --draft-p-min (``registry.make`` sets it, the one place that does;
        a method that cannot honour it refuses here)."""
        self.p_min = p_min
        return self

    def begin(self, prompt_ids: list[int]) -> None:
        """A generation starts from this prompt (the drafter may prefill or index it)."""

    def propose(self, history: list[int], n_max: int, sp: SamplingParams, rng: Noise,
                gate: Gate | None = None, stop: Stop | None = None) -> Draft:
        """Up to ``n_max`` tokens that may follow ``history``. If ``gate`` is given, ask it to take each token
        (passing its confidence signal) and, where drafting costs a step, whether to look further; report the
        signals in ``Draft.signals``. If ``stop`` is given, pass it each token proposed, in order, and end the draft
        after the first for which it answers True."""
        raise NotImplementedError

    def draft_round(self, history: list[int], n_max: int, limit: int, sp: SamplingParams,
                    rng: Noise, gate: Gate | None) -> Draft:
        """One round's draft: up to ``n_max`` tokens of the drafter's own, within ``limit`` (what the batch and the
        answer have room for). A grammar's wrapper adds the tokens it forces here (``constraint.Constrained``)."""
        n = min(n_max, limit)
        return self.propose(history, n, sp, rng, gate) if n > 0 else Draft()

    def accept(self, n_accepted: int) -> None:
        """After a round that verified some of this drafter's tokens: how many the target accepted (llama.cpp's
        accept callback; the n-gram kinds learn from it)."""

    def read_on(self) -> bool:
        """Before a round: read on in a long prompt that ``begin`` left unread, a piece at a time, so that the
        target's first tokens need not wait for the whole of it. True if it read this round: the round drafts
        nothing (the target answers plainly meanwhile)."""
        return False

    def set_threads(self, n: int) -> None:
        """CPU threads, for a drafter with a context of its own that the engine does not hold."""

    def clear(self) -> None:
        """Forget any cached conversation (as the target does on reset)."""

    def close(self) -> None:
        """Free what the drafter holds of llama.cpp (before the target's context goes)."""


def _read_through(attr: str) -> property:
    return property(lambda self: getattr(self.inner, attr), doc=f"The wrapped drafter's ``{attr}``.")


class Wrapper(Drafter):
    """A drafter around another (``inner``) that changes what it sees or adds to its rounds, not what it is: its
    name, signals and settings are the inner drafter's, read through (never copied, so they cannot drift apart),
    and what a wrapper does not override is passed on."""

    name, label, p_min = _read_through("name"), _read_through("label"), _read_through("p_min")
    SIGNAL_EDGES, SIGNAL_PRIOR = _read_through("SIGNAL_EDGES"), _read_through("SIGNAL_PRIOR")
    SIGNAL_GROWS, AFTER_FORCED = _read_through("SIGNAL_GROWS"), _read_through("AFTER_FORCED")
    speculates, READS_TEXT = _read_through("speculates"), _read_through("READS_TEXT")

    def __init__(self, inner: Drafter):
        self.inner = inner

    def with_p_min(self, p_min: float) -> Drafter:
        self.inner.with_p_min(p_min)
        return self

    def begin(self, prompt_ids: list[int]) -> None:
        self.inner.begin(prompt_ids)

    def read_on(self) -> bool:
        return self.inner.read_on()

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        return self.inner.propose(history, n_max, sp, rng, gate, stop)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def set_threads(self, n: int) -> None:
        self.inner.set_threads(n)

    def clear(self) -> None:
        self.inner.clear()

    def close(self) -> None:
        self.inner.close()


class NoDrafter(Drafter):
    """Speculation off: the same loop, verifying one token per round."""

    name = "none"
    label = "off"
    SIGNAL_PRIOR = (0.0,)
    speculates = False

    def propose(self, history, n_max, sp, rng, gate=None, stop=None) -> Draft:
        return Draft()
