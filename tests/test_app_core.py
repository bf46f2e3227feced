"""The app's core below the UI: settings, saved files, the worker-thread stream, and the runtime on tiny models."""
from __future__ import annotations

import json
import re
import threading

import pytest

from app.engine import METHODS, EngineError, Stats
from app.engine.drafters import registry
from app.chat.conversations import for_model
from app.models.loader import LoadSpec
from app.prompts import chat_prompt, plain_tokens
from app.paths import config_dir
from app.chat.runtime import Runtime
from app.chat.settings import Settings, load_settings, save_settings
from app.json_files import load_json, save_json
from app.chat.streaming import Generation
from app.ui import render


# --- files ---------------------------------------------------------------------------------------------------
def test_save_json_replaces_atomically(tmp_path):
    path = tmp_path / "x.json"
    save_json(path, {"a": 1})
    save_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary file left behind


def test_save_json_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "x.json"
    save_json(path, {"a": 1})
    with pytest.raises(TypeError):
        save_json(path, {"a": object()})  # not serialisable: fails halfway through writing
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_corrupt_file_is_set_aside_with_a_warning(tmp_path):
    path = tmp_path / "history.json"
    path.write_text('{"messages": [{"role": "user", "content": "hi"')  # cut off mid-write by some other tool
    data, warning = load_json(path)
    assert data is None and "set aside as history.json.corrupt-" in warning
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("history.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text().startswith('{"messages"')  # kept, not deleted
    assert load_json(path) == (None, None)


def test_what_the_template_sees():
    msgs = [{"id": 1, "role": "user", "content": "hi"},
            {"id": 2, "role": "assistant", "content": "hello", "segments": [["hello", True]], "stats": {"n_tokens": 2},
             "finish": "stop"}]
    assert for_model(msgs, "Be brief.") == [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert for_model(msgs, "  ")[0]["role"] == "user"


def test_settings_round_trip_and_tolerance(specchat_home):
    s = Settings(temperature=0.7, draft_max=5, models=LoadSpec(target="/m/t.gguf", draft="/m/d.gguf", ngl=-1))
    save_settings(s)
    assert load_settings() == (s, None)
    # Older or newer files: unknown keys ignored, wrong types fall back to defaults.
    (config_dir() / "settings.json").write_text(json.dumps({"temperature": "hot", "top_k": 7, "future": 1,
                                                            "models": {"pair": "starter", "gpu": "x"}}))
    s2, _ = load_settings()
    assert s2.temperature == Settings().temperature and s2.top_k == 7 and s2.models == LoadSpec(pair="starter")


@pytest.mark.parametrize("change, message", [
    (dict(top_p=1.5), "top-p"),
    (dict(draft_min=9, draft_max=4), "--draft-min"),
    (dict(max_tokens=0), "max-tokens"),
    (dict(drafter="magic"), "Unknown drafter"),
])
def test_invalid_settings_are_explained(change, message):
    from dataclasses import replace

    with pytest.raises(EngineError, match=message):
        replace(Settings(), **change).generation()


def test_the_page_names_its_fields_where_the_engine_names_flags():
    from dataclasses import replace

    from app.ui.render import in_page_words, notice

    with pytest.raises(EngineError) as refused:
        replace(Settings(), max_tokens=-5).generation()
    assert "--max-tokens" in str(refused.value)  # the CLI's words, kept there
    shown = notice(str(refused.value))
    assert "Invalid Max tokens -5" in shown and "--" not in shown
    assert in_page_words("a smaller context (--ctx), or --ctx-checkpoints 2") == \
        "a smaller context (Context size), or --ctx-checkpoints 2"  # a flag the page has no field for stays
    assert "press Download again (Models tab)" in in_page_words("Check it and run the pull again: it resumes.")


def test_the_drafter_list_offers_what_the_pair_can_use_and_names_the_rest():
    from app.chat.settings import usable_drafter
    from app.ui.settings_panel import drafter_choices, unusable_note

    usable = ("model", "ngram", "none")  # the starter's: a draft model, no MTP layers, no head
    assert [name for _, name in drafter_choices("mtp", usable)] == list(usable)
    assert usable_drafter("mtp", usable) == "model" and usable_drafter("ngram", usable) == "ngram"
    assert drafter_choices("ngram-simple", usable)[-1] == ("n-gram lookup (ngram-simple)", "ngram-simple")
    note = unusable_note(usable)
    assert "MTP layers (needs MTP layers in the target)" in note and "Draft model" not in note
    assert len(drafter_choices("model")) == len(METHODS) and unusable_note(()) == ""  # nothing loaded yet


def test_the_live_panel_claims_nothing_before_an_answer():
    from app.engine import Stats
    from app.ui.render import live_panel

    idle = live_panel(None, [], "idle")
    assert "0.0%" not in idle and "0 ms" not in idle and 'data-acceptance=""' in idle
    assert '<span class="drafter"></span>' in idle  # no bare "off" in the corner before anything ran
    done = live_panel(Stats(drafter="model", n_drafted=4, n_accepted=3, n_tokens=5), [], "done")
    assert "75.0%" in done and "drafted by draft model" in done
    assert "speculation off" in live_panel(Stats(drafter="none", n_tokens=5), [], "done")
    assert "appear here" not in done  # a finished answer shown again (a reload): no placeholder for its chart
    assert "appear here" in live_panel(Stats(drafter="model", n_tokens=1), [], "running")


def test_nothing_drafted_yet_is_no_acceptance_figure():
    """An answer stopped before the draft proposed anything, or one adaptive drafting kept off: acceptance and
    accepted/round are "—", not a 0% and 0.00 that were never measured."""
    from app.engine import Stats
    from app.ui.render import live_panel, stats_title

    early = Stats(drafter="model", n_tokens=3)
    panel = live_panel(early, [], "cancelled")
    figures = dict(re.findall(r'data-key="([\w-]+)"><span class="v">([^<]*)<', panel))
    assert figures["acceptance"] == "—" and figures["per-round"] == "—", figures
    assert "acceptance — · — accepted/round · 3 tokens · stopped" in stats_title(early, "cancelled")
    drafted = Stats(drafter="model", n_tokens=9, n_drafted=8, n_accepted=0, n_rounds=2)
    assert "acceptance 0.0% · 0.00 accepted/round" in stats_title(drafted, "stop")  # measured: a real zero


def test_the_reading_of_a_prompt_is_followed_until_the_first_token():
    from app.chat.live_answer import Live
    from app.engine import PromptProgress, Stats
    from app.ui.render import live_panel

    live = Live()
    live.add(PromptProgress(1717, 200, 712, 3.0))
    panel = live_panel(live.stats, live.points, "running", live.prompt)
    assert "Reading the prompt: 712 of 1,717 tokens, 200 of them from the cache" in panel and 'width:41.5%' in panel
    live.stats = Stats(drafter="model", n_tokens=3)
    assert "Reading the prompt" not in live_panel(live.stats, live.points, "running", live.prompt)


def test_ui_collects_numbers_with_clear_errors():
    from app.ui.app import SETTING_NAMES, collect

    values = [getattr(Settings(), n) for n in SETTING_NAMES]
    values[SETTING_NAMES.index("top_k")] = None  # an emptied number box
    with pytest.raises(EngineError, match="Top-k must be a number"):
        collect(values)
    values[SETTING_NAMES.index("top_k")] = 12.0  # Gradio's numbers arrive as floats
    values[SETTING_NAMES.index("seed")] = 2.5
    with pytest.raises(EngineError, match="Seed must be a whole number"):
        collect(values)
    values[SETTING_NAMES.index("seed")] = 3.0
    s = collect(values)
    assert (s.top_k, s.seed) == (12, 3) and isinstance(s.top_k, int)


# --- the worker-thread stream --------------------------------------------------------------------------------
def test_generation_batches_and_cancels_when_the_viewer_leaves():
    from app.engine import Done, Stats, TextDelta

    started = threading.Event()

    def run(cancel):
        for i in range(10_000):
            if cancel.is_set():
                yield Done("cancelled", "", [], Stats())
                return
            started.set()
            yield TextDelta("x", [i], False)
        yield Done("length", "", [], Stats())

    gen = Generation(run)
    batches = gen.batches(interval=0.01)
    first = next(batches)
    assert first and all(isinstance(e, TextDelta) for e in first)
    batches.close()  # the viewer goes away
    assert gen.cancel.is_set() and not gen._thread.is_alive()


def test_generation_passes_errors_to_the_viewer():
    def run(cancel):
        raise EngineError("bad prompt")
        yield  # pragma: no cover

    with pytest.raises(EngineError, match="bad prompt"):
        for _ in Generation(run).batches():
            pass


# --- the runtime on tiny models ------------------------------------------------------------------------------
@pytest.fixture
def runtime(models):
    rt = Runtime()
    rt.load(LoadSpec(target=str(models["target"]), draft=str(models["close_draft"]), ctx=256))
    yield rt
    rt.close()


def test_runtime_answer_streams_snapshots(runtime):
    s = Settings(max_tokens=40, draft_max=6, draft_p_min=0.0)
    snaps = [(len(live.text), live.stats.n_tokens) for live in runtime.answer(
        [{"role": "user", "content": "the cat"}], s, interval=0.0)]
    live = _last(runtime.answer([{"role": "user", "content": "the cat"}], s))
    assert live.done.finish_reason in ("stop", "length") and live.text == live.done.text
    assert live.stats.n_accepted > 0 and live.points and all(0 <= a <= 1 for _, _, a in live.points)
    assert any(flag for _, flag in live.segments) and "".join(t for t, _ in live.segments) == live.done.text
    assert len(snaps) > 1 and snaps == sorted(snaps)  # it grows while it streams


def test_runtime_compare_is_identical_under_greedy(runtime):
    msgs = [{"role": "user", "content": "the dog"}]
    cmp = _last(runtime.compare(msgs, Settings(max_tokens=48, draft_max=6, draft_p_min=0.0)))
    assert cmp.phase == "done" and cmp.first_difference() is None and cmp.note == ""
    assert cmp.off.stats.drafter == "none" and cmp.on.stats.n_drafted > 0 and cmp.speedup > 0
    assert cmp.off.stats.prompt_cached == 0 and cmp.on.stats.prompt_cached == 0  # both from an empty cache
    # what the pair can reach here, timed after the runs, with the pair's other methods for the advice
    assert cmp.ceiling.speedup >= 1.0 and cmp.ceiling.draft_cost > 0 and "n-gram lookup (ngram-longest)" in cmp.others
    ngram = _last(runtime.compare(msgs, Settings(max_tokens=16, drafter="ngram")))
    assert ngram.phase == "done" and ngram.ceiling is None  # n-gram drafts come and go with the text
    with pytest.raises(EngineError, match="needs a drafter"):
        _last(runtime.compare(msgs, Settings(drafter="none")))


@pytest.mark.parametrize("phase", ["off", "on"])
def test_a_comparison_stopped_mid_run_ends_as_stopped(runtime, phase):
    """Stop (or Escape) while speculation is off, or on: the comparison ends saying it was stopped, compares
    nothing and raises nothing (stopped in its first run, it raised on the second run's missing outcome)."""
    from app.ui.compare_html import compare_summary

    cancel = threading.Event()
    for cmp in runtime.compare([{"role": "user", "content": "the dog"}], Settings(max_tokens=48, draft_max=6),
                               cancel, interval=0.0):
        if cmp.phase == phase and getattr(cmp, phase).stats.n_tokens >= 2:
            cancel.set()
    assert cmp.phase == "done" and not cmp.finished and cmp.diff_spans is None and cmp.note == ""
    assert (cmp.on.done is None) == (phase == "off")
    assert "Stopped before both runs finished." in compare_summary(cmp)


def test_a_measured_fastest_method_is_what_a_loaded_pair_drafts_with(runtime, specchat_home):
    """What `specchat check --measure` ranked for these files (here a real bench of both methods) becomes the
    drafter the pair starts with: on Load in the app, and at start when measured since the settings were saved."""
    from app.chat.method_ranking import FILE, recall, remember
    from app.cli.bench import run_bench
    from app.cli.serve import start_runtime
    from app.engine import DraftParams
    from app.paths import data_dir

    target, draft = runtime.resolved.target, runtime.resolved.draft
    assert recall(target, draft) is None and runtime.preferred is None
    before = load_settings()[0]
    save_settings(Settings(drafter="model").loaded(runtime.spec))  # the person's last session
    prompts = [{"prompt": "the cat", "category": "x", "chat": False, "grammar": None}]
    reports = run_bench(runtime.engine, ["model", "ngram"], DraftParams(draft_max=4), prompts, 8)
    try:
        ranking = remember(target, draft, reports)
        assert runtime.ranking == ranking and runtime.preferred == ranking.best in ("model", "ngram")
        assert Settings(drafter="none").for_pair(None, runtime.drafters, runtime.preferred).drafter == ranking.best
        assert "over plain decoding; specchat check --measure" in ranking.why()
        settings, _ = start_runtime(runtime, runtime.spec, {}, with_ui=True, server_key=None)
        assert settings.drafter == ranking.best  # measured after the settings were saved: it applies at start
    finally:  # (the home is shared with later tests)
        (data_dir() / FILE).unlink()
        save_settings(before)


def test_the_chat_samples_by_default_with_a_fresh_seed_each_answer_shown_and_repeatable(runtime):
    """As LM Studio's chat: temperature 0.7, so Regenerate writes another answer; each answer says its seed, and that
    seed typed into Settings writes the same answer again. Greedy answers say so."""
    msgs = [{"role": "user", "content": "the dog"}]
    assert Settings().temperature == 0.7 and Settings().seed == -1
    first, second = (_last(runtime.answer(msgs, Settings(max_tokens=24))).done for _ in range(2))
    assert 0 <= first.stats.seed < 2**32 and 0 <= second.stats.seed < 2**32
    assert first.stats.seed != second.stats.seed and first.text != second.text  # (two 32-bit draws)
    again = _last(runtime.answer(msgs, Settings(max_tokens=24, seed=first.stats.seed))).done
    assert again.text == first.text and again.stats.seed == first.stats.seed
    assert f"seed {first.stats.seed}" in render.stats_details(first.stats)
    assert f"drafted by {first.stats.method} · seed {first.stats.seed}" in render.live_panel(first.stats, [], "done")
    assert Stats.from_dict(first.stats.as_dict()).seed == first.stats.seed  # kept with the saved answer
    greedy = _last(runtime.answer(msgs, Settings(max_tokens=8, temperature=0.0))).done
    assert greedy.stats.seed == -1 and " · greedy · " in render.stats_details(greedy.stats)


def test_continue_goes_on_from_the_answer_in_the_same_message_counting_both_runs(runtime):
    """Continue: the answer cut at the token limit grows in place, from the cache the first run left; its figures
    count both runs. Stopped, it keeps all it has."""
    from app.chat.live_answer import Live
    from app.prompts import chat_tokens

    msgs = [{"role": "user", "content": "the cat"}]
    greedy = Settings(max_tokens=8, temperature=0.0, draft_max=4, draft_p_min=0.0)
    first = _last(runtime.answer(msgs, greedy))
    assert first.done.finish_reason == "length" and first.stats.n_tokens == 8
    so_far = Live.going_on(first.text, first.segments, first.stats.as_dict())
    more = _last(runtime.answer(msgs, greedy, continues=so_far))
    assert more is so_far and more.text.startswith(first.text) and len(more.text) > len(first.text)
    assert more.segments[:len(first.segments) - 1] == first.segments[:-1]  # where its tokens came from, kept
    assert more.stats.n_tokens == 8 + more.done.stats.n_tokens and more.done.finish_reason == "length"
    assert more.stats.n_drafted == first.stats.n_drafted + more.done.stats.n_drafted
    assert more.stats.time_to_first_token_s == first.stats.time_to_first_token_s  # the answer's first token
    assert more.points[-1][0] == more.stats.n_tokens  # the chart plots the figures the panel shows: both runs
    assert more.done.stats.prompt_cached >= len(chat_tokens(runtime.engine.model, msgs))  # not read again
    cancel = threading.Event()
    kept = Live.going_on(more.text, more.segments, more.stats.as_dict())
    for live in runtime.answer(msgs, Settings(max_tokens=200), cancel, interval=0, continues=kept):
        if live.stats.n_tokens >= more.stats.n_tokens + 2:
            cancel.set()
    assert live.done.finish_reason == "cancelled" and live.text.startswith(more.text)


def test_an_answer_continued_counts_both_runs_figures():
    first = Stats(drafter="model", prompt_tokens=30, n_tokens=10, n_drafted=8, n_accepted=6, n_rounds=4,
                  time_to_first_token_s=0.5, decode_seconds=1.0, draft_seconds=0.2, verify_seconds=0.7, seed=7)
    later = Stats(drafter="model", prompt_tokens=3, prompt_cached=40, n_tokens=5, n_drafted=4, n_accepted=2,
                  n_rounds=3, time_to_first_token_s=0.25, decode_seconds=0.75, draft_seconds=0.1, verify_seconds=0.5,
                  seed=9)
    both = first.then(later)
    assert (both.n_tokens, both.n_drafted, both.n_accepted, both.n_rounds) == (15, 12, 8, 7)
    assert (both.prompt_tokens, both.prompt_cached, both.time_to_first_token_s) == (30, 0, 0.5)  # the first run's
    assert both.draft_seconds == pytest.approx(0.3) and both.verify_seconds == pytest.approx(1.2)
    # 14 tokens after the first, over the first run's 1 s, the second's prompt reading and its 0.75 s
    assert both.decode_seconds == 2.0 and both.tokens_per_second == 7.0 and both.acceptance_rate == 8 / 12
    assert both.by_drafter == {} and both.seed == 9
    mixed = first.then(Stats(**{**later.__dict__, "drafter": "ngram"}))  # drafted another way: each run's share
    assert mixed.drafter == "ngram" and mixed.by_drafter == {"model": (4, 8, 6), "ngram": (3, 4, 2)}
    assert Stats().then(later) == later  # nothing written before: the later run is the whole answer
    assert first.then(Stats(drafter="model")).decode_seconds == 1.0  # nothing written after: no time added


def test_runtime_stop_keeps_the_partial_answer(runtime):
    cancel = threading.Event()
    lives = []
    for live in runtime.answer([{"role": "user", "content": "a"}], Settings(max_tokens=200), cancel, interval=0):
        lives.append(live.stats.n_tokens)
        if live.stats.n_tokens >= 3:
            cancel.set()
    assert live.done.finish_reason == "cancelled" and 3 <= live.stats.n_tokens < 200


def test_runtime_failed_load_keeps_the_previous_pair(runtime, models, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(EngineError, match="still loaded"):
        runtime.load(LoadSpec(target=str(bad)))
    assert runtime.info()["target"] == "target.gguf" and runtime.drafters[0] == "model"
    with pytest.raises(EngineError, match="still loaded"):  # a good target with a bad draft fails as a whole
        runtime.load(LoadSpec(target=str(models["target"]), draft=str(bad)))
    assert runtime.info()["target"] == "target.gguf" and runtime.drafters[0] == "model"
    assert _last(runtime.answer([{"role": "user", "content": "x"}], Settings(max_tokens=4))).done


def test_runtime_without_draft_explains_the_model_drafter(models):
    rt = Runtime()
    with pytest.raises(EngineError, match="No model pair is loaded"):
        _last(rt.answer([{"role": "user", "content": "x"}], Settings()))
    rt.load(LoadSpec(target=str(models["target"]), ctx=128))
    try:
        with pytest.raises(EngineError, match="no draft model"):
            _last(rt.answer([{"role": "user", "content": "x"}], Settings(drafter="model")))
        live = _last(rt.answer([{"role": "user", "content": "x"}], Settings(drafter="ngram", max_tokens=8)))
        assert live.done.stats.drafter == registry.DEFAULT_KIND  # --drafter ngram: the default n-gram kind
        assert rt.info()["memory_bytes"] > 0 and rt.info()["draft"] is None
    finally:
        rt.close()


def _last(it):
    item = None
    for item in it:
        pass
    return item


# --- thinking --------------------------------------------------------------------------------------------------
def test_thinking_is_told_apart_from_the_answer():
    from app.prompts import thinking

    assert thinking.split("plain answer") == thinking.Parts(None, False, 0)
    text = "<think>\nweigh it up\n</think>\n\nThe answer."
    parts = thinking.split(text)
    assert parts.thinking == "weigh it up" and parts.thinking_done and text[parts.answer_start:] == "The answer."
    streaming = thinking.split("<think>\nstill weigh")
    assert streaming.thinking == "still weigh" and not streaming.thinking_done
    r1 = thinking.split("opened by the template</think>Answer")  # DeepSeek-R1: no opening tag in the output
    assert r1.thinking == "opened by the template" and r1.thinking_done
    assert thinking.opens_thinking("<｜Assistant｜><think>\n") and not thinking.opens_thinking("assistant\n")


def test_thinking_is_shown_collapsed_above_the_answer():
    from app.ui import render

    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nAnswer **bold**",
                "segments": [["<think>\nreasoning\n</think>\n\nAnswer", True], [" **bold**", False]],
                "stats": {"drafter": "model", "n_tokens": 9, "n_drafted": 4, "n_accepted": 3, "decode_seconds": 1.0},
                "finish": "stop"}]
    out = render.chat_messages(history, show_draft=False)
    assert out[1] == {"role": "assistant", "content": "reasoning", "metadata": {"title": "Thinking", "status": "done"}}
    assert out[2] == {"role": "assistant", "content": "Answer **bold**"}
    assert "8.0 tok/s" in out[3]["metadata"]["title"]
    coloured = render.chat_messages(history, show_draft=True)[2]["content"]
    assert coloured == ('<div class="spec-coloured"><p><span class="tok-draft">Answer</span> <strong>bold</strong></p>'
                        '</div><span class="spec-source" title="Answer **bold**"></span>')  # (what Copy gives)

    class Live:  # an answer still thinking
        text = "<think>\nhmm"
        segments = [["<think>\nhmm", False]]
    live = render.chat_messages([], False, Live())
    assert live == [{"role": "assistant", "content": "hmm", "metadata": {"title": "Thinking…", "status": "pending"}}]


def test_a_message_shows_its_images_then_its_text_and_an_image_sent_alone_no_empty_text():
    from app.ui import render

    pictures = render.chat_messages([{"role": "user", "content": "What is this?", "images": [b"a", b"b"]},
                                     {"role": "user", "content": "", "images": [b"c"]}], show_draft=False)
    assert [[p if isinstance(p, str) else p["alt_text"] for p in m["content"]] for m in pictures] == \
        [["image 1", "image 2", "What is this?"], ["image 1"]]


def test_an_interrupted_answer_says_so_with_its_stats():
    from app.ui import render

    out = render.chat_messages([{"role": "user", "content": "q"}, {
        "role": "assistant", "content": "half", "finish": "interrupted",
        "stats": {"drafter": "model", "n_tokens": 1}}], show_draft=False)
    assert "Interrupted" in out[1]["content"] and "Regenerate" in out[1]["content"]
    assert out[2]["metadata"]["title"].startswith("⚡ — tok/s") and "interrupted" in out[2]["metadata"]["title"]


R1_STYLE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<User>{{ m['content'] }}"
            "{% elif m['role'] == 'assistant' %}<Assistant>{{ m['content'].split('</think>')[-1] }}</s>{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<Assistant><think>\n{% endif %}")


