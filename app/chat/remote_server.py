"""Chat with a model served elsewhere: an OpenAI-compatible server that does its own speculation (llama.cpp's
llama-server with ``-md``, SpecChat's ``specchat serve``) streams the answer, and this module turns the stream into
the engine's events, so the CLI and bench consume it like a local generation.

The speculation figures are the server's own, per request:
- llama-server (and ``specchat serve``): ``timings`` (``draft_n``, ``draft_n_accepted``, ``predicted_n``,
  ``predicted_per_second``, ``prompt_n``, ``cache_n``), live with ``timings_per_token``;
- vLLM: the response's ``metrics.speculative_decoding`` (server flag ``--per-request-spec-decode-metrics``), else its
  Prometheus counters ``vllm:spec_decode_num_draft_tokens_total`` / ``..._accepted_tokens_total`` read before and after
  the request (labelled server-wide when other requests finished meanwhile);
- SGLang: ``sglext.spec_tokens_details`` (asked for with ``return_spec_tokens_details``) or a ``meta_info`` object
  (``spec_verify_ct``, ``spec_accept_rate``);
- Hugging Face TGI: its Prometheus histogram ``tgi_request_skipped_tokens`` (tokens that came from speculation, per
  decoding step) read around the request. TGI reports no drafted count, so no acceptance rate.
Tokens/s and time to first token are also measured here, from the stream. What a server does not report (per-token
draft provenance, per-round timing, token ids; draft counts when it reports none) is listed in ``Stats.unreported``
and shown as "not reported", never as a zero.
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Iterator

import httpx

from ..engine import Done, EngineError, GenerationParams, Round, Stats, TextDelta
from ..prompts.thinking import CLOSE, OPEN

NEVER_REPORTED = ("token_ids", "draft_flags", "draft_seconds", "verify_seconds")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eE]+|NaN)\s*$", re.M)
# Prometheus samples read around a request, per engine: {our name: metric} (samples summed over label sets).
COUNTERS = {
    "vLLM": {"drafted": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total",
             "rounds": "vllm:spec_decode_num_drafts_total",
             "finished": "vllm:request_success_total"},
    "TGI": {"accepted": "tgi_request_skipped_tokens_sum",  # one sample per decoding step: tokens beyond its first
            "rounds": "tgi_request_skipped_tokens_count",
            "finished": "tgi_request_success"},
}
DRAFT_FIELDS = ("n_drafted", "n_accepted", "n_rounds")


class RemoteError(EngineError):
    """The server could not be used; worded for the person who pointed SpecChat at it."""


def base_url(url: str) -> str:
    """A server's base URL as given (with or without /v1), checked; without /v1 and trailing slashes."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise RemoteError(f"{url!r} is not a server URL: write http://host:port (e.g. http://127.0.0.1:8080).")
    return base.removesuffix("/v1")


@dataclass(frozen=True)
class ServerSpec:
    url: str  # base URL, with or without /v1
    api_key: str | None = None
    model: str | None = None  # the server's model id; None: the first it lists
    method: str | None = None  # the person's own name for how it speculates (e.g. "EAGLE-3, 4 tokens")


_NOT_ASKED = object()  # (RemoteServer.takes_images before the server was asked)


