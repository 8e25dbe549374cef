#!/usr/bin/env bash
# RFHYBRID runs two plans of a repeated graph against each other and keeps the faster
# (src/hybrid/trial.rs): SmolLM2 end to end on RFHYBRID over the stand-in GPU with a budget that
# leaves part of the weights in host memory, the second candidate forced to the CPU-first plan
# (ROCMFORGE_HYBRID_TRIAL=force), against ggml-cpu (strict: the plan swapped between runs of one
# graph changes no token). The debug log must show the trial start, the swap and its end.
#   check_hybrid_trial.sh TEST_LLAMA_E2E LLAMA_RUN LIB LIBGGML_CPU MODEL
set -euo pipefail
e2e=$1 run=$2 lib=$3 cpu=$4 model=$5
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ROCMFORGE_DEBUG=1 ROCMFORGE_HYBRID_FAKE_GPU=1 ROCMFORGE_HYBRID_VRAM=48MiB ROCMFORGE_HYBRID_TRIAL=force \
    "$e2e" "$run" "$lib" "$cpu" "$model" "$dir" --fa on --threads 2 --strict --device RFHYBRID
log=$(cat "$dir"/* 2>/dev/null | grep -a "RFHYBRID: graph " || true)
started=$(echo "$log" | grep -c "two plans to try" || true)
swapped=$(echo "$log" | grep -c "swapped plans" || true)
ended=$(echo "$log" | grep -c -E "the (first|second) plan, the faster, stays" || true)
echo "trials started: $started, swaps: $swapped, trials ended: $ended"
[ "$started" -gt 0 ] || { echo "FAIL: no trial started"; exit 1; }
[ "$swapped" -gt 0 ] || { echo "FAIL: the plans were never swapped"; exit 1; }
[ "$ended" -gt 0 ] || { echo "FAIL: no trial ended"; exit 1; }
echo PASS
