"""The app's core, below any UI: the ``Runtime`` owns the backend (a loaded pair, or a server that speculates
itself) and streams chat answers (``live_answer.Live``) and on/off comparisons (``comparison.Comparison``) as
snapshots.

The Gradio UI (app/ui) only renders what this module yields, whichever backend is behind; tests drive it directly too.
"""
from __future__ import annotations

import secrets
import threading
from dataclasses import replace
from typing import Callable, Iterator

from ..engine import (DRAFT_MODEL, DRAFTERS, OFF, DraftParams, Engine, EngineError, inexact_note, method_name,
                      supports_gpu_offload)
from ..engine.drafters import registry
from ..engine.images import through_images
from ..models.hardware import unused_gpu_advice
from ..models.loader import LoadSpec, Resolved, load_engine, resolve
from ..prompts import chat_prompt, chat_tokens, image_messages, prompt_tokens, text_of
from ..prompts.thinking import OPEN, opens_thinking
from .acceptance_memory import memory_for
from .comparison import Comparison
from .live_answer import Live
from .machine_load import LoadWatch
from .method_ranking import Ranking, recall
from .remote_server import RemoteServer, ServerSpec
from .server_keys import key_for, save_key
from .settings import Settings
from .streaming import INTERVAL, Generation
from .worker import WorkerEngine

RELOAD_WAIT_S = 300  # a chat message waits this long for a crashed worker's pair to load again


def _load(spec: LoadSpec, resolved: Resolved) -> Engine:
    """The pair, with how its drafters' tokens fared in earlier launches (acceptance_memory)."""
    return load_engine(spec, resolved, memory=memory_for(resolved.target, resolved.draft))


