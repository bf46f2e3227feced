"""``specchat`` command line: generate and bench (scripting and measurements), chat in the terminal."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from ..chat.acceptance_memory import memory_for
from ..chat.method_ranking import recall
from ..chat.runtime import RELOAD_WAIT_S
from ..chat.worker import WorkerEngine
from ..engine import (Done, DraftParams, Engine, EngineError, GenerationParams, SamplingParams, TextDelta,
                      batch_invariant, inexact_note)
from ..engine.drafters import OFF, registry
from ..engine.gguf_file import read_info
from ..models.loader import LoadSpec, load_engine, resolve
from ..prompts import chat_tokens, plain_tokens
from .bench import summary_line
from .terminal_chat import converse
from .flags import (Parser, drafter_name, gpu_layers, hub_refs, model_flags, ngram_settings, remote_flags,
                    sampling_flags, serving_flags)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specchat", description="Local chat with speculative decoding on llama.cpp.")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for add in (_generate_flags, _bench_flags, _chat_flags, _app_and_serve_flags, _prompt_flags, _model_commands):
        add(sub)
    return parser


def _generate_flags(sub) -> None:
    """specchat generate: one prompt, its text and speculation stats."""
    g = sub.add_parser("generate", help="generate text for one prompt and report speculation stats")
    model_flags(g)
    remote_flags(g)
    g.add_argument("--prompt", "-p", help="prompt text")
    g.add_argument("--prompt-file", "-f", type=Path, help="read the prompt from a file")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template (prompt = one user turn)")
    g.add_argument("--system", help="system message (with --chat)")
    g.add_argument("--image", action="append", type=Path, default=[], help="an image for the prompt (repeatable; "
                   "needs a projector): where the prompt writes <__media__>, else before it")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    # llama.cpp's constrained-output flags: the answer follows the schema or grammar, exactly under speculation
    g.add_argument("--json-schema", "-j", help="JSON schema the answer must follow (text; {} = any JSON)")
    g.add_argument("--json-schema-file", "-jf", type=Path, help="read the JSON schema from a file")
    g.add_argument("--grammar", help="GBNF grammar the answer must follow")
    g.add_argument("--grammar-file", type=Path, help="read the GBNF grammar from a file")
    sampling_flags(g)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def _bench_flags(sub) -> None:
    """specchat bench: speculation off vs on over a file of prompts."""
    b = sub.add_parser("bench", help="speculation off vs on over a JSONL file of prompts (greedy)")
    model_flags(b)
    remote_flags(b, with_off=True)
    b.add_argument("--prompts", type=Path, required=True, help="JSONL: {\"prompt\": ..., \"category\": ...} per line")
    b.add_argument("--max-tokens", "-n", type=int, default=128)
    b.add_argument("--repeats", type=int, default=1, help="runs of each prompt per mode (interleaved)")
    b.add_argument("--drafters", nargs="+", type=drafter_name, metavar="DRAFTER",
                   help="bench each of these drafters (a method, an n-gram kind, a chain) against the same "
                        "speculation-off runs, interleaved, instead of --drafter alone")
    b.add_argument("--ngram-kinds", action="store_true",
                   help="bench every n-gram kind (ngram-simple ... ngram-cache), as with --drafters")
    b.add_argument("--json", action="store_true", help="print the report as JSON")


def _chat_flags(sub) -> None:
    """specchat chat: the terminal chat."""
    c = sub.add_parser("chat", help="chat in the terminal")
    model_flags(c)
    remote_flags(c)
    c.add_argument("--system", help="system message")
    c.add_argument("--image", action="append", type=Path, default=[], help="an image for your first message "
                   "(repeatable; needs a projector)")
    sampling_flags(c, max_tokens=1024)


def _app_and_serve_flags(sub) -> None:
    """specchat app (plain ``specchat``) and specchat serve."""
    a = sub.add_parser("app", help="the chat app in your browser, with the OpenAI-compatible API at /v1 (what "
                                   "plain `specchat` runs)")
    model_flags(a)
    serving_flags(a)
    a.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    remote_flags(a, key_flag="--server-api-key", with_off=True)
    sv = sub.add_parser("serve", help="the OpenAI-compatible API alone (/v1), no browser")
    model_flags(sv)
    serving_flags(sv)


def _prompt_flags(sub) -> None:
    """specchat prompt: the text or tokens a model sees."""
    pr = sub.add_parser("prompt", help="print exactly the text (or tokens) the model sees for a conversation")
    pr.add_argument("--pair", help="a pair from models.toml (its target's template)")
    pr.add_argument("--target", "-m", type=Path, help="a GGUF file")
    pr.add_argument("--system", help="system message")
    pr.add_argument("--prompt", "-p", help="one user message")
    pr.add_argument("--messages", type=Path, help="a JSON file: [{\"role\": ..., \"content\": ...}, ...]")
    pr.add_argument("--no-thinking", action="store_true", help="pass enable_thinking=false to the template")
    pr.add_argument("--tokens", action="store_true", help="print the token ids (one JSON list) instead of the text")


def _model_commands(sub) -> None:
    """The model commands: list, pull, search, files, remove, check."""
    ls = sub.add_parser("list", help="the model pairs of models.toml and what is downloaded")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    pl = sub.add_parser("pull", help="download a pair (or one GGUF) from the Hugging Face Hub into its cache")
    pl.add_argument("pair", nargs="?", help="a pair from models.toml (see specchat list)")
    pl.add_argument("--repo", help="a Hub repo id, to download one GGUF file instead of a pair")
    pl.add_argument("--file", help="the GGUF file in --repo (a split GGUF: its first shard)")
    hub_refs(pl, "download")
    pl.add_argument("--no-mmproj", action="store_true", help="leave out the target's vision projector (an mmproj "
                    "GGUF, downloaded by default where the pair or the -hf repo has one, as llama.cpp's -hf does)")
    se = sub.add_parser("search", help="search the Hugging Face Hub for GGUF models, most downloaded first")
    se.add_argument("query")
    se.add_argument("--limit", type=int, default=20)
    se.add_argument("--json", action="store_true")
    fl = sub.add_parser("files", help="a Hub repo's GGUF models: size and quantization, split files grouped")
    fl.add_argument("repo")
    fl.add_argument("--json", action="store_true")
    rm = sub.add_parser("remove", help="delete a pair's downloaded files from the Hub cache")
    rm.add_argument("pair")
    ck = sub.add_parser("check", help="judge a pair from its GGUF metadata: compatibility, memory fit, offload")
    ck.add_argument("--pair", help="a downloaded pair from models.toml")
    ck.add_argument("--target", "-m", type=Path, help="target GGUF file")
    ck.add_argument("--draft", "-md", type=Path, help="draft GGUF file (omit to get draft suggestions)")
    ck.add_argument("--mmproj", "-mm", type=Path, help="the target's vision projector (default: one found beside it)")
    ck.add_argument("--no-mmproj", action="store_true", help="judge the pair without a projector")
    ck.add_argument("--ctx", "-c", type=int, default=0, help="context size in tokens (default: min(train, 4096))")
    ck.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="ngl", type=gpu_layers, metavar="N|all|auto",
                    help="target layers on the GPU (default: auto, what fits)")
    ck.add_argument("-ngld", "--n-gpu-layers-draft", "--spec-draft-ngl", dest="ngld", type=gpu_layers,
                    metavar="N|all|auto", help="draft layers on the GPU (default: auto)")
    ck.add_argument("--measure", nargs="?", type=int, const=64, default=0, metavar="N",
                    help="also load the pair and measure it: acceptance and speed with the draft vs without, greedy, "
                         "N new tokens on each of three built-in prompts (default 64)")
    hub_refs(ck, "judge before downloading (from the files' headers)")


# --- shared set-up -------------------------------------------------------------------------------------------
# argparse dests named as LoadSpec's fields
LOAD_FLAGS = ("ctx", "threads", "threads_draft", "ngl", "ngld", "ctx_checkpoints", "batch")


def load_spec(args) -> LoadSpec:
    return LoadSpec(
        pair=args.pair, target=str(args.target) if args.target else None, draft=str(args.draft) if args.draft else None,
        mmproj=str(args.mmproj) if args.mmproj else None, no_mmproj=args.no_mmproj,
        **{k: getattr(args, k) for k in LOAD_FLAGS},
    )


def read_images(paths: list[Path]) -> list[bytes]:
    try:
        return [p.read_bytes() for p in paths]
    except OSError as exc:
        raise EngineError(f"Cannot read the image: {exc}") from exc


def with_images(text: str, images: list[bytes]) -> str | list[dict]:
    """A user message's content: the images first, then the text (as llama-mtmd-cli puts them)."""
    return [{"type": "image", "image": b} for b in images] + [{"type": "text", "text": text}] if images else text


