"""llama-server's native fields of a finished answer (``/completion``'s, and the ``__verbose`` object its OpenAI routes
add when asked): the prompt as the model read it, the answer, why it stopped, the settings in llama-server's names,
the timings; and what built it (``system_fingerprint``)."""
from __future__ import annotations

import math
from importlib.metadata import PackageNotFoundError, version

from ..engine import Done
from .answer import stop_word, timings


def native_result(engine, ids: list[int], done: Done, params, model: str, streamed: bool = False,
                  return_tokens: bool = False) -> dict:
    """A finished answer in llama-server's native fields (``/completion``'s, and the ``__verbose`` object its OpenAI
    routes add when asked): the prompt as the model read it, the answer, why it stopped, the settings, timings."""
    word = stop_word(done, params.stop, engine.detokenize)
    return {"index": 0, "content": "" if streamed else done.text,
            "tokens": list(done.token_ids) if return_tokens and not streamed else [], "id_slot": 0,
            "stop": True, "model": model, "tokens_predicted": done.stats.n_tokens,
            "tokens_evaluated": len(ids), "generation_settings": _settings(params, engine),
            "prompt": b"".join(engine.model.piece_text(t) for t in ids).decode("utf-8", "replace"),
            "has_new_line": "\n" in done.text, "truncated": False, "tokens_cached": done.stats.prompt_cached,
            "stop_type": "limit" if done.finish_reason == "length" else "word" if word else "eos",
            "stopping_word": word or "", "timings": timings(done.stats)}


def _settings(params, engine) -> dict:
    """``generation_settings``: what this generation ran with, in llama-server's names (``logit_bias`` as its
    ``{"bias", "token"}`` list, a ban's bias null, ``ignore_eos``'s bans of the end-of-generation tokens included)."""
    s, d = params.sampling, params.draft
    bias = list(s.logit_bias) + ([(t, -math.inf) for t in engine.model.eog_tokens] if s.ignore_eos else [])
    return {"n_ctx": engine.n_ctx, "n_predict": params.max_tokens, "seed": s.seed, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "stop": list(params.stop),
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in bias],
            "ignore_eos": s.ignore_eos,
            "speculative.n_max": d.draft_max, "speculative.n_min": d.draft_min, "speculative.p_min": d.draft_p_min}


def fingerprint() -> str:
    """``system_fingerprint``: what built the answer (llama-server: its build number and commit)."""
    try:
        return f"specchat-llama-cpp-python-{version('llama_cpp_python')}"
    except PackageNotFoundError:
        return "specchat"


def build_info() -> str:
    """llama-server's ``build_info`` in /props."""
    try:
        return f"llama-cpp-python {version('llama_cpp_python')} (SpecChat)"
    except PackageNotFoundError:
        return "SpecChat"
