"""Draft colouring keeps the answer's Markdown: however the drafted runs fall, the coloured HTML is the plain
rendering with spans added around text, and only around text the draft wrote."""
import random
import re

from markdown_it import MarkdownIt

from app.ui.draft_colours import SPAN, coloured_html, kind, legend, one_line

DOCS = [
    "# Lighthouses\n\nA **lighthouse** guides _ships_ at night.\n\n- one\n- two with `code`\n\n1. first\n2. second\n",
    "Use this:\n\n```python\ndef f(x):\n\n    return x * 2\n```\n\nThen call `f(2)`.",
    "| name | size |\n|---|:---:|\n| qwen | 0.5B |\n| lfm | 1.2B |\n\nDone.",
    "> a quote\n> on two lines\n\nSee [the docs](https://example.org/a_b?x=1) and ~~old~~ new.\n\n---\nTitle\n===\n",
    "Raw <b>html</b> & entities stay text; snake_case_names and 2 * 3 * 4 are not emphasis.\n\n    indented code\n",
]
SPANS = re.compile(r'<span class="tok-draft">([^<]*)</span>')


def _plain(doc: str) -> str:
    """The plain rendering (markdown-it's own renderer), on one line as coloured_html writes it."""
    return one_line(MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).render(doc))


def _segments(doc: str, rng: random.Random) -> list[list]:
    cuts = sorted(rng.sample(range(1, len(doc)), 12))
    return [[doc[a:b], i % 2 == 0] for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(doc)]))]


def test_colouring_changes_nothing_but_spans_around_drafted_text():
    rng = random.Random(7)
    for doc in DOCS:
        for _ in range(40):
            segments = _segments(doc, rng)
            html = coloured_html(segments)
            assert html.startswith('<div class="spec-coloured">') and html.endswith("</div>")
            body = html[len('<div class="spec-coloured">'):-len("</div>")]
            assert SPANS.sub(r"\1", body) == _plain(doc), segments  # the same structure and text as uncoloured
            assert body.count(SPAN) == len(SPANS.findall(body))  # every span holds text only: none crosses a tag
            drafted = "".join(t for t, d in segments if d)
            for run in SPANS.findall(body):  # and that text is the draft's (entities aside)
                plain = run.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&#10;", "\n")
                assert all(w in drafted for w in plain.split()), (run, segments)


def test_the_plain_answer_and_the_coloured_one_render_the_same_blocks():
    segments = [["# Ti", True], ["tle\n\n- one\n- t", False], ["wo\n\n``", True], ["`py\nx = 1\n```\n", False]]
    html = coloured_html(segments)
    assert '<h1><span class="tok-draft">Ti</span>tle</h1>' in html
    assert '<li>t<span class="tok-draft">wo</span></li>' in html
    assert '<pre><code class="language-py">x = 1&#10;</code></pre>' in html  # a fence split across runs still fences
    assert "\n" not in html  # one line: an HTML block to the chat's own Markdown
    assert coloured_html([["<script>alert(1)</script>", True]]) == \
        '<div class="spec-coloured"><p><span class="tok-draft">&lt;script&gt;alert(1)&lt;/script&gt;</span></p></div>'
    assert coloured_html([["  \n", True]]) == ""


def test_each_drafters_text_takes_its_kinds_colour_and_name():
    segments = [["Hello ", False], ["there", "model"], [" and ", "ngram-longest"], ["again", "suffix"],
                [" twice", "mtp"], [".", True]]
    html = coloured_html(segments)
    assert '<span class="tok-draft by-model" title="draft model">there</span>' in html
    assert '<span class="tok-draft by-lookup" title="n-gram lookup (ngram-longest)"> and </span>' in html
    assert '<span class="tok-draft by-earlier" title="earlier answers">again</span>' in html
    assert '<span class="tok-draft by-head" title="' in html and "twice</span>" in html
    assert html.endswith('<span class="tok-draft">.</span></p></div>')  # (an answer kept before drafters were named)
    assert [kind(n) for n in ("model", "model (as text)", "ngram-simple", "suffix", "eagle3")] == \
        ["model", "model", "lookup", "earlier", "head"]
    assert all(f"by-{k}" in legend() for k in ("model", "lookup", "earlier", "head"))
    # runs of two drafters side by side stay two spans
    assert coloured_html([["ab", "model"], ["cd", "suffix"]]).count("<span") == 2


def test_an_answer_drawn_with_html_keeps_its_markdown_for_copy_on_one_line():
    """The chat's Copy gives the answer as written (the page's script reads the .spec-source's title): kept whole
    when colours or the interrupted mark draw it with HTML, on one line so the chat's Markdown keeps it in its block."""
    import html

    from app.ui.render import chat_messages
    text = 'A "quote" & <tag>\n\n```\ncode\n```\nend'
    answer = {"role": "assistant", "content": text, "segments": [[text[:9], True], [text[9:], False]]}
    for show_draft, finish in ((True, None), (False, "interrupted"), (True, "interrupted")):
        body = chat_messages([{**answer, "finish": finish}], show_draft)[-1]["content"]
        source = re.search(r'<span class="spec-source" title="([^"]*)"></span>', body)
        assert source and "\n" not in source[0] and html.unescape(source[1]) == text
    assert chat_messages([answer], False)[-1]["content"] == text  # plain Markdown: Gradio's own Copy gives it
