#!/usr/bin/env bash
# RFHYBRID shares a small batch's expert chain (gate, up, GLU, down) between the CPU and the GPU
# (src/hybrid/backend/split_experts.rs): two layers of Qwen3-30B-A3B's shapes (128 experts of
# 768 x 2048, Q4_0) on RFHYBRID over the stand-in GPU with a budget that leaves the experts in host
# memory. End to end against ggml-cpu with the split; then every greedy step's logits with the split
# must equal those without it to the bit (both halves are RFCPU's kernels here, so a column merged
# from the wrong place, or left stale, shows), and the debug log must show chains split.
#   check_hybrid_split_experts.sh MAKE_MODEL TEST_LLAMA_E2E LLAMA_RUN LIB LIBGGML_CPU TOKENIZER_SRC.gguf
set -euo pipefail
mk=$1 e2e=$2 run=$3 lib=$4 cpu=$5 tok=$6
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$mk" --preset moe --layers 2 --type q4_0 --threads 2 --tokenizer "$tok" -o "$dir/moe2.gguf" >/dev/null 2>&1
export ROCMFORGE_DEBUG=1 ROCMFORGE_HYBRID_FAKE_GPU=1 ROCMFORGE_HYBRID_VRAM=600MiB
mkdir -p "$dir/out"
ROCMFORGE_HYBRID_SPLIT_EXPERTS=2 "$e2e" "$run" "$lib" "$cpu" "$dir/moe2.gguf" "$dir/out" --fa off --threads 2 \
    --min-stable 0 --device RFHYBRID
for sp in 2 0; do
    LLAMA_RUN_GEN_LOGITS="$dir/gen$sp.bin" ROCMFORGE_HYBRID_SPLIT_EXPERTS=$sp "$run" logits -b rocmforge -l "$lib" \
        -m "$dir/moe2.gguf" -o "$dir/logits$sp.bin" --positions 16 --gen 8 -t 2 --fa off --device RFHYBRID \
        >"$dir/run$sp.log" 2>&1 || { cat "$dir/run$sp.log"; exit 1; }
done
n=$(grep -a -c "experts split" "$dir/run2.log" || true)
[ "$n" -gt 0 ] || { echo "FAIL: no expert chain was split"; exit 1; }
if grep -a -q "experts split" "$dir/run0.log"; then echo "FAIL: split with ROCMFORGE_HYBRID_SPLIT_EXPERTS=0"; exit 1; fi
cmp "$dir/gen2.bin" "$dir/gen0.bin" || { echo "FAIL: the split changed a greedy step's logits"; exit 1; }
cmp "$dir/logits2.bin" "$dir/logits0.bin" || { echo "FAIL: the split changed the logits"; exit 1; }
echo "PASS: $n chains split, logits equal to the unsplit run's"