class RemoteServer:
    """One OpenAI-compatible server. Requests are made one at a time, like the local engine's."""

    def __init__(self, spec: ServerSpec, timeout: float = 600.0):
        self.base = base_url(spec.url)
        self.spec = spec
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self._model = spec.model
        self._engine: str | None = None
        self._method: str | None = None
        self._vision: bool | None | object = _NOT_ASKED

    def close(self) -> None:
        self._http.close()

    # --- what is there ---------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        data = self._get_json("/v1/models")
        ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
        if not ids:
            raise RemoteError(f"{self.base} lists no models at /v1/models.")
        return ids

    def identify(self) -> str:
        """Which engine serves: llama.cpp's llama-server (its /props carries build_info), SGLang (/server_info),
        Hugging Face TGI (/info names its router), vLLM (/version), or the owner /v1/models names (specchat, ...);
        "OpenAI-compatible" when nothing tells."""
        if self._engine is None:
            self._engine, self._method = self._identify()
        return self._engine

    def method(self) -> str:
        """How the server speculates: the person's own label, else what the server says, else "method not
        reported" (llama-server's /props names no draft method; vLLM's API names none)."""
        self.identify()
        return self.spec.method or self._method or "method not reported"

    def takes_images(self) -> bool | None:
        """Whether the server reads images: llama-server and SpecChat say so in /props (``modalities.vision``);
        None where the server does not tell (vLLM, SGLang: one that cannot read an image answers it with an error)."""
        if self._vision is _NOT_ASKED:
            modalities = self._probe("/props").get("modalities")
            self._vision = bool(modalities.get("vision")) if isinstance(modalities, dict) else None
        return self._vision

    def _probe(self, path: str) -> dict:
        """A JSON object the server may serve at ``path`` ({} where it does not)."""
        try:
            resp = self._http.get(self.base + path, timeout=5.0)
            data = resp.json() if resp.status_code == 200 else {}
            return data if isinstance(data, dict) else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def _identify(self) -> tuple[str, str | None]:
        probe = self._probe
        listed = [m for m in probe("/v1/models").get("data", []) if isinstance(m, dict)]
        owners = {m.get("owned_by") for m in listed}
        said = next((m["speculation"] for m in listed if isinstance(m.get("speculation"), str)), None)  # specchat serve
        if "specchat" in owners:  # (first: it serves llama-server's /props too)
            return "specchat", said
        if "build_info" in (props := probe("/props")):
            types = (props.get("default_generation_settings") or {}).get("speculative.types")
            # Builds that speculate still say "none" here: only a real type is taken as the method.
            return "llama.cpp llama-server", types if types and types != "none" else None
        info = probe("/server_info") or probe("/get_server_info")
        if "sglang" in owners or "speculative_algorithm" in info:
            algo, n = info.get("speculative_algorithm"), info.get("speculative_num_draft_tokens")
            return "SGLang", (f"{algo}" + (f", {n} draft tokens" if n else "")) if algo else None
        if str((tgi := probe("/info")).get("router", "")).startswith("text-generation-router"):
            return f"TGI {tgi.get('version', '')}".strip(), None
        if "version" in (version := probe("/version")):
            return f"vLLM {version['version']}", None
        owner = next((o for o in owners if o and o not in ("openai", "system")), None)
        return owner or "OpenAI-compatible", said

    @property
    def model(self) -> str:
        """The model id requests name: the one asked for, else the first the server lists."""
        if self._model is None:
            self._model = self.models()[0]
        return self._model

    @model.setter
    def model(self, name: str) -> None:
        self._model = name

    def _get_json(self, path: str) -> dict:
        try:
            resp = self._http.get(self.base + path)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        self._raise_for(resp)
        try:
            return resp.json()
        except ValueError as exc:
            raise RemoteError(f"{self.base}{path} did not answer JSON: is this an OpenAI-compatible server?") from exc

    def _unreachable(self, exc: Exception) -> RemoteError:
        return RemoteError(f"Cannot reach {self.base} ({type(exc).__name__}): is the server running, and is the "
                           "URL right?")

    def _raise_for(self, resp: httpx.Response) -> None:
        if resp.status_code < 400:
            return
        try:
            resp.read()
            err = resp.json().get("error", {})
            message = err.get("message") if isinstance(err, dict) else str(err)
        except (ValueError, AttributeError, httpx.HTTPError):
            message = resp.text[:200] if resp.is_stream_consumed else ""
        if resp.status_code == 401:
            raise RemoteError(f"{self.base} refused the API key (401){': ' + message if message else ''}. Give the "
                              "server's key with --api-key.")
        if resp.status_code == 404 and "model" in (message or "").lower():
            raise RemoteError(f"{self.base} has no model {self._model!r} (404): {message}. Its models: "
                              f"{', '.join(self.models())}.")
        raise RemoteError(f"{self.base} answered {resp.status_code}{': ' + message if message else ''}.")

    # --- generation ------------------------------------------------------------------------------------------
    def generate(self, messages: list[dict], params: GenerationParams, speculate: bool = True,
                 cancel: threading.Event | None = None,
                 template_kwargs: dict | None = None) -> Iterator[TextDelta | Round | Done]:
        """Stream one chat answer as events. ``speculate=False`` asks for speculation off in the request
        (``speculative.n_max: 0``); whether the server honoured it shows in its ``draft_n``. ``template_kwargs``
        go to the server's chat template (``chat_template_kwargs``, e.g. ``enable_thinking``). A last message that
        is the assistant's is continued. Reasoning a server streams apart (``reasoning_content``) comes back inside
        ``<think>…</think>``, as a local model writes it."""
        sp = params.sampling
        body = {
            "model": self.model, "messages": _wire(messages), "stream": True, "max_tokens": params.max_tokens,
            "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "min_p": sp.min_p,
            "stream_options": {"include_usage": True}, "timings_per_token": True,
        }
        if sp.seed >= 0:
            body["seed"] = sp.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if not speculate:
            body["speculative"] = {"n_max": 0}
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if messages and messages[-1]["role"] == "assistant":  # the answer goes on from its text (Continue): said
            body.update(continue_final_message=True, add_generation_prompt=False)  # as llama-server and vLLM read it
        engine = self.identify()
        if engine == "SGLang":
            body["return_spec_tokens_details"] = True
        stats = Stats(drafter=f"server: {self.method()}", unreported=NEVER_REPORTED + DRAFT_FIELDS)
        kind = engine.split()[0]
        counters = self._counters(kind) if kind in COUNTERS else None
        text, finish, thinking = [], None, False
        t_start = time.perf_counter()
        t_first = None
        try:
            with self._http.stream("POST", self.base + "/v1/chat/completions", json=body) as resp:
                self._raise_for(resp)
                for chunk in _sse(resp):
                    if cancel is not None and cancel.is_set():
                        finish = "cancelled"
                        break
                    now = time.perf_counter()
                    choice = (chunk.get("choices") or [{}])[0]
                    delta = choice.get("delta") or {}
                    thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    piece = delta.get("content") or ""
                    if thought or (piece and thinking):  # thinking streamed apart (llama-server, vLLM, SGLang)
                        piece, thinking = _in_tags(thought, piece, thinking)
                    finish = choice.get("finish_reason") or finish
                    if piece:
                        if t_first is None:
                            t_first = now
                            stats.time_to_first_token_s = now - t_start
                        text.append(piece)
                        stats.n_tokens += 1  # a chunk per token until the server's own count arrives
                        stats.decode_seconds = now - t_first
                    before = (stats.n_drafted, stats.n_accepted)
                    if (figures := _take_figures(stats, chunk)) and figures != "timings":
                        stats.drafter = f"server: {self.method()} ({figures})"
                    if piece:
                        yield TextDelta(piece, [], False)
                    if figures:
                        yield Round(stats.n_drafted - before[0], stats.n_accepted - before[1], 0.0, 0.0,
                                    replace(stats))
        except httpx.HTTPError as exc:
            if not text:
                raise self._unreachable(exc) from exc
            finish = "error"  # the stream stopped mid-answer: the partial answer is kept
            stats.error = f"the stream from {self.base} stopped mid-answer ({type(exc).__name__})"
        if finish is None:
            finish, stats.error = "error", f"the stream from {self.base} ended without finishing the answer"
        if counters is not None and "n_accepted" in stats.unreported:  # no per-request figures came: counters
            _take_counters(stats, kind, counters, self._counters(kind))
        yield Done(finish, "".join(text), [], stats, [])

    def _counters(self, kind: str) -> dict[str, float] | None:
        """The engine's speculative-decoding samples from /metrics (summed over label sets); None if it has none."""
        try:
            resp = self._http.get(self.base + "/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        found: dict[str, float] = {}
        wanted = {metric: key for key, metric in COUNTERS[kind].items()}
        for m in _SAMPLE.finditer(resp.text):  # Prometheus text format: name{labels} value
            if m["name"] in wanted:
                key = wanted[m["name"]]
                found[key] = found.get(key, 0.0) + float(m["value"])
        return found if "accepted" in found else None


def _take_counters(stats: Stats, kind: str, before: dict | None, after: dict | None) -> None:
    """This request's share of server-wide counters: exact when it was the only request to finish meanwhile."""
    if before is None or after is None:
        return
    delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in after}
    stats.n_accepted, stats.n_rounds = delta["accepted"], delta.get("rounds", 0)
    reported = ["n_accepted", "n_rounds"]
    if "drafted" in delta:
        stats.n_drafted = delta["drafted"]
        reported.append("n_drafted")
    stats.unreported = tuple(f for f in stats.unreported if f not in reported)
    source = f"{kind} server-wide counters: other requests ran meanwhile" if delta.get("finished", 0) > 1 else \
        f"{kind} counters"
    if kind == "TGI":
        source += "; TGI reports tokens from speculation, not drafts, so no acceptance rate"
    stats.drafter += f" ({source})"