def test_a_template_that_opens_thinking_starts_the_answer_inside_it(tmp_path):
    """DeepSeek-R1's way: the generation prompt ends with <think>; earlier turns' thinking is left out."""
    from app.chat.live_answer import Live
    from support.tiny_gguf import write_model

    rt = Runtime()
    rt.load(LoadSpec(target=str(write_model(tmp_path / "r1.gguf", seed=1, chat_template=R1_STYLE)), ctx=256))
    try:
        msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "secret plan</think>shown"},
                {"role": "user", "content": "b"}]
        prompt = chat_prompt(rt.engine.model, msgs)
        assert "secret plan" not in prompt and "<Assistant>shown</s>" in prompt
        live = _last(rt.answer(msgs, Settings(drafter="ngram", max_tokens=6)))
        assert live.text.startswith("<think>\n") and live.text[len("<think>\n"):] == live.done.text
        assert live.stats.n_tokens == len(live.done.token_ids)  # the tag is the template's, not a token counted
        # Continued, the prompt opens the block once: the stored answer's own <think> is the template's
        cont = chat_prompt(rt.engine.model, msgs + [{"role": "assistant", "content": live.text}],
                           continue_final_message=True)
        assert cont == chat_prompt(rt.engine.model, msgs) + live.done.text
        more = _last(rt.answer(msgs, Settings(drafter="ngram", max_tokens=6),
                               continues=Live.going_on(live.text, live.segments, live.stats.as_dict())))
        assert more.text.startswith(live.text) and more.text.count("<think>") == 1
    finally:
        rt.close()


