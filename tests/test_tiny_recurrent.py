"""The tiny recurrent/hybrid models of tiny_recurrent.py load and run in the llama.cpp we ship, and behave as the
exact speculative decoder needs them to (or, where llama.cpp cannot, the tests pin down how it fails).

Only llama-cpp-python's low-level API is used, not app.engine, so these tests check llama.cpp itself: model kind
flags, the n_rs_seq clamp, greedy decoding, draft/target agreement, batch invariance of the logits, and partial
rollback of the recurrent state (llama_memory_seq_rm of a tail) with n_rs_seq snapshots.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.tiny_recurrent import ARCHS, HYBRID_ARCHS, ROLLBACK_ARCHS, write_recurrent

import llama_cpp.llama_cpp as ll

TARGET_SEED = 1
# draft = target + noise: tuned so each arch's draft agrees with its target's greedy token often, but not always
# (PLaMo-2's post-norms rescale every mixer and FFN output to unit RMS, which makes it the most noise-sensitive)
DRAFT_NOISE = {"lfm2": 0.1, "qwen35": 0.1, "nemotron_h": 0.1, "granitehybrid": 0.1, "mamba2": 0.1, "mamba": 0.1,
               "rwkv7": 0.1, "falcon-h1": 0.1, "jamba": 0.1, "plamo2": 0.07, "kimi-linear": 0.1}
N_RS_SEQ = 8
PROMPT = "<|im_start|>user\nthe cat sat on the mat and the dog ran<|im_end|>\n<|im_start|>assistant\n"


# --- llama.cpp plumbing ---------------------------------------------------------------------------------------------
_log_lines: list[str] = []


@ll.llama_log_callback
def _log(level: int, text: bytes, _user_data) -> None:
    # keep warnings and errors (quoted in failures); drop llama.cpp's info chatter
    if level >= 3 and text:
        _log_lines.append(text.decode("utf-8", "replace").rstrip())


@ll.llama_progress_callback
def _no_progress(_progress: float, _user_data) -> bool:
    return True  # keep loading, without the progress dots


@pytest.fixture(scope="module", autouse=True)
def backend():
    # quiet llama.cpp for this module, then give the log back to whoever had it (app.engine routes it)
    prev, prev_data = ll.llama_log_callback(), ctypes.c_void_p()
    ll.llama_log_get(ctypes.byref(prev), ctypes.byref(prev_data))
    if not os.environ.get("SPECCHAT_LLAMA_LOG"):
        ll.llama_log_set(_log, ctypes.c_void_p(0))
    ll.llama_backend_init()
    yield
    ll.llama_log_set(prev, prev_data)


class Model:
    def __init__(self, path):
        params = ll.llama_model_default_params()
        params.progress_callback = _no_progress
        _log_lines.clear()
        self.ptr = ll.llama_model_load_from_file(str(path).encode(), params)
        assert self.ptr, f"llama.cpp could not load {path.name}: {_log_lines[-3:]}"
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

    def meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        assert n > 0
        return list(buf[:n])

    def close(self):
        ll.llama_model_free(self.ptr)


class Context:
    """Sequence 0 of one llama.cpp context; ``decode`` returns the logits of the positions it was asked for."""

    def __init__(self, model: Model, n_rs_seq: int = 0, n_ctx: int = 512, n_batch: int = 256, n_ubatch: int = 0):
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_ubatch or n_batch
        params.n_seq_max = 1
        params.n_rs_seq = n_rs_seq
        # one thread: these models are too small to gain from more, and OpenMP spinning slows down a busy machine
        params.n_threads = params.n_threads_batch = 1
        params.no_perf = True
        # as app/engine does: flash attention's CPU kernel splits the KV range differently for 1 and n queries
        params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        _log_lines.clear()
        self.ptr = ll.llama_init_from_model(model.ptr, params)
        assert self.ptr, f"no context: {_log_lines[-3:]}"
        self.model = model
        self.mem = ll.llama_get_memory(self.ptr)
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0

    def decode(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Append ``tokens``; logits rows for every one of them (``all_logits``) or just the last."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, self.n_past + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(tokens) - 1
        _log_lines.clear()
        rc = ll.llama_decode(self.ptr, b)
        assert rc == 0, f"llama_decode returned {rc}: {_log_lines[-3:]}"
        self.n_past += len(tokens)
        rows = range(len(tokens)) if all_logits else [len(tokens) - 1]
        n = self.model.n_vocab
        return np.stack([np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ptr, i), shape=(n,)).copy() for i in rows])

    def drop_from(self, pos: int) -> bool:
        """llama_memory_seq_rm of positions >= pos; True when llama.cpp did it."""
        ok = bool(ll.llama_memory_seq_rm(self.mem, 0, pos, -1))
        if ok:
            self.n_past = pos
        return ok

    def close(self):
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ptr)


def greedy(ctx: Context, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens, one decode each, and the logits each was picked from."""
    logits = ctx.decode(prompt)[-1]
    out, seen = [], []
    for _ in range(n):
        seen.append(logits)
        out.append(int(np.argmax(logits)))
        logits = ctx.decode([out[-1]])[-1]
    return out, seen


