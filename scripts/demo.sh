#!/usr/bin/env bash
# Builds everything and runs the main job: text generated from SmolLM2 through rocmforge
# (libllama with only libggml-rocmforge.so loaded), tokens/s printed.
#   BUILD_DIR (default build), JOBS (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-model.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
cmake --build "$BUILD_DIR" --target demo
