"""An answer's Markdown rendered as HTML with the text its draft wrote highlighted: headings, lists, code and tables
stay what they are, and the highlight sits only on text.

The source is parsed as it is, never marked up, so the structure is the plain answer's by construction. Then each
piece of text the renderer writes (a text run, inline code, a code block's lines) is found in the source, reading on
from the last one found, and its characters take their runs' origin. A piece that cannot be found (rare: an entity
such as ``&amp;`` written out) is shown uncoloured. Each drafter's text takes its kind's colour (a draft model, n-gram
lookup, earlier answers, the target's own heads), and the drafter's name on hover."""
from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

from ..engine.drafters.registry import DRAFT_MODEL, KINDS, SUFFIX, label

SPAN = '<span class="tok-draft">'  # drafted, by a drafter not recorded (answers kept by earlier versions)
KINDS_SHOWN = {"model": "a draft model", "lookup": "n-gram lookup", "earlier": "earlier answers",
               "head": "the target's own heads (MTP, EAGLE-3, DFlash, an assistant)"}
# Raw HTML in an answer is shown as text (the chat's sanitizer would otherwise have the last word on it)
_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_TAGS = re.compile(r"(<[^>]*>)")


class _Origins:
    """The answer's source and which of its characters the draft wrote; ``at``: where the next piece is looked for."""

    def __init__(self, segments: list[list]):
        self.source = "".join(t for t, _ in segments)
        self.drafted = [d for t, d in segments for _ in t]  # per character: False, True or the drafter's name
        self.at = 0

    def html(self, text: str) -> str:
        """``text`` escaped, with what the draft wrote in spans: found line by line, since a block's lines lose their
        quote markers and indentation on the way to the renderer."""
        out = []
        for line in text.splitlines(keepends=True):
            i = self.source.find(line, self.at)
            if i < 0:
                out.append(escapeHtml(line))
                continue
            self.at = i + len(line)
            start = 0
            for end in range(1, len(line) + 1):
                if end == len(line) or self.drafted[i + end] != self.drafted[i + start]:
                    piece = escapeHtml(line[start:end])
                    out.append(span(self.drafted[i + start]) + piece + "</span>" if self.drafted[i + start] else piece)
                    start = end
        return "".join(out)


def kind(drafter: str) -> str:
    """The colour a drafter's text takes: its kind's (KINDS_SHOWN)."""
    if drafter.startswith(DRAFT_MODEL):  # (a draft model drafting as text too)
        return "model"
    return "lookup" if drafter in KINDS else "earlier" if drafter == SUFFIX else "head"


def span(origin) -> str:
    """The opening tag around text drafted by ``origin`` (a drafter's name, or True: one not recorded)."""
    if not isinstance(origin, str):
        return SPAN
    return f'<span class="tok-draft by-{kind(origin)}" title="{escapeHtml(label(origin))}">'


def legend() -> str:
    """What the highlight means, each kind in its colour."""
    kinds = ", ".join(f'<span class="tok-draft by-{k}">{words}</span>' for k, words in KINDS_SHOWN.items())
    return f"highlighted: drafted, then accepted by the target; drafted by {kinds}"


def _text(self, tokens, idx, options, env) -> str:
    return env["origins"].html(tokens[idx].content)


def _code_inline(self, tokens, idx, options, env) -> str:
    return f"<code{self.renderAttrs(tokens[idx])}>{env['origins'].html(tokens[idx].content)}</code>"


def _code(self, tokens, idx, options, env) -> str:
    info = tokens[idx].info.strip().split(maxsplit=1)
    lang = f' class="{options.langPrefix}{escapeHtml(info[0])}"' if info else ""
    return f"<pre><code{lang}>{env['origins'].html(tokens[idx].content)}</code></pre>\n"


for _rule, _fn in (("text", _text), ("code_inline", _code_inline), ("fence", _code), ("code_block", _code)):
    _MD.add_render_rule(_rule, _fn)


def coloured_html(segments: list[list]) -> str:
    """``segments`` ([[text, origin], ...]) as one line of HTML: the Markdown rendered, drafted text in spans."""
    origins = _Origins(segments)
    if not origins.source.strip():
        return ""
    return f'<div class="spec-coloured">{one_line(_MD.render(origins.source, {"origins": origins}))}</div>'


def one_line(rendered: str) -> str:
    """Rendered HTML on one line, so the chat's own Markdown takes it as one HTML block: newlines inside <pre> kept
    as character references, the others (between blocks, soft breaks) spaces."""
    out, in_pre = [], False
    for piece in _TAGS.split(rendered):
        if piece.startswith("<"):
            in_pre = piece.startswith("<pre") or (in_pre and not piece.startswith("</pre"))
            out.append(piece)
        else:
            out.append(piece.replace("\n", "&#10;" if in_pre else " "))
    return "".join(out).strip()
