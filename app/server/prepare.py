"""A request body made ready to run, on a worker thread: read into the one job (``requests.openai.parse``), its
prompt rendered and tokenized (a chat with or without tools, text, or token ids as llama-server takes them), the
parameters it runs with and the tool format its answer is read with. A prompt is refused for its length before it
is tokenized when its size alone says it cannot fit the context. Any mistake is an ApiError."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Callable

from ..chat.settings import Settings
from ..engine import EngineError, GenerationParams, ModelsUnloaded
from ..prompts import chat_tokens, plain_tokens, text_of, tool_prompt
from .http import ApiError
from .requests.openai import Job, parse


@dataclass
class Prepared:
    job: Job
    ids: list[int]
    params: GenerationParams  # the job's, with a tool format's grammar
    reader: object | None  # the tool format the answer is read with (None: no call)


def prepare(body, chat: bool, defaults: Settings, engine) -> Prepared:
    """A body read and its prompt tokenized for ``engine``; the context length is checked before the prompt is
    tokenized where its size alone says it cannot fit."""
    job = parse(body, chat, defaults, engine.drafters, bias_tokens(engine.model))
    for check, value, param in ((engine.check_drafter, job.drafter, "drafter"),
                                (engine.check_logit_bias, job.params.sampling, "logit_bias")):
        try:
            check(value)
        except ModelsUnloaded as exc:  # (an engine worker loading the pair again after a crash, say)
            raise retry(exc) from None
        except EngineError as exc:
            raise ApiError(400, str(exc), param=param) from None
    params, reader = job.params, None
    try:
        tokens_given = not chat and isinstance(job.prompt, list)  # (token ids: nothing to render)
        texts = [text_of(m["content"]) for m in job.messages] if chat else [] if tokens_given else [job.prompt]
        _check_length(engine, texts, chat)
        if chat and (job.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in job.messages)):
            ids, grammar, fmt, shown = tool_prompt(engine.model, job.messages, job.tools, job.tool_choice,
                                                   engine.projector, **job.template_variables)
            params, reader = replace(params, grammar=grammar, shown=shown), fmt  # (fmt None: no call)
        elif chat:
            ids = chat_tokens(engine.model, job.messages, engine.projector, **job.template_variables)
        else:
            ids = _token_ids(engine, job.prompt) if tokens_given else plain_tokens(engine.model, job.prompt)
    except ModelsUnloaded as exc:
        raise retry(exc) from None
    except EngineError as exc:
        raise ApiError(400, str(exc)) from None
    if len(ids) >= engine.n_ctx:
        raise _too_long("The prompt is", len(ids), engine.n_ctx, chat)
    return Prepared(job, ids, params, reader)


def bias_tokens(model) -> Callable[[str], list[int]]:
    """How a text in ``logit_bias`` becomes tokens: the model's tokenizer, no special tokens (llama-server's)."""
    return lambda text: model.tokenize(text, add_special=False, parse_special=False)


def retry(exc: ModelsUnloaded) -> ApiError:
    """The models went away (another pair loaded) before this request was served: 503, worth sending again."""
    return ApiError(503, str(exc), "server_error", code="model_unloaded", headers={"Retry-After": "1"})


# Vocabularies whose entries are never shorter, in bytes, than the text each token stands for: SentencePiece (a
# space is written "▁", a byte "<0x0A>") and byte-level BPE (each byte one or two bytes of UTF-8). No token of
# theirs stands for more characters than their longest entry has bytes, but for whitespace: llama.cpp lets some
# special tokens (Phi-3's) swallow the whitespace beside them, so it is not counted.
_LONGEST_ENTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SPM, _BPE = 1, 2  # llama.cpp's enum llama_vocab_type
_SPACES = " \t\n\r\v\f"  # what C's isspace() takes, which llama.cpp strips with


def _check_length(engine, texts: list[str], chat: bool) -> None:
    """A prompt refused for its length before it is tokenized (tokenizing megabytes takes seconds and memory):
    it has at least ``characters other than whitespace / longest entry`` tokens, which may already be more than the
    context holds."""
    model = engine.model
    if model.vocab_type not in (_SPM, _BPE):
        return  # (others normalize text: a token may stand for more than its entry)
    longest = _LONGEST_ENTRY.get(model)
    if longest is None:  # once per model: a pass over its vocabulary
        longest = _LONGEST_ENTRY[model] = max((len(model.token_text(t)) for t in range(model.n_vocab)), default=1)
    characters = sum(len(t) - sum(t.count(c) for c in _SPACES) for t in texts)
    at_least = characters // max(longest, 1)
    if at_least >= engine.n_ctx:
        raise _too_long("The prompt is at least", at_least, engine.n_ctx, chat)


def _too_long(what: str, n_prompt: int, n_ctx: int, chat: bool) -> ApiError:
    """llama-server's ``exceed_context_size_error``, with its ``n_prompt_tokens`` and ``n_ctx``."""
    return ApiError(400, f"{what} {n_prompt} tokens but the context holds {n_ctx}: the request exceeds the available "
                         "context size; shorten it.", "exceed_context_size_error",
                    param="messages" if chat else "prompt", code="context_length_exceeded",
                    extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})


def _token_ids(engine, sequence: list) -> list[int]:
    """A prompt given as token ids (strings mixed in: tokenized, special tokens parsed, no BOS added), as llama-server
    takes it: the ids used as they are, each in the vocabulary."""
    model = engine.model
    ids = [t for piece in sequence for t in ([piece] if type(piece) is int else
                                             model.tokenize(piece, add_special=False, parse_special=True))]
    if not all(0 <= t < model.n_vocab for t in ids):
        raise ApiError(400, f"'prompt' holds a token id outside the vocabulary (0 to {model.n_vocab - 1}).",
                       param="prompt")
    return ids
