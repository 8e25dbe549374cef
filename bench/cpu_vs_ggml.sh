#!/usr/bin/env bash
# RFCPU against ggml's own CPU backend, back to back in one invocation, same model, same threads.
# Prints pp/tg tokens/s for both and the ratio rocmforge/ggml-cpu.
#   bench/cpu_vs_ggml.sh [MODEL] [THREADS]     (build first: scripts/demo.sh or scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
bin=build/bin
[ -x "$bin/llama_run" ] || { echo "build first (scripts/demo.sh)"; exit 1; }
run() { "$bin/llama_run" bench -b "$1" -l "$2" -m "$model" -t "$threads" --pp "${PP:-512}" --tg "${TG:-128}" --reps "${REPS:-3}" 2>/dev/null; }
ref=$(run ggml-cpu "$bin/libggml-cpu.so")
rf=$(run rocmforge "$bin/libggml-rocmforge.so")
echo "$ref"
echo "$rf"
python3 - "$ref" "$rf" <<'PY'
import sys
def parse(s): return {k: v for k, v in (kv.split("=") for kv in s.split())}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
for k in a:
    if k.startswith(("pp", "tg")):
        print(f"{k}: ggml-cpu {float(a[k]):8.2f} t/s | rocmforge {float(b[k]):8.2f} t/s | ratio {float(b[k])/float(a[k]):.2f}x")
PY
