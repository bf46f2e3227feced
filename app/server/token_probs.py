"""Token probabilities in the API: the shapes answers carry them in.

Asked for (``requests.openai.logprobs_asked``) with chat's ``logprobs: true`` and ``top_logprobs`` 0-20 (alternatives
per token; 0 when left out, as OpenAI), the completions' legacy ``logprobs: N`` (0-20), or llama-server's ``n_probs``
(1-20; 0 is off) on any endpoint; ``post_sampling_probs: true`` reports the sampling chain's distribution instead of
the raw softmax (``app.engine.logprobs``). ``entries`` is llama-server's ``probs_vector_to_json`` (``id``,
``token``, ``bytes``, ``logprob`` and ``top_logprobs``, or ``prob`` and ``top_probs`` after sampling), which chat's
``logprobs.content`` holds too (llama-server's shape for it); ``legacy`` is OpenAI's completions object
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``)."""
from __future__ import annotations

import codecs
import math

from ..engine import TextDelta
from ..engine.logprobs import TokenLogprob


class Texts:
    """The text each generated token adds to the answer, in order: its bytes decoded with those of the tokens before
    it, so a character split across tokens comes whole with its last (llama-server's ``text_to_send``): the
    tokens' texts joined are the answer's text. One per answer, fed every token once."""

    def __init__(self, model):
        self.model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._decoder.decode(self.model.piece(token))


def _alternative(model, token: int, logprob: float, post: bool) -> dict:
    piece = model.piece(token)
    return {"id": token, "token": piece.decode("utf-8", "replace"), "bytes": list(piece),
            **({"prob": math.exp(logprob)} if post else {"logprob": logprob})}


def entries(model, probs: list[TokenLogprob], texts: Texts, post: bool = False) -> list[dict]:
    """llama-server's ``completion_probabilities`` (and chat's ``logprobs.content``) for these tokens: each one's
    ``token`` is the text it added (``texts``), its ``bytes`` its own (OpenAI's: joined, they are the answer's)."""
    out = []
    for p in probs:
        entry = {**_alternative(model, p.token, p.logprob, post), "token": texts(p.token)}
        entry["top_probs" if post else "top_logprobs"] = [_alternative(model, t, lp, post) for t, lp in p.top]
        out.append(entry)
    return out


def legacy(model, probs: list[TokenLogprob], texts: Texts, offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs`` object; ``offset``: characters of the answer before these tokens."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in probs:
        token = texts(p.token)
        out["tokens"].append(token)
        out["token_logprobs"].append(p.logprob)
        top: dict[str, float] = {}
        for t, lp in p.top:  # (tokens that share a text: the likelier one's, as the list is sorted)
            top.setdefault(model.piece(t).decode("utf-8", "replace"), lp)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def of_batch(batch: list) -> list[TokenLogprob]:
    """The probabilities a batch of events carries, in order (none when not asked for)."""
    return [p for ev in batch if isinstance(ev, TextDelta) for p in ev.logprobs or []]
