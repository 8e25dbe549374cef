#!/usr/bin/env bash
# Runs every test: installs what is missing (cmake, ninja, hipcc for the AMD kernel check,
# when run as root with apt), fetches the test model, configures and builds rocmforge with the
# real ggml (pinned in ggml-pin/), then ctest: the C tests against ggml, the end-to-end model
# test, the GPU tests (they skip without a GPU) and the Rust unit tests.
#   scripts/test.sh [extra ctest args]      BUILD_DIR (default build), JOBS (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-model.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
# The end-to-end tests write models and logits under the build folder: say how much room there is.
df -h "$BUILD_DIR" | tail -n 1
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
