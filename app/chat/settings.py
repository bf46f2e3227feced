"""The app's settings: what the user chose in the UI, validated into engine parameters, saved between runs."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from ..engine import DRAFT_MODEL, DraftParams, EngineError, GenerationParams, SamplingParams
from ..engine.drafters import NgramParams, registry
from ..models.loader import LoadSpec
from ..paths import config_dir
from ..json_files import load_json, save_json

FILE = "settings.json"
LOAD_SPECS = ("models", "server")  # the fields that are what to load, not how to generate


def usable_drafter(drafter: str, drafters: tuple[str, ...]) -> str:
    """``drafter`` where a pair that can use ``drafters`` (its default first) can run it, else that default; as it
    is where nothing is known of the pair yet (no drafters)."""
    return drafter if not drafters or registry.runs_on(drafter, drafters) else drafters[0]


@dataclass(frozen=True)
class Settings:
    system_prompt: str = ""
    drafter: str = DRAFT_MODEL  # a method of the drafter registry, an n-gram kind, or several joined by commas
    temperature: float = 0.7  # sampled, as LM Studio's chat: Regenerate gives another answer (Compare shares a seed)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    max_tokens: int = 512
    draft_max: int = 8
    draft_min: int = 0
    draft_p_min: float = 0.5
    adaptive: bool = False
    enable_thinking: bool = True  # passed to the chat template (Qwen3 thinks unless told not to, as Qwen ships it)
    show_draft_tokens: bool = False
    # the n-gram kinds' settings that differ from llama.cpp's defaults (flags or settings.json; not in the panel)
    ngram: dict = field(default_factory=dict, metadata={"panel": False})
    models: LoadSpec | None = None  # the last pair loaded (or server connected to)
    server: LoadSpec | None = None  # the last server connected to: its fields stay filled while a pair is loaded

    def generation(self) -> GenerationParams:
        """Engine parameters, validated: an invalid value raises EngineError with a plain explanation."""
        registry.parts(self.drafter)  # an unknown drafter is refused in words
        try:
            params = GenerationParams(
                max_tokens=int(self.max_tokens),
                sampling=SamplingParams(float(self.temperature), int(self.top_k), float(self.top_p),
                                        float(self.min_p), int(self.seed)),
                draft=self.draft_params(),
                prompt_progress=True,  # (the chat and Compare show a long prompt's reading as it goes)
            )
        except (TypeError, ValueError) as exc:
            raise EngineError(f"Invalid setting: {exc}") from exc
        params.validate()
        return params

    def draft_params(self) -> DraftParams:
        try:
            ngram = NgramParams(**self.ngram)
        except TypeError as exc:
            raise EngineError(f"Invalid n-gram setting: {exc}") from None
        return DraftParams(int(self.draft_max), int(self.draft_min), float(self.draft_p_min), bool(self.adaptive),
                           ngram)

    def with_draft_params(self, dp: DraftParams) -> "Settings":
        return replace(self, draft_max=dp.draft_max, draft_min=dp.draft_min, draft_p_min=dp.draft_p_min,
                       adaptive=dp.adaptive)

    def for_pair(self, recommended: DraftParams | None, drafters: tuple[str, ...],
                 preferred: str | None = None) -> "Settings":
        """Settings for a newly loaded pair: its recommended draft settings (if given), and the drafter measured
        fastest for it (``preferred``, by ``specchat check --measure``), else the drafter chosen if the pair can use
        it, else the pair's default (``drafters`` lists those it can use, default first: a model with MTP layers and
        no draft model drafts with MTP)."""
        s = self.with_draft_params(recommended) if recommended else self
        return replace(s, drafter=preferred or usable_drafter(s.drafter, drafters))

    def loaded(self, spec: LoadSpec | None) -> "Settings":
        """These settings with ``spec`` as the last thing loaded; a server's fields are also kept apart, so they
        stay filled while a local pair is loaded."""
        if spec is None:
            return self
        return replace(self, models=spec, server=spec if spec.server else self.server)

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in LOAD_SPECS:
            d[name] = getattr(self, name).as_dict() if getattr(self, name) else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Settings":
        """Tolerant of files from older or newer versions: unknown keys are ignored, wrong types fall back."""
        base = cls()
        values = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name in LOAD_SPECS:
                values[f.name] = LoadSpec.from_dict(v) if isinstance(v, dict) else None
            elif isinstance(v, type(getattr(base, f.name))) or (isinstance(v, int) and f.type == "float"):
                values[f.name] = v
        return replace(base, **values)


def load_settings() -> tuple[Settings, str | None]:
    data, warning = load_json(config_dir() / FILE)
    return (Settings.from_dict(data) if data else Settings()), warning


def save_settings(s: Settings) -> None:
    save_json(config_dir() / FILE, s.as_dict())


def saved_at() -> float:
    """When the settings were last saved (0: never)."""
    try:
        return (config_dir() / FILE).stat().st_mtime
    except OSError:
        return 0.0