def draft_params(args, defaults: DraftParams) -> DraftParams:
    """The pair's recommended draft settings, overridden by any flag given."""
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    dp = DraftParams(
        draft_max=pick(args.draft_max, defaults.draft_max),
        draft_min=pick(args.draft_min, defaults.draft_min),
        draft_p_min=pick(args.draft_p_min, defaults.draft_p_min),
        adaptive=pick(args.adaptive, defaults.adaptive),
        ngram=replace(defaults.ngram, **ngram_settings(args)),
    )
    dp.validate()
    return dp


def bench_drafters(args) -> list[str]:
    """bench --drafters, and --ngram-kinds (every n-gram kind), in the order given."""
    names = list(getattr(args, "drafters", None) or [])
    if getattr(args, "ngram_kinds", False):
        names += [k for k in registry.KINDS if k not in names]
    return names


def build_engine(args, worker: bool = False) -> tuple[Engine, str, DraftParams]:
    """Resolve --pair / --target / --draft, load the engine (``worker``: in an engine worker process, as the
    app does), pick the drafter and the draft settings."""
    spec = load_spec(args)
    resolved = resolve(spec)
    # default: what `check --measure` found fastest for these files, else the pair's draft model, else the target's
    # own MTP layers, else prompt lookup
    default = registry.default_method(bool(resolved.draft), bool(read_info(resolved.target).nextn_layers))
    ranked = recall(resolved.target, resolved.draft)
    if not args.drafter and ranked:  # (measured on these very files: every method it ranked runs on them)
        default = ranked.best
        print(f"specchat: drafting with {ranked.why()}", file=sys.stderr)
    drafter = args.drafter or default
    names = bench_drafters(args) or [drafter]  # (bench --drafters: each in turn)
    for part in (p for name in names for p in registry.parts(name)):
        if (what := registry.method(registry.method_of(part)).draft_file) and not resolved.draft:
            raise EngineError(f"--drafter {part} needs {what}, or use --drafter "
                              f"{registry.default_method(False, False)}.")
    dp = draft_params(args, resolved.draft_params)
    # (a head is the draft file for the draft model's method and for its own, as in llama.cpp's
    # --spec-type draft-mtp -md FILE)
    engine = WorkerEngine(spec, resolved) if worker else load_engine(
        spec, resolved, with_draft=any(registry.needs_draft_file(n, resolved.draft) for n in names),
        memory=memory_for(resolved.target, resolved.draft))
    if drafter != OFF and (note := inexact_note(engine.offload()["target"]["n_gpu_layers"])):
        print(f"specchat: note: {note}", file=sys.stderr)
    return engine, drafter, dp


