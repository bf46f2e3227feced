"""``specchat``'s flags, named as llama.cpp's tools name them: the models and speculation, n-gram kinds, a server
instead, serving, sampling; and the one-line error a bad flag gets."""
from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from ..engine import EngineError, drafter_for
from ..engine.drafters import NgramParams, registry


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line instead of a usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def spec_type(value: str) -> str:
    """--spec-type: one of llama.cpp's speculative types, or several joined by commas (a chain), as the drafter."""
    try:
        return drafter_for(value)
    except EngineError as exc:
        raise argparse.ArgumentTypeError(str(exc).rstrip(".")) from None


def drafter_name(value: str) -> str:
    """--drafter: a method, an n-gram kind, or several joined by commas (llama.cpp's type names are taken too)."""
    try:
        registry.parts(value)
        return value
    except EngineError as exc:
        try:
            return drafter_for(value)
        except EngineError:
            raise argparse.ArgumentTypeError(str(exc).rstrip(".")) from None


def gpu_layers(value: str) -> int | None:
    """-ngl / -ngld, as llama.cpp takes them: a number of layers, "all" (-1), or "auto" (None: what fits)."""
    word = value.strip().lower()
    if word in ("auto", "all"):
        return None if word == "auto" else -1
    try:
        n = int(word)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of layers, all (or -1), 0 (none) or auto")
    return n


NGRAM_FLAGS = {f.name: "--spec-ngram-" + f.name.replace("_", "-") for f in fields(NgramParams)
               if not f.name.startswith("lookup_cache")}


def ngram_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("n-gram kinds (llama.cpp's flags and defaults; --spec-type ngram-...)")
    for name, flag in NGRAM_FLAGS.items():
        g.add_argument(flag, dest="ngram_" + name, type=int, metavar="N",
                       help=f"default {getattr(NgramParams(), name)}")
    g.add_argument("-lcs", "--lookup-cache-static", dest="ngram_lookup_cache_static", metavar="FILE",
                   help="ngram-cache: a static n-gram cache (llama-lookup-create's), read only")
    g.add_argument("-lcd", "--lookup-cache-dynamic", dest="ngram_lookup_cache_dynamic", metavar="FILE",
                   help="ngram-cache: a dynamic n-gram cache, read only here")


def ngram_settings(args) -> dict:
    """The n-gram settings given as flags (the rest keep llama.cpp's defaults)."""
    return {f.name: v for f in fields(NgramParams) if (v := getattr(args, "ngram_" + f.name, None)) is not None}


def model_flags(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("models")
    src.add_argument("--pair", help="a pair from models.toml (e.g. starter)")
    src.add_argument("--target", "-m", type=Path, help="target GGUF file")
    src.add_argument("--draft", "-md", "--spec-draft-model", type=Path,
                     help="draft GGUF file (of another tokenizer: drafts as text)")
    src.add_argument("--drafter", type=drafter_name, metavar="NAME",
                     help="; ".join(f"{m.name}: {m.choice}" for m in registry.METHODS)
                     + f" ({registry.Lookup.METHOD}: {registry.DEFAULT_KIND}); or an n-gram kind by llama.cpp's name; "
                       "or several joined by commas, drafting together (default: the pair's draft model, else the "
                       "target's own MTP layers, else n-gram lookup)")
    src.add_argument("--spec-type", dest="drafter", type=spec_type, metavar="TYPE[,TYPE...]",
                     help="--drafter by llama.cpp's names: " + "; ".join(
                         f"{', '.join(m.spec_types)} ({m.name})" for m in registry.METHODS)
                     + "; several joined by commas draft together, the draft with the most expected accepted tokens "
                       "verified")
    src.add_argument("--mmproj", "-mm", type=Path, help="the target's vision projector (an mmproj GGUF), for images "
                     "(default: the one mmproj-*.gguf beside the target file, where there is exactly one)")
    src.add_argument("--no-mmproj", action="store_true", help="load no projector, even one found beside the target")
    src.add_argument("--ctx", "-c", type=int, default=0, help="context size in tokens (default: min(train, 4096))")
    src.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (default: physical cores)")
    src.add_argument("--threads-draft", "-td", "--spec-draft-threads", dest="threads_draft", type=int, default=0,
                     help="CPU threads for the draft (default: -t)")
    src.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="ngl", type=gpu_layers, default=None,
                     metavar="N|all|auto", help="target layers on the GPU (default: auto, what fits in the GPU's "
                     "free memory beside the draft and the KV caches; all or -1: every layer; 0: none)")
    src.add_argument("-ngld", "--n-gpu-layers-draft", "--spec-draft-ngl", dest="ngld", type=gpu_layers,
                     default=None, metavar="N|all|auto", help="draft layers on the GPU (default: auto, as -ngl)")
    src.add_argument("-b", "--batch-size", dest="batch", type=int, default=0,
                     help="tokens a prompt is evaluated in at a time (default: 512); a round verifies at most one "
                          "batch, so drafts stay under it")
    src.add_argument("-ctxcp", "--ctx-checkpoints", dest="ctx_checkpoints", type=int, default=8,
                     help="recurrent/hybrid models: saved states kept between chat turns, so Regenerate or an edited "
                          "message restarts near the change (default: 8)")
    d = p.add_argument_group("speculation (llama.cpp's flags; defaults from the pair)")
    d.add_argument("--draft-max", "--spec-draft-n-max", dest="draft_max", type=int,
                   help="most tokens drafted per round")
    d.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=int,
                   help="drafts shorter than this are not verified")
    d.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=float,
                   help="stop drafting when the draft's top probability (among its 10 best, as llama.cpp) is lower")
    d.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="tune the draft length from measured acceptance and cost (default: the pair's setting)")
    ngram_flags(p)


