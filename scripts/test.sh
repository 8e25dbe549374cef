#!/usr/bin/env bash
# Configures and builds rocmforge with the real ggml (pinned in ggml-pin/), then runs every test:
# the C tests against ggml (ctest) and the Rust unit tests.
#   scripts/test.sh [extra ctest args]      BUILD_DIR (default build), JOBS (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
