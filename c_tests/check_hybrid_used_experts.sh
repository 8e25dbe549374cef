#!/usr/bin/env bash
# RFHYBRID streams only the experts a batch's ids name (src/hybrid/experts.rs): one layer of
# Qwen3-30B-A3B's shapes (128 experts of 768 x 2048, Q4_0) on RFHYBRID over the stand-in GPU, every
# node on the GPU (ROCMFORGE_HYBRID_STRATEGY=gpu-only) with a budget that streams the experts, end to
# end against ggml-cpu; the debug log must show a prompt's experts streamed by their ids.
#   check_hybrid_used_experts.sh MAKE_MODEL TEST_LLAMA_E2E LLAMA_RUN LIB LIBGGML_CPU TOKENIZER_SRC.gguf
set -euo pipefail
mk=$1 e2e=$2 run=$3 lib=$4 cpu=$5 tok=$6
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$mk" --preset moe --layers 1 --type q4_0 --threads 2 --tokenizer "$tok" -o "$dir/moe1.gguf" >/dev/null 2>&1
mkdir -p "$dir/out"
ROCMFORGE_DEBUG=1 ROCMFORGE_HYBRID_FAKE_GPU=1 ROCMFORGE_HYBRID_STRATEGY=gpu-only ROCMFORGE_HYBRID_VRAM=700MiB \
    "$e2e" "$run" "$lib" "$cpu" "$dir/moe1.gguf" "$dir/out" --fa on --threads 2 --min-stable 0 --device RFHYBRID
lines=$(cat "$dir"/out/* 2>/dev/null | grep -a -o -E "RFHYBRID: .[^ ]+. streams [0-9]+ of 128 experts" || true)
[ -n "$lines" ] || { echo "FAIL: no batch streamed its experts by their ids"; exit 1; }
echo "$lines" | sort | uniq -c
