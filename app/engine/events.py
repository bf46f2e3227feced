"""Typed events the speculative loop emits; the CLI and the UI render these and nothing else."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .drafters.registry import OFF, label
from .logprobs import TokenLogprob


@dataclass
class Stats:
    """Running, measured numbers for one generation (never estimated)."""

    drafter: str = OFF
    prompt_tokens: int = 0  # tokens the target had to evaluate for the prompt (after prefix reuse)
    prompt_cached: int = 0  # prompt tokens reused from the previous turn's KV cache
    n_tokens: int = 0  # generated tokens committed to the output
    n_drafted: int = 0  # draft tokens sent to the target for verification
    n_accepted: int = 0  # of those, how many the target accepted
    n_forced: int = 0  # of the draft tokens, those a grammar forced (proposed free, verified all the same)
    n_forced_accepted: int = 0
    n_rounds: int = 0  # verification passes of the target (one per committed target token)
    time_to_first_token_s: float = 0.0
    decode_seconds: float = 0.0  # from the first token to the last
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    grammar_seconds: float = 0.0  # spent in the grammar (masks, checks, forced tokens), when one constrains the answer
    seed: int = -1  # the sampler's seed where the answer was sampled (temperature above 0): -1 greedy, or not known
    # several drafters at once (a chain): per member, (rounds it drafted, its tokens verified, of those accepted)
    by_drafter: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # A generation run by another server: the fields it does not report (shown as such, never as zeros), its own
    # tokens/s figure beside ours, and why its stream ended early if it did.
    unreported: tuple[str, ...] = ()
    server_tokens_per_second: float | None = None
    error: str = ""

    @property
    def method(self) -> str:
        return label(self.drafter)

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def rate_measured(self) -> bool:
        """A rate needs two timed tokens: the first only starts the clock. Until then tokens/s is unknown (0.0)."""
        return self.n_tokens > 1 and self.decode_seconds > 0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first, over the time since the first (prompt processing excluded)."""
        return (self.n_tokens - 1) / self.decode_seconds if self.rate_measured else 0.0

    @property
    def mean_accepted_per_round(self) -> float:
        return self.n_accepted / self.n_rounds if self.n_rounds else 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "Stats":
        """Saved stats (perhaps from an older or newer version) back into Stats: unknown keys are ignored."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and v is not None}  # None: unreported
        if "unreported" in known:
            known["unreported"] = tuple(known["unreported"])
        return cls(**known)

    def reported(self, name: str) -> bool:
        derived = {"acceptance_rate": "n_drafted", "mean_accepted_per_round": "n_rounds"}
        return name not in self.unreported and derived.get(name, name) not in self.unreported

    def then(self, later: Stats) -> Stats:
        """One answer written in two runs (Continue): both runs' counts and times. Its speed runs from this run's
        first token to the later run's last, the pause between the runs left out and the later run's reading of the
        prompt kept in: tokens over time measured, as for one run. Where the runs drafted differently, each one's
        share is kept per drafter."""
        if not self.n_tokens:  # (the earlier run wrote nothing: the later one is the whole answer)
            return later
        summed = {f: getattr(self, f) + getattr(later, f) for f in (
            "n_tokens", "n_drafted", "n_accepted", "n_forced", "n_forced_accepted", "n_rounds", "draft_seconds",
            "verify_seconds", "grammar_seconds")}
        gap = later.time_to_first_token_s + later.decode_seconds if later.n_tokens else 0.0
        by: dict[str, tuple[int, int, int]] = {}
        for part in (self, later):  # a chain's members, or each run's drafter where the two differ
            shares = part.by_drafter or ({} if self.drafter == later.drafter else
                                         {part.drafter: (part.n_rounds, part.n_drafted, part.n_accepted)})
            for name, (r, d, a) in shares.items():
                r0, d0, a0 = by.get(name, (0, 0, 0))
                by[name] = (r0 + r, d0 + d, a0 + a)
        return replace(later, **summed, prompt_tokens=self.prompt_tokens, prompt_cached=self.prompt_cached,
                       time_to_first_token_s=self.time_to_first_token_s, decode_seconds=self.decode_seconds + gap,
                       by_drafter=by, unreported=tuple(dict.fromkeys(self.unreported + later.unreported)),
                       server_tokens_per_second=None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_second=self.tokens_per_second,
            mean_accepted_per_round=self.mean_accepted_per_round,
        )
        d["unreported"] = list(self.unreported)
        return {k: (v if self.reported(k) else None) for k, v in d.items()}


@dataclass
class TextDelta:
    """New output text. ``from_draft`` is true when the token that completed it was a draft token the target
    accepted. Text is UTF-8 safe: a character split across tokens arrives whole, with its last token."""

    text: str
    token_ids: list[int]
    from_draft: bool
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the generation asked for them
    drafter: str = ""  # with from_draft: the drafter that drafted it (a chain's member: the one whose draft it was)


@dataclass
class Round:
    """One draft-and-verify round."""

    n_drafted: int
    n_accepted: int
    draft_seconds: float
    verify_seconds: float
    stats: Stats


@dataclass
class Done:
    """The generation ended. ``finish_reason``: stop (EOS/EOG or stop string), length (max tokens or context
    full), cancelled."""

    finish_reason: str
    text: str
    token_ids: list[int]
    stats: Stats
    draft_flags: list[bool] = field(default_factory=list)  # per token: came from an accepted draft token
    logprobs: list[TokenLogprob] | None = None  # per token id, when the generation asked for them


@dataclass
class PromptProgress:
    """Prompt evaluation under way, after each batch (only when the generation asks: ``prompt_progress``): of the
    prompt's ``total`` tokens, ``cache`` came from the cache and ``processed`` are evaluated now (cached included),
    ``seconds`` since the generation began (llama-server's ``prompt_progress``)."""

    total: int
    cache: int
    processed: int
    seconds: float


Event = TextDelta | Round | Done | PromptProgress
