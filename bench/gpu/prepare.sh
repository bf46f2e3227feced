#!/bin/bash
# Here, before a GPU run: put what the device machine lacks into .gpu/ (ignored by git, carried by the run):
# the pinned llama-cpp-python's sources without what a CUDA build skips (under the 64 MiB a run may carry), and
# wheels of the Python packages the engine needs beyond the machine's image (Python 3.12). See bench/gpu/README.md.
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl /tmp/gpu-sdist
VER=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
SDIST=tests/.cache/llama_cpp_python-$VER.tar.gz
[ -f "$SDIST" ] || python3 -m pip download -q --no-deps --no-binary :all: -d tests/.cache "llama-cpp-python==$VER"
tar xzf "$SDIST" -C /tmp/gpu-sdist
P=llama_cpp_python-$VER; V=$P/vendor/llama.cpp
tar cJf .gpu/llama-cpp-python.tar.xz -C /tmp/gpu-sdist --exclude="$P/.git" --exclude="$P/examples" \
  --exclude="$V/models/*.gguf" --exclude="$V/docs" --exclude="$V/benches" --exclude="$V/tools/ui" \
  --exclude="$V/tools/server/public*" --exclude="$V/.git*" \
  $(for b in opencl sycl vulkan hexagon et webgpu openvino cann; do echo --exclude="$V/ggml/src/ggml-$b"; done) $P
# Wheels for the image's Python 3.12 of everything the steps import, with their dependencies: the engine (gguf,
# platformdirs, llguidance; diskcache, which llama_cpp imports), and for the worker step and tests/gpu_checks.py the
# app's chat runtime, its HTTP client (httpx), its Markdown (markdown-it-py) and the Hub client (huggingface-hub 2).
# Less what the image has (numpy, psutil, jinja2, pyyaml, requests, tqdm, h11, anyio, pytest with xdist and
# pytest-timeout): an image-like Python 3.12 with only those failed to import app.chat.runtime without httpx,
# app.ui.render without markdown-it-py and app.models.downloads without filelock.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu/whl \
  gguf platformdirs "llguidance>=1.9,<2" diskcache "huggingface-hub>=2,<3" httpx "markdown-it-py>=3" jsonschema
for have in numpy psutil jinja2 markupsafe pyyaml requests tqdm h11 anyio charset_normalizer urllib3 certifi; do
  find .gpu/whl -iname "${have}-*.whl" -delete
done
du -sh .gpu
