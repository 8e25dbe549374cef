#!/usr/bin/env bash
# RFHYBRID replays a split graph that repeats from its last run's script (src/hybrid/backend/
# script.rs): each GPU segment's copies in and launch, each CPU segment's copies out, the residency
# map's state after. Two layers of Qwen3-30B-A3B's shapes on RFHYBRID over the stand-in GPU with a
# budget that leaves the experts in host memory (a token: GPU, CPU, GPU, ... segments). End to end
# against ggml-cpu with scripts on; then every greedy step's logits with scripts must equal those
# without (ROCMFORGE_HYBRID_SCRIPTS=0) to the bit, twice over a prompt after tokens (the token's
# graph comes back after the prompt's), and the host-time report must show replays taken.
#   check_hybrid_scripts.sh MAKE_MODEL TEST_LLAMA_E2E LLAMA_RUN LIB LIBGGML_CPU TOKENIZER_SRC.gguf
set -euo pipefail
mk=$1 e2e=$2 run=$3 lib=$4 cpu=$5 tok=$6
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$mk" --preset moe --layers 2 --type q4_0 --threads 2 --tokenizer "$tok" -o "$dir/moe2.gguf" >/dev/null 2>&1
export ROCMFORGE_HYBRID_FAKE_GPU=1 ROCMFORGE_HYBRID_VRAM=600MiB ROCMFORGE_HYBRID_SPLIT_EXPERTS=0 \
    ROCMFORGE_HYBRID_TRIAL=0 ROCMFORGE_FFI_TIMING=1
mkdir -p "$dir/out"
"$e2e" "$run" "$lib" "$cpu" "$dir/moe2.gguf" "$dir/out" --fa on --threads 2 --min-stable 0 --device RFHYBRID
for s in 1 0; do
    LLAMA_RUN_GEN_LOGITS="$dir/gen$s.bin" ROCMFORGE_HYBRID_SCRIPTS=$s "$run" logits -b rocmforge -l "$lib" \
        -m "$dir/moe2.gguf" -o "$dir/logits$s.bin" --positions 16 --gen 24 -t 2 --fa off --device RFHYBRID \
        >"$dir/run$s.log" 2>&1 || { cat "$dir/run$s.log"; exit 1; }
done
n=$(grep -a -o "split graphs replayed [0-9]*" "$dir/run1.log" | grep -o "[0-9]*$" | head -1)
[ "${n:-0}" -gt 0 ] || { echo "FAIL: no split graph was replayed"; grep -a "split graphs" "$dir/run1.log"; exit 1; }
if grep -a -q "split graphs replayed [1-9]" "$dir/run0.log"; then echo "FAIL: replayed with ROCMFORGE_HYBRID_SCRIPTS=0"; exit 1; fi
cmp "$dir/gen1.bin" "$dir/gen0.bin" || { echo "FAIL: the replays changed a greedy step's logits"; exit 1; }
cmp "$dir/logits1.bin" "$dir/logits0.bin" || { echo "FAIL: the replays changed the logits"; exit 1; }
# A plan trial's turns record and replay too (each plan recorded again after a swap; a forced trial's turns of
# two runs end before a replay): the same bits (both devices are RFCPU's kernels here, so no plan changes them).
LLAMA_RUN_GEN_LOGITS="$dir/gent.bin" ROCMFORGE_HYBRID_TRIAL=force "$run" logits -b rocmforge -l "$lib" \
    -m "$dir/moe2.gguf" -o "$dir/logitst.bin" --positions 16 --gen 24 -t 2 --fa off --device RFHYBRID \
    >"$dir/runt.log" 2>&1 || { cat "$dir/runt.log"; exit 1; }
t=$(grep -a -o "recorded [0-9]*" "$dir/runt.log" | grep -o "[0-9]*$" | head -1)
[ "${t:-0}" -gt 1 ] || { echo "FAIL: no split graph recorded during a plan trial"; exit 1; }
cmp "$dir/gent.bin" "$dir/gen0.bin" || { echo "FAIL: replays in a plan trial changed a greedy step's logits"; exit 1; }
# Prompts after tokens (the token's graph comes back after each prompt's): the same tokens.
for s in 1 0; do
    ROCMFORGE_HYBRID_SCRIPTS=$s "$run" bench -b rocmforge -l "$lib" -m "$dir/moe2.gguf" --pp 8 --tg 12 --reps 3 \
        -t 2 --fa off --device RFHYBRID >"$dir/bench$s.log" 2>&1 || { cat "$dir/bench$s.log"; exit 1; }
done
m=$(grep -a -o "split graphs replayed [0-9]*" "$dir/bench1.log" | grep -o "[0-9]*$" | head -1)
[ "${m:-0}" -gt 0 ] || { echo "FAIL: no replay in the bench run"; exit 1; }
echo "PASS: $n split graphs replayed, logits equal to the walked run's; $t recorded during a plan trial; $m replays over 3 prompt/generation rounds"