# --- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-recurrent")
    return {arch: (write_recurrent(d / f"{arch}.gguf", arch, seed=TARGET_SEED),
                   write_recurrent(d / f"{arch}-draft.gguf", arch, seed=2, base_seed=TARGET_SEED,
                                   noise=DRAFT_NOISE[arch]))
            for arch in ARCHS}


@pytest.fixture(scope="module")
def models(paths, backend):
    loaded: dict[str, Model] = {}

    def get(arch: str, which: int = 0) -> Model:
        key = f"{arch}/{which}"
        if key not in loaded:
            loaded[key] = Model(paths[arch][which])
        return loaded[key]

    yield get
    for m in loaded.values():
        m.close()


@pytest.fixture
def ctx_of(models):
    made: list[Context] = []

    def make(arch: str, which: int = 0, n_rs_seq: int = 0, n_ubatch: int = 0) -> Context:
        made.append(Context(models(arch, which), n_rs_seq=n_rs_seq, n_ubatch=n_ubatch))
        return made[-1]

    yield make
    for c in made:
        c.close()


# --- 0. the writer --------------------------------------------------------------------------------------------------
def test_writer_is_deterministic_and_a_draft_is_a_perturbed_copy(tmp_path):
    a = write_recurrent(tmp_path / "a.gguf", "qwen35", seed=5).read_bytes()
    assert a == write_recurrent(tmp_path / "b.gguf", "qwen35", seed=5).read_bytes()
    assert a != write_recurrent(tmp_path / "c.gguf", "qwen35", seed=6).read_bytes()
    # noise 0 on the target's base seed reproduces the target whatever the draft's own seed
    assert a == write_recurrent(tmp_path / "d.gguf", "qwen35", seed=9, base_seed=5).read_bytes()
    with pytest.raises(TypeError):
        write_recurrent(tmp_path / "e.gguf", "lfm2", d_state=8)  # LFM2 has no SSM state
    with pytest.raises(ValueError):
        write_recurrent(tmp_path / "f.gguf", "lfm2", pattern="RR")  # a hybrid needs an attention layer


# --- 1. loading and the model-kind flags ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_loads_with_the_expected_kind(models, arch):
    m = models(arch)
    assert m.meta("general.architecture") == arch
    assert bool(ll.llama_model_is_hybrid(m.ptr)) == (arch in HYBRID_ARCHS)
    assert bool(ll.llama_model_is_recurrent(m.ptr)) == (arch not in HYBRID_ARCHS)


# --- 2. n_rs_seq is kept only where llama.cpp can roll back -----------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_n_rs_seq_is_clamped_without_rollback_support(ctx_of, arch):
    ctx = ctx_of(arch, n_rs_seq=N_RS_SEQ)
    assert ll.llama_n_rs_seq(ctx.ptr) == (N_RS_SEQ if arch in ROLLBACK_ARCHS else 0)


# --- 3. greedy decoding is sane -------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decoding_is_not_degenerate(models, ctx_of, arch):
    ctx = ctx_of(arch)
    out, logits = greedy(ctx, models(arch).tokenize(PROMPT), 40)
    assert all(np.isfinite(x).all() for x in logits)
    assert len(set(out)) >= 5, out
    assert max(out.count(t) for t in set(out)) <= 20, out  # not stuck on one token


