#!/usr/bin/env bash
# What the tests' Vulkan build (tests/support/vulkan_build.py) needs, installed once per machine (Debian 12, as root
# or with sudo; .ci/run runs it): the Vulkan loader, glslc, SPIR-V headers and Mesa's lavapipe from Debian, and the
# C++ headers of Debian 13's libvulkan-dev, unpacked into the tests' build cache and never installed (Debian 12's
# 1.3.239 lack VK_EXT_layer_settings, which ggml-vulkan uses). Without them the Vulkan tests skip, saying so.
set -euo pipefail
VER=1.4.309  # (vulkan_build.HEADERS_VERSION: where the build looks for them)
DEB=libvulkan-dev_$VER.0-1_amd64.deb
DEST="${SPECCHAT_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specchat-tests}/vulkan-headers-$VER"
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
if ! command -v glslc >/dev/null || [ ! -e /usr/include/vulkan/vulkan.h ] || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json \
    >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq glslc spirv-headers libvulkan-dev mesa-vulkan-drivers \
    >/dev/null
fi
if [ ! -f "$DEST/usr/include/vulkan/vulkan.hpp" ] && [ "$(uname -m)" = x86_64 ]; then
  mkdir -p "$DEST"
  curl -sSf --retry 3 -o "$DEST/$DEB" "https://deb.debian.org/debian/pool/main/v/vulkan-loader/$DEB"
  dpkg-deb -x "$DEST/$DEB" "$DEST" && rm "$DEST/$DEB"
fi
