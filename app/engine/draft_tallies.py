"""An answer's rounds, decayed, as the adaptive controller (``draft_control.DraftLength``) weighs them: the rounds that
called a draft model against what the costs said they would take (``DraftedRounds``: a loss the cost model does not
see), and every round's pace (``Pace``: what an accepted token spares under a growing signal). Each is a value:
``add`` returns the next."""
from __future__ import annotations

from dataclasses import dataclass

from .measured import DECAY


@dataclass(frozen=True)
class DraftedRounds:
    """The rounds that called a draft model, decayed: how many, the tokens they made, their seconds, and what the
    costs said they would take."""

    rounds: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    modelled: float = 0.0

    def add(self, tokens: int, seconds: float, modelled: float) -> DraftedRounds:
        d = DECAY
        return DraftedRounds(d * self.rounds + 1, d * self.tokens + tokens, d * self.seconds + seconds,
                             d * self.modelled + modelled)

    def lose(self, plain_step: float, unseen: float) -> bool:
        """Did these rounds make tokens more slowly than plain steps of ``plain_step`` seconds, and take more than
        ``unseen`` longer than the costs say such rounds take (costs the model does not see, not the host's noise)?"""
        return (self.rounds >= 6 and self.tokens / self.seconds < 1.0 / plain_step
                and self.seconds > self.modelled * (1.0 + unseen))


@dataclass(frozen=True)
class Pace:
    """Every round, decayed: the tokens made and their seconds."""

    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> Pace:
        return Pace(DECAY * self.tokens + tokens, DECAY * self.seconds + seconds)

    def token_time(self, plain_step: float) -> float:
        """What an accepted token spares at this pace: the seconds per token lately, or a plain step where less."""
        return min(plain_step, self.seconds / self.tokens) if self.tokens else plain_step