# --- 4. a draft agrees with its target often, not always --------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_draft_agrees_with_target_partly(models, ctx_of, arch, record_property):
    prompt = models(arch).tokenize(PROMPT)
    want, _ = greedy(ctx_of(arch), prompt, 60)
    # the draft scores the target's continuation: its argmax at each position vs the target's pick there
    draft_logits = ctx_of(arch, which=1).decode(prompt + want[:-1], all_logits=True)[len(prompt) - 1:]
    rate = float(np.mean(np.argmax(draft_logits, axis=1) == np.array(want)))
    record_property("agreement", rate)
    print(f"{arch}: draft/target greedy agreement {rate:.2f}")
    assert 0.3 <= rate <= 0.95


# --- 5. batch invariance ------------------------------------------------------------------------------------------
# Exact speculative decoding needs a token's logits to be bit-identical whether it was decoded alone (plain
# generation) or inside a verification batch. With n_rs_seq the recurrent layers also write snapshots, so the
# rollback archs are checked with it on as well (the others clamp it to 0).
RS_CASES = [(arch, 0) for arch in ARCHS] + [(arch, N_RS_SEQ) for arch in ROLLBACK_ARCHS]
BATCHINGS = {"12 tokens, one ubatch": (12, 0), "the whole prompt, ubatches of 32": (None, 32)}


@pytest.mark.parametrize("arch,n_rs_seq", RS_CASES)
@pytest.mark.parametrize("batching", BATCHINGS)
def test_logits_do_not_depend_on_batching(models, ctx_of, arch, n_rs_seq, batching, record_property):
    n_tokens, n_ubatch = BATCHINGS[batching]
    tokens = models(arch).tokenize(PROMPT)[:n_tokens]
    ctx = ctx_of(arch, n_rs_seq=n_rs_seq, n_ubatch=n_ubatch)
    one_by_one = np.concatenate([ctx.decode([t]) for t in tokens])
    batched = ctx_of(arch, n_rs_seq=n_rs_seq, n_ubatch=n_ubatch).decode(tokens, all_logits=True)
    diff = float(np.abs(one_by_one - batched).max())
    record_property("max_abs_diff", diff)
    print(f"{arch} n_rs_seq={n_rs_seq} {batching} ({len(tokens)}): max |one-by-one - batched| = {diff:.3g}")
    assert np.array_equal(one_by_one, batched), f"max abs diff {diff:.3g}"


# --- 6. partial rollback of the recurrent state ---------------------------------------------------------------------
# llama.cpp keeps n_rs_seq snapshots of each recurrent layer's state, "s tokens back" in slot s, written by a decode
# for the last tokens of the batch it was given (that batch's trailing n_rs_seq + 1 tokens always share a ubatch).
# llama_memory_seq_rm(seq, p, -1) then makes the next decode start from slot (last pos - p + 1). It only refuses
# more than n_rs_seq positions or a second rollback before a decode: dropping tokens that the *last* decode call
# did not cover (or its first token) is accepted yet reads snapshots that were never written for them.
#
#   case: (chunk sizes decoded one llama_decode each, drop positions >= this, n_ubatch, seq_rm accepted, exact)
ROLLBACK_CASES = {
    "drop 1 of a 6-token batch": ([8, 6], 13, 0, True, True),
    "drop 3 of a 6-token batch": ([8, 6], 11, 0, True, True),
    "drop 5 of a 6-token batch, keeping its first": ([8, 6], 9, 0, True, True),
    "drop 8 of a 20-token batch split into ubatches of 16": ([8, 20], 20, 16, True, True),
    # wrong: the state before a batch's first token is no snapshot of that batch
    "drop a whole 6-token batch": ([8, 6], 8, 0, True, False),
    # wrong: a one-token decode writes no valid snapshot but slot 0 (its own result); slots 1.. hold older states
    "drop 2 of 3 single-token decodes": ([8, 1, 1, 1], 9, 0, True, False),
    "drop a single-token decode that followed a batch": ([8, 6, 1], 14, 0, True, False),
    # refused: only n_rs_seq (8) snapshots
    "drop 10 of a 12-token batch": ([8, 12], 10, 0, False, None),
}


