#!/usr/bin/env bash
# Builds rocmforge with the real ggml and runs examples/simple_graph: a small MLP on RFCPU
# (loaded like any ggml backend) and on ggml's own CPU backend, with results and timings.
#   BUILD_DIR (default build), JOBS (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
cmake --build "$BUILD_DIR" --target demo