def _generation_params(args, dp: DraftParams) -> GenerationParams:
    return GenerationParams(
        max_tokens=args.max_tokens,
        stop=tuple(getattr(args, "stop", ()) or ()),
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed),
        draft=dp,
        grammar=_grammar(args),
    )


def _grammar(args):
    """--json-schema / --json-schema-file / --grammar / --grammar-file, as llama.cpp names them (one at most)."""
    from ..engine.grammar import Grammar

    given = [(flag, getattr(args, name, None)) for flag, name in (
        ("--json-schema", "json_schema"), ("--json-schema-file", "json_schema_file"), ("--grammar", "grammar"),
        ("--grammar-file", "grammar_file"))]
    given = [(flag, v) for flag, v in given if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise EngineError(f"Give one of {' or '.join(f for f, _ in given)}, not both.")
    flag, value = given[0]
    if isinstance(value, Path):
        try:
            value = value.read_text(encoding="utf-8")
        except OSError as exc:
            raise EngineError(f"Cannot read the {flag} file: {exc}") from exc
    return Grammar.json_schema(value) if "json" in flag else Grammar.gbnf(value)


# --- commands ------------------------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    if (args.prompt is None) == (args.prompt_file is None):
        raise EngineError("Give the prompt with exactly one of --prompt TEXT or --prompt-file PATH.")
    try:
        prompt = args.prompt if args.prompt is not None else args.prompt_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineError(f"Cannot read the prompt file: {exc}") from exc
    if args.server:
        from .remote import generate_remote

        if _grammar(args):
            raise EngineError("--json-schema and --grammar constrain the local engine; with --server, ask the server "
                              "for structured output in the request.")

        return generate_remote(args, with_images(prompt, read_images(args.image)))  # (images go inline)
    if args.system and not args.chat:
        raise EngineError("--system only applies with --chat.")
    _grammar(args)  # a bad schema or grammar is refused before the models load
    images = read_images(args.image)
    engine, drafter, dp = build_engine(args)
    params = _generation_params(args, dp)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": with_images(prompt, images)}
        ]
        ids = chat_tokens(engine.model, messages, engine.projector)
    else:
        ids = plain_tokens(engine.model, prompt, engine.projector, images)
    done = None
    for ev in engine.generate(ids, params, drafter):
        if isinstance(ev, TextDelta) and not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            done = ev
    s = done.stats
    if args.json:
        print(json.dumps({
            "text": done.text, "token_ids": done.token_ids, "n_tokens": s.n_tokens, "n_drafted": s.n_drafted,
            "n_accepted": s.n_accepted, "acceptance_rate": s.acceptance_rate,
            "tokens_per_second": s.tokens_per_second, "time_to_first_token_s": s.time_to_first_token_s,
            "decode_seconds": s.decode_seconds, "finish_reason": done.finish_reason, "drafter": s.drafter,
            "n_rounds": s.n_rounds, "mean_accepted_per_round": s.mean_accepted_per_round,
            "draft_seconds": s.draft_seconds, "verify_seconds": s.verify_seconds,
            "prompt_tokens": s.prompt_tokens, "draft_flags": done.draft_flags, "n_forced": s.n_forced,
            "n_forced_accepted": s.n_forced_accepted, "grammar_seconds": s.grammar_seconds,
            "batch_invariant": batch_invariant(engine.offload()["target"]["n_gpu_layers"]), "n_images": len(images),
            "by_drafter": {k: dict(zip(("rounds", "drafted", "accepted"), v)) for k, v in s.by_drafter.items()},
        }))
    else:
        print("\n" + summary_line(s))
    return 0