def test_compare_marks_the_first_differing_token(runtime):
    from app.chat.comparison import Comparison
    from app.ui import compare_html

    cmp = Comparison("p", "model", True)
    cmp.off.segments, cmp.on.segments = [["same start, red end", False]], [["same start, blue end", False]]
    cmp.diff_spans = ((11, 15), (11, 16))
    assert compare_html.compare_pane(cmp, "off").endswith('same start,<mark class="first-diff" '
                                                    'title="first token that differs"> red</mark> end')
    assert '<mark class="first-diff" title="first token that differs"> blue</mark>' in \
        compare_html.compare_pane(cmp, "on")
    # The real thing: identical greedy outputs mark nothing.
    done = _last(runtime.compare([{"role": "user", "content": "the dog"}], Settings(max_tokens=24, draft_max=6)))
    assert done.diff_spans is None and "<mark" not in compare_html.compare_pane(done, "on")
    assert compare_html.compare_pane(done, "on").startswith("**Speculation on (draft model) — ")


def test_compare_samples_both_runs_with_one_seed_and_gets_the_same_answer(runtime):
    """Sampled, both runs draw from the same seed's numbers, keyed on each token's position: speculation changes the
    speed, not the answer, and Compare checks that as it does under greedy decoding."""
    from app.ui import compare_html

    done = _last(runtime.compare([{"role": "user", "content": "the dog"}],
                                 Settings(max_tokens=32, draft_max=6, temperature=1.0, top_p=1.0, min_p=0.0)))
    assert done.same_tokens and done.on.stats.n_drafted > 0
    assert done.on.done.token_ids == done.off.done.token_ids and done.first_difference() is None
    assert '<span class="same">outputs identical' in compare_html.compare_summary(done)


