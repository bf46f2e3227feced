#!/bin/bash
# On the device machine (one call of the device tool, after bench/gpu/prepare.sh here; carry .gpu):
#   BUDGET=540 bash bench/gpu/run.sh [STEP ...]   steps: crash worker versus adaptive in-graph loop tests (default: all)
# Builds the pinned llama-cpp-python with CUDA into /tmp/site, and from the same build llama.cpp's own examples
# (llama-simple, llama-speculative-simple) in /tmp/llb/bin (both kept while the machine stays warm), then runs each
# step within BUDGET seconds in all; what each prints lands in $OUT. See bench/gpu/README.md.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site
T0=$(date +%s); END=$((T0 + ${BUDGET:-540}))
left() { echo $(( END - $(date +%s) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.txt"; }
Q='^llama_\|^print_info\|^load\|^common\|^graph_\|^sched_\|^\.\|^ggml_cuda_init\|^  Device'
STEPS=${*:-crash worker versus adaptive in-graph loop tests}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -d /tmp/site/llama_cpp/lib ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
  mkdir -p /tmp/src && tar xJf .gpu/llama-cpp-python.tar.xz -C /tmp/src || exit 1
  log "build"  # (flash attention's kernels left out: SpecChat's contexts turn it off; 250 s on 16 cores)
  CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_LLAMAFILE=OFF -DGGML_CUDA_FA=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 400 python3 -m pip install --no-deps \
    --no-build-isolation --no-compile -C build-dir=/tmp/llb --target /tmp/site /tmp/src/llama_cpp_python-* \
    > "$OUT/build.log" 2>&1 \
    || { log "build FAILED"; tail -30 "$OUT/build.log"; exit 1; }
fi
log "built: $(python3 -c 'import llama_cpp.llama_cpp as ll; print(ll.llama_supports_gpu_offload())' 2>&1 | tail -1)"
for step in $STEPS; do
  case $step in
  crash)  # Model(path, n_gpu_layers=N != 0) segfaulted in llama_model_load_from_file on 2026-11-30, every time, where
          # Model(path, 0) with the plugin setting 999 in the call ran. Each line below changes one thing against the
          # first: numpy's libraries loaded before llama.cpp's, the load through the plugin (both load with 999),
          # llama.cpp's own default logger (stderr) in place of SpecChat's Python callback. Each line's whole output
          # is kept in crash-N.log; its last lines are shown unfiltered (load_tensors, which reads n_gpu_layers,
          # runs right after print_info). Then a native backtrace, with the libraries loaded.
    python3 -c "import sys; sys.path[:0]=['.','tests']; from support.tiny_gguf import write_model as w
w(sys.argv[1])" /tmp/crash.gguf
    DIRECT="from app.engine.llama.model import Model; Model(sys.argv[1], n_gpu_layers=999)"
    PLUGIN="sys.path.insert(0, 'tests'); import support.gpu_offload; ${DIRECT/n_gpu_layers=999/n_gpu_layers=0}"
    STDERR="import llama_cpp.llama_cpp as ll; ll.llama_log_set(ll.llama_log_callback(), None)"
    L="import llama_cpp.llama_cpp"
    n=0
    for case in "$L|$DIRECT|" "import numpy|$DIRECT|" "import numpy|$PLUGIN|" "$L|$PLUGIN|" \
                "$L|$STDERR; $DIRECT|1" "import numpy|$STDERR; $DIRECT|1"; do
      IFS='|' read -r first load logs <<< "$case"; n=$((n + 1))
      how="Model(path, 999)"; [[ $load == *gpu_offload* ]] && how="Model(path, 0) through the plugin (999)"
      [ -n "$logs" ] && how="$how, llama.cpp logging to stderr"
      echo "== $n: $first; then $how"
      SPECCHAT_LLAMA_LOG=$logs timeout 60 python3 -X faulthandler -c \
        "import sys; $first; sys.path.insert(0, '.'); $load; print('ok: it loaded', flush=True)" /tmp/crash.gguf \
        > "$OUT/crash-$n.log" 2>&1
      echo "   exit status $?"; tail -8 "$OUT/crash-$n.log" | cut -c1-200
    done | tee "$OUT/crash.txt"
    GDB=$(command -v cuda-gdb || command -v gdb) && timeout 90 "$GDB" -q -batch -iex "set auto-load safe-path /" \
      -ex run -ex bt -ex "info sharedlibrary" --args python3 -c \
      "import sys; import numpy; sys.path.insert(0, '.'); $DIRECT" /tmp/crash.gguf > "$OUT/crash-gdb.log" 2>&1
    grep -v "^\[New Thread\|^\[Thread" "$OUT/crash-gdb.log" | tail -60 | cut -c1-200 | tee -a "$OUT/crash.txt" ;;
  worker)  # the app's own load path (Model() with -ngl 99, no plugin) in the engine worker, as `specchat serve -ngl 99`
          # loads: it answers, or the load crashes the worker and the pair comes back on the CPU, saying so
    [ -f /tmp/real/draft-q8_0.gguf ] || timeout 240 python3 bench/gpu/realistic_pair.py /tmp/real \
      > "$OUT/real_pair.txt" 2>&1 || { log "realistic pair FAILED"; tail -5 "$OUT/real_pair.txt"; }
    SPECCHAT_HOME=/tmp/home timeout 150 python3 -c "import sys; sys.path.insert(0, '.')
from app.chat.runtime import Runtime; from app.chat.settings import Settings; from app.models.loader import LoadSpec
rt = Runtime(worker=True); rt.load(LoadSpec(target=sys.argv[1], draft=sys.argv[2], ngl=99, ngld=99, ctx=2048))
print('worker: loaded with -ngl', rt.engine.spec.ngl, '| notice:', rt.engine.notice, '| info:', rt.info()['worker'])
for live in rt.answer([{'role': 'user', 'content': 'Name three rivers.'}], Settings(temperature=0, max_tokens=48)):
    pass
print('answer:', repr(live.text[:160]), '| stats:', live.stats.as_dict()); rt.close()" \
      /tmp/real/target-q4_k_m.gguf /tmp/real/draft-q8_0.gguf 2>&1 | grep -v "$Q" | tee "$OUT/worker.txt"
    tail -40 /tmp/home/data/logs/engine-worker.log > "$OUT/worker-log.txt" 2>/dev/null ;;
  versus)  # SpecChat against llama.cpp's C++ loop: same build, files, prompts and draft settings; a 1.5B-shaped
          # Q4_K_M target drafted by itself (100% acceptance) and by a 0.5B-shaped Q8_0 (SpecChat's loads through the
          # plugin, which the crash step's lines tell whether it is needed)
    [ -f /tmp/real/draft-q8_0.gguf ] || timeout 240 python3 bench/gpu/realistic_pair.py /tmp/real \
      > "$OUT/real_pair.txt" 2>&1 || { log "realistic pair FAILED"; tail -5 "$OUT/real_pair.txt"; }
    timeout $(( $(left) - 10 )) python3 bench/gpu/offloaded.py bench/gpu/versus.py --bin /tmp/llb/bin \
      --target /tmp/real/target-q4_k_m.gguf --draft /tmp/real/target-q4_k_m.gguf --draft /tmp/real/draft-q8_0.gguf \
      -n 128 2>&1 | grep -v "$Q" | tee "$OUT/versus.txt" ;;
  in-graph)
    timeout 90 python3 bench/gpu/offloaded.py bench/perf_in_graph_selection.py --tokens 64 --repeats 3 2>&1 \
      | grep -v "$Q" | tee "$OUT/in_graph.txt" ;;
  loop)
    timeout 150 python3 bench/gpu/offloaded.py bench/perf_loop_overhead.py --no-starter --tokens 96 2>&1 \
      | grep -v "$Q" | tee "$OUT/loop.txt" ;;
  adaptive)  # a Gemma-shaped tiny pair: adaptive drafting against speculation off, interleaved
    set -- $(python3 bench/gpu/pair.py /tmp/pair 2>/dev/null | tail -1)
    for draft in "$2" "$3"; do
      timeout $(( $(left) > 130 ? 120 : $(left) - 10 )) python3 bench/gpu/offloaded.py -m app.cli.main bench \
        --target "$1" --draft "$draft" --adaptive --prompts tests/prompts/heldout.jsonl -n 96 --repeats 2 2>&1 \
        | grep -v "$Q" | tail -16 | tee -a "$OUT/adaptive.txt"
    done ;;
  tests)  # what holds on a GPU (tests/gpu_checks.py: the fit, the device, near-ties measured), then the engine's
          # tests with every layer offloaded; near-ties of the random tiny models fail on a GPU. Left out: what needs
          # the starter model (test_structured_output.py; its wheel is beyond what a run carries) or Gradio (hub)
    timeout 200 python3 -m pytest -p no:cacheprovider -n 0 -q -s -rfEs tests/gpu_checks.py 2>&1 | grep -v "$Q" \
      | tee "$OUT/gpu_checks.txt" | grep "identical greedy\|passed\|failed"
    T=$(( $(left) - 10 ))
    SPECCHAT_LLAMA_SDIST="$PWD/.gpu/llama-cpp-python.tar.xz" timeout $T python3 -m pytest -p tests.support.gpu_offload \
      -p no:cacheprovider -p no:benchmark -n 14 --timeout 150 -q -rf \
      -m "not slow and not browser and not bundle" \
      -k "not server and not cli and not api and not hub" --junitxml="$OUT/tests.xml" tests/test_engine.py \
      tests/test_exact_sampling.py tests/test_mtp.py tests/test_eagle3.py tests/test_gemma4_assistant.py \
      tests/test_heads.py \
      tests/test_cross_vocab.py tests/test_recurrent.py tests/test_tiny_recurrent.py tests/test_sliding_window.py \
      tests/test_chains.py tests/test_ngram_kinds.py tests/test_draft_control.py tests/test_acceptance_memory.py \
      tests/test_block_drafters.py tests/test_sampling.py > "$OUT/tests.txt" 2>&1
    log "tests rc=$?"; grep -v "^FAILED" "$OUT/tests.txt" | tail -3 ;;
  esac
  log "$step done"
done