def cmd_bench(args) -> int:
    from .bench import load_prompts, print_comparison, print_report, run_bench

    prompts = load_prompts(args.prompts)
    if args.max_tokens < 1 or args.repeats < 1:
        raise EngineError("--max-tokens and --repeats must be at least 1.")
    if args.server or args.server_off:
        from .remote import bench_remote

        if any(p["grammar"] for p in prompts):
            raise EngineError("Prompts with a json_schema are benched on the local engine only (not with --server).")

        return bench_remote(args, prompts)
    engine, drafter, dp = build_engine(args)
    names = bench_drafters(args) or [drafter]
    if OFF in names:
        raise EngineError("bench compares speculation on and off: choose --drafter model or ngram.")
    reports = run_bench(engine, names, dp, prompts, args.max_tokens, args.repeats,
                        progress=None if args.json else sys.stderr)
    if args.json:
        print(json.dumps(reports[0] if len(names) == 1 else {"drafters": reports}, indent=2))
    else:
        for report in reports:
            print_report(report)
        if len(reports) > 1:
            print_comparison(reports)
    return 0


def cmd_chat(args) -> int:
    """A terminal chat with the local engine, or with --server another server's (same loop, same events)."""
    images = read_images(args.image)
    if args.server:
        from ..chat.remote_server import RemoteServer, ServerSpec
        from .remote import remote_summary

        if args.image:
            raise EngineError("--image goes to the local engine; a server's images go in its requests.")

        server = RemoteServer(ServerSpec(args.server, args.server_api_key or None, args.model, args.method))
        params = _generation_params(args, DraftParams())
        answer = lambda msgs, cancel: server.generate(msgs, params, args.drafter != OFF, cancel)  # noqa: E731
        summary = remote_summary
    else:
        if not (args.pair or args.target):
            args.pair = "starter"
        engine, drafter, dp = build_engine(args, worker=True)  # (a crash in llama.cpp ends one answer, not the chat)
        params = _generation_params(args, dp)
        def answer(msgs, cancel):  # (after a crash, the next message waits for the pair to be loaded again)
            engine.wait_ready(RELOAD_WAIT_S)
            ids = chat_tokens(engine.model, msgs, engine.projector,  # (a last answer of the assistant's: continued)
                              continue_final_message=msgs[-1]["role"] == "assistant")
            return engine.generate(ids, params, drafter, cancel)
        summary = summary_line
    return converse(answer, summary, args.system, lambda text, first: with_images(text, images if first else []))