def test_compare_never_shows_a_ceiling_under_its_own_speedup_and_warns_of_a_busy_machine():
    """The ceiling is timed after the runs: where the runs beat it (a quieter moment), the page says so and shows
    the measured figure as what the pair reaches, not a red "cannot pay" beside a green speedup. Other programs'
    load is said from the start and again with the results."""
    from app.chat.comparison import Comparison
    from app.engine import Done, Stats
    from app.engine.speedup import Ceiling
    from app.ui import compare_html

    cmp = Comparison("p", "model", True, busy_before=1.2, cores=2)
    cmp.phase = "on"
    assert "1.2 of 2 cores before it" in compare_html.compare_summary(cmp)
    for live, seconds in ((cmp.off, 10.0), (cmp.on, 9.0)):  # 1.11x
        live.done = Done("stop", "x", [5] * 101, Stats(n_tokens=101, decode_seconds=seconds))
        live.stats = live.done.stats
    cmp.busy_during, cmp.phase = 0.1, "done"
    for ceiling in (Ceiling(1.0, 0, 1.4, 0.6), Ceiling(1.05, 3, 0.2, 0.3)):  # cannot pay; pays less than measured
        cmp.ceiling = ceiling
        text = compare_html.compare_summary(cmp)
        assert 'data-ceiling="1.111"' in text and "measured 1.11x, more than the costs timed" in text, text
        assert "cannot pay" not in text and "reached 10" not in text
        assert compare_html.compare_row(cmp, 1, "starter")["ceiling"] == 1.111
    assert "1.2 of 2 cores before it busy" in text and "during it" not in text  # 0.1 core: not worth a word
    cmp.ceiling = Ceiling(1.5, 4, 0.1, 0.1)
    assert "reached 74% of it" in compare_html.compare_summary(cmp)
    cmp.busy_before = 0.0
    assert "busy" not in compare_html.compare_summary(cmp)


