#!/usr/bin/env bash
# Build the one-folder bundle dist/specchat/ from this checkout with PyInstaller.
#
#   packaging/build.sh                    # fresh build venv under build/venv (compiles llama.cpp, a few minutes)
#   PYTHON=.venv/bin/python packaging/build.sh   # reuse an environment that has `pip install ".[bundle]"`
#   CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DGGML_CUDA=on" packaging/build.sh   # a CUDA (or -DGGML_METAL=on) build
#
# DIST (default dist/) and WORK (default build/pyinstaller/) choose the output and scratch folders.
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${DIST:-dist}
WORK=${WORK:-build/pyinstaller}
if [ -z "${PYTHON:-}" ]; then
  python3 -m venv build/venv
  # GGML_LLAMAFILE=OFF keeps batched verification bit-identical to one-token decoding (see README).
  CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_LLAMAFILE=OFF"} build/venv/bin/pip install --no-cache-dir ".[bundle]"
  PYTHON=build/venv/bin/python
fi
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN --distpath "$DIST" --workpath "$WORK" \
  packaging/specchat.spec
echo "Built $DIST/specchat/specchat  (run it, or packaging/linux/install.sh to add it to your desktop menu)"