def _in_tags(thought: str, answer: str, thinking: bool) -> tuple[str, bool]:
    """A chunk's thinking and answer text as one piece, the thinking inside ``<think>…</think>``; and whether the
    thinking block is still open after it."""
    out = ("" if thinking or not thought else OPEN + "\n") + thought
    if answer:
        return out + ("\n" + CLOSE + "\n\n" if thinking or thought else "") + answer, False
    return out, True


def _sse(resp: httpx.Response) -> Iterator[dict]:
    """The JSON objects of a server-sent-events stream, up to ``data: [DONE]``."""
    for line in resp.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            if "error" in chunk:
                err = chunk["error"]
                raise RemoteError(f"The server stopped with an error: "
                                  f"{err.get('message') if isinstance(err, dict) else err}")
            yield chunk


def _take_figures(stats: Stats, chunk: dict) -> str | None:
    """Fold a chunk's figures into ``stats`` (counts are the server's). Returns where its speculation figures came
    from, if it carried any: llama-server's ``timings``, vLLM's ``metrics.speculative_decoding``, SGLang's
    ``sglext.spec_tokens_details`` or ``meta_info``. OpenAI's ``usage`` gives the token count where nothing else
    does."""
    t = chunk.get("timings") or {}
    if "predicted_n" in t:
        stats.n_tokens = int(t["predicted_n"])
    if t.get("predicted_per_second") is not None:
        stats.server_tokens_per_second = float(t["predicted_per_second"])
    if "prompt_n" in t:
        stats.prompt_tokens = int(t["prompt_n"])
    if "cache_n" in t:
        stats.prompt_cached = int(t["cache_n"])
    usage = chunk.get("usage") or {}
    if usage.get("completion_tokens") is not None and "predicted_n" not in t:
        stats.n_tokens = int(usage["completion_tokens"])
    if "draft_n" in t:
        return _report(stats, t["draft_n"], t.get("draft_n_accepted", 0), None, "llama-server timings")
    if isinstance(vllm := (chunk.get("metrics") or {}).get("speculative_decoding"), dict):
        return _report(stats, vllm.get("num_draft_tokens", 0), vllm.get("num_accepted_draft_tokens", 0),
                       vllm.get("num_spec_steps"), "vLLM per-request metrics")
    if isinstance(sgl := _sglang_details(chunk), dict):
        rounds, rate = sgl.get("spec_verify_ct"), sgl.get("spec_accept_rate")
        if "spec_num_proposed_drafts" in sgl:
            return _report(stats, sgl["spec_num_proposed_drafts"], sgl.get("spec_num_correct_drafts", 0), rounds,
                           "SGLang spec_tokens_details")
        if rounds and rate:  # meta_info alone: each verify step gives its accepted tokens plus one of its own
            accepted = int(sgl.get("completion_tokens", stats.n_tokens)) - int(rounds)
            return _report(stats, round(accepted / rate), accepted, rounds,
                           "SGLang meta_info: spec_verify_ct, spec_accept_rate")
    return "timings" if t else None


def _sglang_details(chunk: dict) -> dict | None:
    details = (chunk.get("sglext") or {}).get("spec_tokens_details")
    if isinstance(details, list):  # one per choice when n > 1; we ask for one
        details = details[0] if details else None
    meta = chunk.get("meta_info")
    return details if isinstance(details, dict) else meta if isinstance(meta, dict) else None


def _report(stats: Stats, drafted, accepted, rounds, source: str) -> str:
    stats.n_drafted, stats.n_accepted = int(drafted), int(accepted)
    reported = ("n_drafted", "n_accepted") + (("n_rounds",) if rounds is not None else ())
    if rounds is not None:
        stats.n_rounds = int(rounds)
    stats.unreported = tuple(f for f in stats.unreported if f not in reported)
    return source


def _wire(messages: list[dict]) -> list[dict]:
    """Messages as OpenAI's API takes them: an image part (its bytes, as the app holds it) goes as an ``image_url``
    part with a data URL, inline: nothing is fetched from elsewhere."""
    from .conversations import data_url

    def part(p: dict) -> dict:
        return {"type": "image_url", "image_url": {"url": data_url(p["image"])}} if p.get("type") == "image" else p

    return [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in messages]
