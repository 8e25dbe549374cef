#!/bin/sh
# The GPU kernels' weight decoders checked on the host, no GPU needed (c_tests/gpu_loaders.cpp):
# kernels/quants.h, quants_iq.h, the i-quants' grids as the library embeds them (written by the
# ignored unit test write_group_sources), mmvq.hip's integer-dot blocks (the file up to its
# first kernel template) and dequant.hip's dequantizing body compiled as plain C++ with c_tests/gpu_host/prelude.h, against ggml's
# dequantization and ggml-cpu's dot products.
#   scripts/check-gpu-loaders.sh BIN_DIR GGML_INCLUDE_DIR
# BIN_DIR holds libggml-base.so and libggml-cpu.so (a CMake build's bin/); CXX (default c++).
set -eu
cd "$(dirname "$0")/.."
bin=$1 inc=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ROCMFORGE_KERNEL_GROUPS_OUT="$out/groups" "${CARGO:-cargo}" test -q --release --lib \
    gpu::kernel_groups::tests::write_group_sources -- --ignored --exact >/dev/null
mkdir "$out/inc"
cp "$out"/groups/headers/*.h c_tests/gpu_host/prelude.h "$out/inc/"
# The blocks end where the first kernel template over a block type begins.
awk '/^template <typename T[,>]/ { exit } !/^#include "/' kernels/mmvq.hip >"$out/inc/mq_blocks.h"
awk '/^#define DEQUANT_ARGS/ { exit } !/^#include "/' kernels/dequant.hip >"$out/inc/dequant_body.h"
"${CXX:-c++}" -O1 -std=c++17 -w -I"$out/inc" -I"$inc" c_tests/gpu_loaders.cpp -o "$out/gpu_loaders" \
    -L"$bin" -lggml-cpu -lggml-base -Wl,-rpath,"$bin"
"$out/gpu_loaders"