class Runtime:
    """Holds the backend: a loaded pair, or a connection to a server that speculates itself (``spec.server``).
    Loading replaces it (a pair is freed first: two pairs rarely fit at once)."""

    def __init__(self, worker: bool = False):
        """``worker``: load pairs in an engine worker process (``worker.WorkerEngine``), so that a crash inside
        llama.cpp ends that process and not this one; else in this process (one-shot commands, most tests)."""
        self.worker = worker
        self.engine: Engine | WorkerEngine | None = None
        self.remote: RemoteServer | None = None
        self.remote_off: RemoteServer | None = None  # the same model without speculation, for Compare
        self.spec: LoadSpec | None = None
        self.resolved: Resolved | None = None
        self._load_lock = threading.Lock()

    # --- models ---------------------------------------------------------------------------------------------
    def load(self, spec: LoadSpec, progress: Callable[[float, str], None] = lambda f, m: None,
             api_key: str | None = None) -> None:
        """Load a pair, or connect to a server (``api_key``: a new key for it, saved once the server accepts it;
        else the saved one). On failure the previous one stays (a pair is loaded back) and the error is raised."""
        if spec.server:
            return self._connect(spec, progress, api_key)
        with self._load_lock:
            previous = self.spec
            progress(0.05, f"Finding {spec.describe()}…")
            resolved = resolve(spec)  # fails early (missing download, bad name) with the old pair still loaded
            progress(0.2, "Freeing the previous pair…")
            self._close_engine()
            self._close_remote()
            try:
                progress(0.35, "Checking files and vocabularies, loading weights…")
                self.engine = self._load(spec, resolved)
                # (a worker whose load crashed offloading loads on the CPU: its spec says so)
                self.spec, self.resolved = getattr(self.engine, "spec", spec), resolved
                progress(1.0, "Loaded")
            except EngineError as exc:
                if previous is not None:
                    progress(0.7, "Reloading the previous pair…")
                    try:
                        self.engine = self._load(previous, self.resolved)
                    except EngineError:
                        self.spec = self.resolved = None
                        raise EngineError(f"{exc} (The previous pair could not be reloaded either.)") from exc
                    raise EngineError(f"{exc} The previous pair ({previous.describe()}) is still loaded.") from exc
                self.spec = self.resolved = None
                raise

    def _load(self, spec: LoadSpec, resolved: Resolved) -> Engine | WorkerEngine:
        return WorkerEngine(spec, resolved) if self.worker else _load(spec, resolved)

    def _connect(self, spec: LoadSpec, progress: Callable[[float, str], None], api_key: str | None) -> None:
        """Check the server (and the speculation-off one) before letting go of what is loaded now."""
        with self._load_lock:
            progress(0.1, f"Connecting to {spec.server}…")
            key = api_key or key_for(spec.server)
            on = RemoteServer(ServerSpec(spec.server, key, spec.model or None, spec.method or None))
            off = None
            try:
                on.models()  # reachable, the key accepted
                _ = on.model  # the model asked for, or the first it lists
                on.identify()
                if spec.server_off:
                    progress(0.4, f"Connecting to {spec.server_off}…")
                    off = RemoteServer(ServerSpec(spec.server_off, key_for(spec.server_off) or key))
                    off.model = on.model if on.model in (models := off.models()) else models[0]
            except EngineError:
                on.close()
                if off is not None:
                    off.close()
                raise
            if api_key:
                save_key(spec.server, api_key)  # accepted: remembered for next time
            progress(0.7, "Freeing the local pair…")
            self._close_engine()
            self._close_remote()
            self.remote, self.remote_off = on, off
            self.spec, self.resolved = replace(spec, model=on.model), None
            progress(1.0, "Connected")

    def _close_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _close_remote(self) -> None:
        for server in (self.remote, self.remote_off):
            if server is not None:
                server.close()
        self.remote = self.remote_off = None

    def close(self) -> None:
        with self._load_lock:
            self._close_engine()
            self._close_remote()

    @property
    def recommended(self) -> DraftParams | None:
        """The loaded pair's recommended draft settings (a server keeps its own)."""
        return self.resolved.draft_params if self.resolved else None

    @property
    def ranking(self) -> Ranking | None:
        """What ``specchat check --measure`` found fastest for the loaded pair's files on this machine, if run."""
        return recall(self.resolved.target, self.resolved.draft) if self.engine and self.resolved else None

    @property
    def preferred(self) -> str | None:
        """The drafter a newly loaded pair starts with: the measured fastest where one was measured."""
        r = self.ranking
        return r.best if r and registry.runs_on(r.best, self.drafters) else None

    def _engine(self) -> Engine | WorkerEngine:
        """The loaded pair's engine; one whose worker is loading the pair again after a crash is waited for."""
        if self.engine is None:
            raise EngineError("No model pair is loaded: choose one under Settings → Models and press Load.")
        if isinstance(self.engine, WorkerEngine):
            self.engine.wait_ready(RELOAD_WAIT_S)
        return self.engine

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters the loaded pair can use, its default first (a server drafts its own way: any means "on")."""
        return self.engine.drafters if self.engine else DRAFTERS if self.remote else ()

    @property
    def takes_images(self) -> bool:
        """Whether the loaded pair reads images (its target has a vision projector), or the server may (it says so,
        or does not tell: then it answers an image it cannot read with an error)."""
        if self.remote is not None:
            return self.remote.takes_images() is not False
        return self.engine is not None and self.engine.projector is not None

    def _drafter(self, kind: str) -> str:
        self._engine().check_drafter(kind)
        return kind

    def info(self) -> dict:
        e, r = self.engine, self.remote
        worker = e.process_info() if isinstance(e, WorkerEngine) else None
        live = e if e is not None and (worker is None or worker["state"] == "ready") else None  # (it answers now)
        return {
            "pair": self.spec.describe() if self.spec else None,
            "target": e.model.path.name if e else r.model if r else None,
            "draft": e.draft_model.path.name if e and e.draft_model else None,
            "mmproj": e.projector.path.name if e and e.projector else None,  # takes images
            "n_ctx": e.n_ctx if e else 0,
            "memory_bytes": live.memory_bytes() if live else 0,
            "recurrent": live.recurrent_states() if live else [],
            "threads": live.threads() if live else {},
            "offload": live.offload() if live else {},
            "worker": worker,
            "gpu_offload": supports_gpu_offload(),
            "gpu_advice": unused_gpu_advice(),  # a GPU here the build cannot use
            "server": {"url": r.base, "engine": r.identify(), "method": r.method(), "model": r.model,
                       "off": self.remote_off.base if self.remote_off else None} if r else None,
        }

    def forget_answers(self) -> None:
        """Forget the earlier answers "suffix" drafts from (every scope's: the app's and each API key's)."""
        if self.remote is None:
            self._engine().forget_answers()

    # --- chat -----------------------------------------------------------------------------------------------
    def answer(self, messages: list[dict], settings: Settings, cancel: threading.Event | None = None,
               interval: float = INTERVAL, continues: Live | None = None) -> Iterator[Live]:
        """Stream the assistant's reply to ``messages`` (role/content dicts, system prompt included). ``continues``:
        the reply so far (Continue: one cut at the token limit, stopped or interrupted), which the model goes on
        from as llama-server continues a final assistant message; the Live yielded is that one, growing, its
        figures counting both runs. The token limit is the new run's."""
        params = settings.generation()
        live = continues if continues is not None else Live()
        if continues is not None:
            messages = [*messages, {"role": "assistant", "content": continues.text}]
        if (server := self.remote) is not None:  # the server applies its template; any drafter means "speculate"
            kwargs = _template_kwargs(settings)
            run = lambda c: server.generate(messages, params, settings.drafter != OFF, c, kwargs)  # noqa: E731
            for _ in _stream(run, cancel, interval, live):
                yield live
            return
        engine = self._engine()
        drafter = self._drafter(settings.drafter)
        text_messages, images = image_messages(engine.model, messages, engine.projector)  # (image parts: bytes)
        prompt = chat_prompt(engine.model, text_messages, enable_thinking=settings.enable_thinking,
                             continue_final_message=continues is not None)
        if continues is None and opens_thinking(prompt):  # the template opened a thinking block: the answer
            live.segments.append([OPEN + "\n", False])  # starts inside it
        ids = prompt_tokens(engine.model, prompt, engine.projector, images)
        for _ in _stream(lambda c: engine.generate(ids, params, drafter, c), cancel, interval, live):
            yield live

    def compare(self, messages: list[dict], settings: Settings, cancel: threading.Event | None = None,
                interval: float = INTERVAL) -> Iterator[Comparison]:
        """Speculation off, then on, one after the other so each run has the whole machine; both start from the same
        cache, empty but for the prompt's images (encoded once, before either run), so neither reuses the other's
        prompt evaluation. With a server: its speculation-off twin, or the same server asked for speculation off
        (``speculative.n_max: 0``), then on; the outputs compared as text."""
        params = settings.generation()
        # Neither run joins the earlier answers: the run with speculation on must not draft from the one without
        params = replace(params, draft=replace(params.draft, remember=False))
        if settings.drafter == OFF:
            raise EngineError("Comparing needs a drafter: choose one in Settings (speculation is off).")
        watch = LoadWatch()  # other programs' load, before the runs and during them: Compare warns of it
        if self.remote is not None:  # greedy: a server's sampling need not repeat with speculation on and off
            greedy = replace(params, sampling=replace(params.sampling, temperature=0.0))
            yield from self._compare_remote(messages, greedy, _template_kwargs(settings), cancel or threading.Event(),
                                            interval, watch, sampled=not params.sampling.greedy)
            return
        engine = self._engine()
        drafter = self._drafter(settings.drafter)
        ids = chat_tokens(engine.model, messages, engine.projector, enable_thinking=settings.enable_thinking)
        cancel = cancel or threading.Event()
        if params.sampling.seed < 0:  # one seed for both runs: sampled, they then give the same answer too
            params = replace(params, sampling=replace(params.sampling, seed=secrets.randbits(31)))
        cmp = Comparison(text_of(messages[-1]["content"]), drafter, True, busy_before=watch.before,
                         cores=watch.cores)
        keep = ids[: through_images(ids)]  # both runs start from the prompt's images, encoded once (before either)
        for phase, kind in (("off", OFF), ("on", drafter)):
            cmp.phase = phase
            live = getattr(cmp, phase)
            engine.reset(keep)
            for _ in _stream(lambda c, kind=kind: engine.generate(ids, params, kind, c), cancel, interval, live):
                yield cmp
            if cancel.is_set():
                break
        if not cancel.is_set() and drafter == DRAFT_MODEL and engine.has_draft_context:
            cmp.phase = "ceiling"  # so that a speedup can be read against what this pair can reach here, now
            yield cmp
            cmp.ceiling = engine.ceiling(params.draft.draft_max, drafter)
            cmp.others = tuple(method_name(m) for m in engine.alternatives())
        cmp.busy_during = watch.since()
        cmp.phase = "done"
        cmp.locate_difference(engine.detokenize)
        if cmp.diff_spans is not None:  # the two parted (on a GPU: said why)
            cmp.note = inexact_note(engine.offload()["target"]["n_gpu_layers"])
        yield cmp

    def _compare_remote(self, messages, params, kwargs, cancel, interval, watch,
                        sampled: bool = False) -> Iterator[Comparison]:
        on, off = self.remote, self.remote_off
        cmp = Comparison(text_of(messages[-1]["content"]), f"server: {on.method()}", params.sampling.greedy,
                         by_text=True, busy_before=watch.before, cores=watch.cores)
        if sampled:
            cmp.note = ("Compared greedy (temperature 0), not at the chat's temperature: a server's sampled answers "
                        "need not repeat with speculation on and off, even with one seed.")
        for phase, server, speculate in (("off", off or on, off is not None), ("on", on, True)):
            cmp.phase = phase
            def run(c, server=server, speculate=speculate):  # (bound now: called within this turn of the loop)
                return server.generate(messages, params, speculate, c, kwargs)

            for _ in _stream(run, cancel, interval, getattr(cmp, phase)):
                yield cmp
            if cancel.is_set():
                break
        s = cmp.off.stats
        if off is None and s.reported("n_drafted") and s.n_drafted:
            cmp.note = " ".join(filter(None, (cmp.note, (
                f"{on.base} kept drafting ({s.n_drafted} draft tokens) with speculation off requested: it cannot turn "
                "speculation off per request (llama-server cannot). Serve the same model without a draft and give its "
                "URL as the speculation-off server under Settings → Models."))))
        cmp.busy_during = watch.since()
        cmp.phase = "done"
        cmp.locate_difference(lambda ids: "")  # by text: no tokens to detokenize
        yield cmp


def _template_kwargs(settings: Settings) -> dict | None:
    """What a server's chat template is told: thinking off when the person turned it off, else its own default."""
    return None if settings.enable_thinking else {"enable_thinking": False}


def _stream(run, cancel, interval: float, live: Live) -> Iterator[None]:
    """Run one generation (``run(cancel)`` yields events) on a worker thread, folding each batch into ``live``."""
    gen = Generation(run, cancel)
    for batch in gen.batches(interval):
        for ev in batch:
            live.add(ev)
        yield
