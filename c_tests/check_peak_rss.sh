#!/usr/bin/env bash
# Peak resident memory of a whole SmolLM2 run (load, 512-token context, 64 generated tokens)
# with only rocmforge loaded stays within 10% of the same run with only ggml's CPU backend.
#   check_peak_rss.sh LLAMA_RUN ROCMFORGE_LIB GGML_CPU_LIB MODEL
set -euo pipefail
run=$1 rf=$2 ggml=$3 model=$4
prompt=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40))
rss() {
    "$run" generate -b "$1" -l "$2" -m "$model" -p "$prompt" -n 64 -t 2 2>/dev/null |
        sed -n 's/.*peak RSS \([0-9]*\) KiB.*/\1/p'
}
ref=$(rss ggml-cpu "$ggml")
ours=$(rss rocmforge "$rf")
[ -n "$ref" ] && [ -n "$ours" ] || { echo "no peak RSS line from llama_run"; exit 1; }
echo "peak RSS: ggml-cpu $ref KiB, rocmforge $ours KiB, ratio $(awk -v a="$ours" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')"
awk -v a="$ours" -v b="$ref" 'BEGIN{exit !(a <= 1.10 * b)}' || { echo "FAIL: more than 10% above ggml-cpu"; exit 1; }
