#!/usr/bin/env bash
# Benchmark (not a test): the pinned llama.cpp built for Vulkan on a machine without a GPU and run on Mesa's lavapipe
# (a Vulkan device that runs on the CPU): the device llama.cpp sees, then what a verification batch does to the
# logits with every layer offloaded (bench/batch_invariance.py --ngl 999). The build is the tests' own
# (tests/support/vulkan_build.py, cached; tests/test_vulkan_offload.py runs the engine's tests and tests/gpu_checks.py
# on it in every run), and so is the set-up (tests/support/vulkan_setup.sh: Debian 12 as root, or sudo).
#
#   bash bench/lavapipe.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
bash tests/support/vulkan_setup.sh
start=$(date +%s)
LIB=$("$PY" -c "import sys; sys.path.insert(0, 'tests'); from support import vulkan_build as v; print(v.libs())")
echo "Vulkan build: $LIB ($(( $(date +%s) - start )) s; cached after the first)"
export LLAMA_CPP_LIB_PATH=$LIB MTMD_CPP_LIB=$LIB GGML_VK_VISIBLE_DEVICES=0
"$PY" -c "from app.engine.llama import backend; print('offload:', backend.supports_gpu_offload(), backend.devices())"
timeout 900 "$PY" bench/batch_invariance.py --ngl 999
