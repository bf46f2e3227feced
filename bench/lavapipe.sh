#!/usr/bin/env bash
# Benchmark (not a test): the pinned llama.cpp built for Vulkan on a machine without a GPU, run on Mesa's lavapipe (a
# Vulkan device that runs on the CPU), so the offload path (Model(n_gpu_layers=N), the fit, a GPU device,
# batch_invariant false) can be exercised here. Prints the build's time, the device llama.cpp sees, and what a
# verification batch does to the logits with every layer offloaded (bench/batch_invariance.py --ngl 999).
#
#   bash bench/lavapipe.sh            (as root on Debian 12; the build lands in $SITE, default /tmp/vk-site)
#
# Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which ggml-vulkan.cpp uses (vk::LayerSettingEXT),
# so the build takes the C++ headers of Debian 13's libvulkan-dev (1.4.309), unpacked beside it and never installed:
# the loader and glslc stay Debian 12's.
set -euo pipefail
cd "$(dirname "$0")/.."
VER=0.3.36
SITE=${SITE:-/tmp/vk-site}
HEADERS=${HEADERS:-/tmp/vk-headers}
PY=${PY:-.venv/bin/python}
DEB=libvulkan-dev_1.4.309.0-1_amd64.deb

DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glslc spirv-headers mesa-vulkan-drivers libvulkan-dev \
  vulkan-tools >/dev/null
if [ ! -f "$HEADERS/usr/include/vulkan/vulkan.hpp" ]; then
  mkdir -p "$HEADERS"
  curl -sSf -o "$HEADERS/$DEB" "http://deb.debian.org/debian/pool/main/v/vulkan-loader/$DEB"
  dpkg-deb -x "$HEADERS/$DEB" "$HEADERS"
fi
vulkaninfo --summary 2>/dev/null | grep -E "deviceName|deviceType" || true
sdist=tests/.cache/llama_cpp_python-$VER.tar.gz
[ -f "$sdist" ] || "$PY" -m pip download -q --no-deps --no-binary :all: -d tests/.cache "llama-cpp-python==$VER"
start=$(date +%s)
CMAKE_ARGS="-DGGML_VULKAN=on -DGGML_LLAMAFILE=OFF -DVulkan_INCLUDE_DIR=$HEADERS/usr/include" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -q --no-deps --no-cache-dir --target "$SITE" "$sdist" \
  > /tmp/vk-build.log 2>&1 || { echo "build FAILED after $(( $(date +%s) - start )) s"; tail -30 /tmp/vk-build.log; exit 1; }
echo "build: $(( $(date +%s) - start )) s on $(nproc) cores"
PYTHONPATH="$SITE" "$PY" - <<'EOF'
from app.engine.llama import backend
print("offload:", backend.supports_gpu_offload(), "devices:", backend.devices())
EOF
PYTHONPATH="$SITE" timeout 900 "$PY" bench/batch_invariance.py --ngl 999
# Greedy answers with speculation against plain decoding, every layer on lavapipe: the share identical.
PYTHONPATH="$SITE" timeout 1200 "$PY" - <<'PYEOF'
import json, subprocess, sys
prompts = [json.loads(line)["prompt"] for line in open("tests/prompts/chat.jsonl")][:6]
same = 0
for p in prompts:
    out = {}
    for drafter in ("none", "model"):
        run = subprocess.run([sys.executable, "-m", "app", "generate", "--pair", "starter", "-ngl", "all", "-ngld",
                              "all", "--drafter", drafter, "--temperature", "0", "-n", "64", "--json", "-p", p],
                             capture_output=True, text=True, timeout=600)
        out[drafter] = json.loads(run.stdout)
    ids = [out[d]["token_ids"] for d in ("none", "model")]
    first = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), None)
    same += ids[0] == ids[1]
    print(f"accepted {out['model']['n_accepted']}/{out['model']['n_drafted']}, batch_invariant "
          f"{out['model']['batch_invariant']}, identical {ids[0] == ids[1]}"
          + ("" if first is None else f" (first difference at token {first})"))
print(f"identical greedy answers on lavapipe: {same} of {len(prompts)}")
PYEOF