def cmd_prompt(args) -> int:
    from ..engine import Model
    from ..prompts import chat_prompt, prompt_tokens

    if (args.prompt is None) == (args.messages is None):
        raise EngineError("Give the conversation with exactly one of --prompt TEXT or --messages FILE.json.")
    if args.messages is not None:
        try:
            messages = json.loads(args.messages.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"Cannot read {args.messages}: {exc}") from exc
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise EngineError(f"{args.messages} must hold a JSON list of {{\"role\", \"content\"}} objects.")
    else:
        messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages = [{"role": "system", "content": args.system}] + messages
    path = resolve(LoadSpec(pair=args.pair, target=str(args.target) if args.target else None)).target
    model = Model(path, vocab_only=True)  # the template and the tokenizer, no weights
    try:
        text = chat_prompt(model, messages, enable_thinking=not args.no_thinking)
        if args.tokens:
            print(json.dumps(prompt_tokens(model, text)))
        else:
            sys.stdout.write(text)
    finally:
        model.close()
    return 0


def cmd_app(args) -> int:
    from dataclasses import replace

    from ..chat.settings import Settings, load_settings
    from .serve import aliases_flag, chat_template_flag, request_defaults, serve

    if args.draft and not args.target:
        raise EngineError("--draft needs --target (or choose a --pair).")
    if args.port is not None and not 0 < args.port < 65536:
        raise EngineError(f"Invalid --port {args.port}: use 1..65535.")
    if args.max_body_mb is not None and not 0 < args.max_body_mb < 1e6:
        raise EngineError(f"Invalid --max-body-mb {args.max_body_mb:g}: use a positive number of megabytes.")
    if getattr(args, "server", None):
        if args.pair or args.target:
            raise EngineError("Give either --server or a local pair (--pair, --target), not both.")
        requested = LoadSpec(server=args.server, model=args.model, server_off=args.server_off, method=args.method)
    elif args.pair or args.target:
        requested = load_spec(args)
    elif any(getattr(args, k) for k in LOAD_FLAGS):  # new load settings for the last-used pair
        requested = replace(load_settings()[0].models or LoadSpec(pair="starter"),
                            **{k: getattr(args, k) for k in LOAD_FLAGS})
    else:
        requested = None
    overrides = {k: v for k, v in dict(drafter=args.drafter, draft_max=args.draft_max, draft_min=args.draft_min,
                                       draft_p_min=args.draft_p_min, adaptive=args.adaptive,
                                       ngram=ngram_settings(args) or None).items() if v is not None}
    overrides.update(request_defaults(args))
    if overrides:
        replace(Settings(), **overrides).generation()  # an invalid flag fails here, before anything loads
    template = chat_template_flag(args.chat_template, args.chat_template_file)
    if template is not None and requested is not None and requested.server:
        raise EngineError("--chat-template is for a local pair: a server renders its own template.")
    return serve(requested, overrides, args.port, args.listen, args.command == "app" and not args.no_browser,
                 api_key=args.api_key or None, cors=args.cors, with_ui=args.command == "app",
                 server_key=getattr(args, "server_api_key", None), allow_hosts=args.allow_host, no_auth=args.no_auth,
                 max_body=int(args.max_body_mb * 2**20) if args.max_body_mb else None, metrics=args.metrics,
                 aliases=aliases_flag(args.alias), chat_template=template, tags=aliases_flag(args.tags),
                 verbose=args.verbose, slots=args.slots)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["app"] + argv  # plain `specchat [flags]`: the chat app
    args = build_parser().parse_args(argv)
    try:
        from .pairs import cmd_check, cmd_files, cmd_list, cmd_pull, cmd_remove, cmd_search

        commands = {"generate": cmd_generate, "bench": cmd_bench, "chat": cmd_chat, "app": cmd_app,
                    "serve": cmd_app, "prompt": cmd_prompt, "list": cmd_list, "pull": cmd_pull, "remove": cmd_remove,
                    "check": cmd_check,
                    "search": cmd_search, "files": cmd_files}
        return commands[args.command](args)
    except EngineError as exc:
        print(f"specchat: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specchat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