def test_compare_locates_the_first_differing_token_in_both_texts(tiny_engine):
    from app.chat.comparison import Comparison
    from app.engine import Done, Stats

    same, off_tail, on_tail = (plain_tokens(tiny_engine.model, t)[1:] for t in ("the cat", " sat", " dog"))
    cmp = Comparison("p", "model", True)
    cmp.off.done = Done("stop", "", same + off_tail, Stats())
    cmp.on.done = Done("stop", "", same + on_tail, Stats())
    cmp.locate_difference(tiny_engine.detokenize)
    (a0, a1), (b0, b1) = cmp.diff_spans
    off_text, on_text = (tiny_engine.detokenize(d.token_ids) for d in (cmp.off.done, cmp.on.done))
    assert a0 == b0 >= len(tiny_engine.detokenize(same)) and off_text[:a0] == on_text[:b0]  # the shared start
    assert off_text[a0:a1] and on_text[b0:b1] and off_text[a0:a1] != on_text[b0:b1]  # the first token that differs
    cmp.on.done = Done("stop", "", same + off_tail, Stats())
    cmp.diff_spans = None
    cmp.locate_difference(tiny_engine.detokenize)
    assert cmp.diff_spans is None


def test_download_progress_shows_a_retry_while_it_waits():
    from app.models.hub import Progress

    waiting = Progress("big.gguf", 1, 2, 1_500_000, 3_000_000, "Connection lost: resuming in 2 s (retry 1 of 5).")
    html = render.download_progress([waiting], "running")
    assert 'data-done="1500000"' in html and "(50%) — Connection lost: resuming in 2 s (retry 1 of 5).</div>" in html
    going = Progress("big.gguf", 1, 2, 1_600_000, 3_000_000)
    assert "Connection lost" not in render.download_progress([going], "running")
    looking = Progress("big.gguf", 1, 2, 0, 0, "The Hub answered 503: trying again in 1 s (retry 1 of 5).")
    assert "big.gguf — looking it up — The Hub answered 503: trying again in 1 s" in \
        render.download_progress([looking], "running")