def _decode_chunks(ctx: Context, tokens: list[int], sizes: list[int]) -> None:
    at = 0
    for n in sizes:
        ctx.decode(tokens[at:at + n], all_logits=True)  # as a verification batch is decoded: logits everywhere
        at += n


@pytest.mark.parametrize("arch", ROLLBACK_ARCHS)
@pytest.mark.parametrize("case", ROLLBACK_CASES)
def test_rollback(models, ctx_of, arch, case, record_property):
    """After the rollback, three more tokens decoded one by one must give (or, for the cases known to be
    wrong, must not give) bit-identical logits to a context that decoded only the kept tokens."""
    sizes, keep, n_ubatch, accepted, exact = ROLLBACK_CASES[case]
    toks = models(arch).tokenize(PROMPT)
    nxt = toks[sum(sizes):sum(sizes) + 3]
    ctx = ctx_of(arch, n_rs_seq=N_RS_SEQ, n_ubatch=n_ubatch)
    _decode_chunks(ctx, toks, sizes)
    end = ctx.n_past
    assert ctx.drop_from(keep) == accepted
    if not accepted:
        assert ll.llama_memory_seq_pos_max(ctx.mem, 0) == end - 1  # refused: nothing dropped
        return
    assert ll.llama_memory_seq_pos_max(ctx.mem, 0) == keep - 1
    got = np.concatenate([ctx.decode([t]) for t in nxt])  # the state must stay right after the rollback too

    # the same decodes in a context that never saw the dropped tokens
    fresh = ctx_of(arch, n_rs_seq=N_RS_SEQ, n_ubatch=n_ubatch)
    kept_sizes, left = [], keep
    for n in sizes:
        if left > 0:
            kept_sizes.append(min(n, left))
            left -= kept_sizes[-1]
    _decode_chunks(fresh, toks, kept_sizes)
    want = np.concatenate([fresh.decode([t]) for t in nxt])
    diff = float(np.abs(got - want).max())
    record_property("max_abs_diff", diff)
    print(f"{arch}: {case}: seq_rm accepted, max abs diff of the next logits {diff:.3g}")
    assert np.array_equal(got, want) == exact, f"max abs diff {diff:.3g}"


@pytest.mark.parametrize("arch", ROLLBACK_ARCHS)
def test_a_second_rollback_before_a_decode_is_refused(models, ctx_of, arch):
    toks = models(arch).tokenize(PROMPT)
    ctx = ctx_of(arch, n_rs_seq=N_RS_SEQ)
    _decode_chunks(ctx, toks, [8, 6])
    assert ctx.drop_from(12)
    assert not ctx.drop_from(10)  # one pending snapshot index per sequence, consumed by the next decode
    ctx.decode(toks[12:13])
    assert ctx.drop_from(12)  # the decode consumed it; its own 1-token batch leaves nothing valid to roll back


def test_n_ubatch_must_exceed_n_rs_seq_plus_one(paths):
    """llama.cpp keeps a batch's last n_rs_seq + 1 tokens in one ubatch and GGML_ASSERTs (aborting the process)
    when n_ubatch cannot hold them: at the first decode, even of one token. Callers must pick
    n_ubatch >= n_rs_seq + 2. Run in a child process, as it kills its process."""
    script = (
        "import sys, ctypes; sys.path.insert(0, sys.argv[1]);"
        "import test_tiny_recurrent as T, llama_cpp.llama_cpp as ll;"
        "ll.llama_log_set(T._log, ctypes.c_void_p(0)); ll.llama_backend_init();"
        "n = int(sys.argv[3]); c = T.Context(T.Model(sys.argv[2]), n_rs_seq=n, n_batch=64, n_ubatch=n + 1);"
        "c.decode([1]); print('decoded')"
    )
    run = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(paths["lfm2"][0]),
                          str(N_RS_SEQ)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GGML_NO_BACKTRACE": "1"})  # no gdb attaching to print one
    assert run.returncode != 0 and "decoded" not in run.stdout
    assert "n_ubatch > n_keep_tail" in run.stderr