def remote_flags(p: argparse.ArgumentParser, key_flag: str = "--api-key", with_off: bool = False) -> None:
    """--server and its companions. The app names the server's key --server-api-key: its --api-key guards its own
    /v1."""
    r = p.add_argument_group("a server instead (llama-server, vLLM, SGLang, TGI, specchat serve: it runs the models "
                             "and speculates)")
    r.add_argument("--server", metavar="URL", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8080")
    r.add_argument(key_flag, dest="server_api_key", metavar="KEY", default=os.environ.get("SPECCHAT_SERVER_API_KEY"),
                   help="the server's API key (default: $SPECCHAT_SERVER_API_KEY)"
                        + ("; once accepted, saved (readable only by you) for next time" if key_flag != "--api-key"
                           else ""))
    r.add_argument("--model", help="the server's model id (default: the first it lists)")
    r.add_argument("--method", help="your label for how the server speculates (e.g. 'EAGLE-3'), shown beside its "
                                    "figures and kept apart in reports (default: what the server says, if anything)")
    if with_off:
        r.add_argument("--server-off", metavar="URL", help="the same model served without a draft, for the "
                       "speculation-off side (for servers that cannot turn it off per request, like llama-server)")


def hub_refs(p: argparse.ArgumentParser, what: str) -> None:
    """llama.cpp's -hf / -hfd: models on the Hub as owner/name[:QUANT or :FILE.gguf]."""
    p.add_argument("-hf", "--hf-repo", dest="hf", metavar="REPO[:QUANT]", help=f"target on the Hub to {what}")
    p.add_argument("-hfd", "--hf-repo-draft", dest="hfd", metavar="REPO[:QUANT]",
                   help=f"draft on the Hub to {what} (with -hf: checked against the target first)")


def serving_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default: 7860 or the next free one)")
    p.add_argument("--listen", action="store_true",
                   help="serve on every network interface (default: loopback only); everything then needs the key")
    p.add_argument("--api-key", default=os.environ.get("SPECCHAT_API_KEY"),
                   help="the key: on loopback /v1 requires 'Authorization: Bearer KEY'; with --listen the UI and its "
                        "API require it too (default: $SPECCHAT_API_KEY; with --listen, a random one, printed)")
    p.add_argument("--no-auth", action="store_true",
                   help="with --listen, serve without any key: anyone on your network can use the app")
    p.add_argument("--allow-host", action="append", metavar="NAME", default=[],
                   help="also answer requests addressed to NAME, e.g. behind a reverse proxy (repeatable; "
                        "default: loopback names, and with --listen this machine's addresses and names)")
    p.add_argument("--cors", action="append", metavar="ORIGIN",
                   help="let web pages from ORIGIN call /v1 (repeatable; default: none)")
    p.add_argument("--max-body-mb", type=float, metavar="MB",
                   help="the largest request body /v1 takes, in MB; larger ones get 413 (default: 64 bytes per token "
                        "of the loaded context, at least 16 MB)")
    p.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True,
                   help="serve llama-server's /slots monitor: SpecChat's one slot, whether it is busy (default: on; "
                        "--no-slots: 501, as llama-server)")
    p.add_argument("--metrics", action="store_true",
                   help="serve llama-server's Prometheus metrics at /metrics, speculative counters included (default: "
                        "off, as llama-server: 501)")
    llama_server_flags(p)


def llama_server_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's flags for what the API answers with: the model's names, request defaults, the template."""
    g = p.add_argument_group("as llama-server (what a request leaves out; the model's names; its template)")
    g.add_argument("-a", "--alias", action="append", default=[], metavar="NAMES",
                   help="the names /v1/models lists the loaded pair by, comma-separated (any name is answered)")
    g.add_argument("--tags", action="append", default=[], metavar="TAGS",
                   help="comma-separated tags /v1/models shows for the pair (informational)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="answers carry llama-server's __verbose debug object (the prompt as the model read it, the "
                        "settings, why it stopped), unless a request sets \"verbose\": false")
    g.add_argument("--temp", "--temperature", dest="temperature", type=float, help="temperature (0: greedy)")
    g.add_argument("-s", "--seed", type=int, help="sampling seed (-1: random)")
    g.add_argument("-n", "--predict", "--n-predict", dest="max_tokens", type=int,
                   help="most tokens an answer gets (-1: until the context is full)")
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--min-p", type=float)
    g.add_argument("--chat-template", metavar="JINJA_TEMPLATE", help="a Jinja chat template used instead of the "
                   "target's own, or the name of one of llama.cpp's formats (llama3, chatml, command-r...)")
    g.add_argument("--chat-template-file", type=Path, metavar="FILE", help="the same, read from a file")
    g.add_argument("--jinja", action=argparse.BooleanOptionalAction, default=None,
                   help="taken for llama-server's sake: SpecChat renders templates with Jinja (a format's name: "
                        "with llama.cpp)")
    g.add_argument("-rea", "--reasoning", choices=("on", "off", "auto"),
                   help="thinking on or off (the template's enable_thinking); auto: the template's default")
    g.add_argument("--reasoning-format", choices=("auto", "none", "deepseek", "deepseek-legacy"),
                   help="SpecChat leaves thinking in the content: auto and none are that; deepseek's split is not "
                        "supported")


def sampling_flags(p: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", "-n", type=int, default=max_tokens)
    s.add_argument("--temperature", "--temp", type=float, default=0.0, help="0: greedy (default)")
    s.add_argument("--top-k", type=int, default=40)
    s.add_argument("--top-p", type=float, default=0.95)
    s.add_argument("--min-p", type=float, default=0.05)
    s.add_argument("--seed", "-s", type=int, default=-1)
