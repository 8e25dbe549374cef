#!/usr/bin/env bash
# An 8B-class llama (Llama-3-8B shapes: 32 layers, 4096 wide, GQA 32/8, FFN 14336; SmolLM2's
# 49152-token vocabulary; random Q4_0 weights) through ggml's CPU backend and RFCPU back to back:
# tg tokens/s for both, and the share of the machine's measured read bandwidth that it reaches
# (every weight except the embedding table is read once per generated token).
#   bench/cpu_8b.sh [THREADS]        (build first; writes models/llama-8b-q4_0.gguf, 4.2 GB, once)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
bin=build/bin
model=models/llama-8b-q4_0.gguf
[ -x "$bin/llama_run" ] && [ -x "$bin/membw" ] || { echo "build first (scripts/demo.sh)"; exit 1; }
[ -f "$model" ] || "$bin/make_model" --preset 8b --tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf -o "$model" --type q4_0
bw=$("$bin/membw" "$threads" 2048 | sed -n 's/.*read=\([0-9.]*\) GB\/s/\1/p')
# Weight bytes per token: the file less the embedding table (49152 rows of 4096 Q4_0 values).
bytes=$(( $(stat -c %s "$model") - 49152 * 4096 * 18 / 32 ))
run() { "$bin/llama_run" bench -b "$1" -l "$2" -m "$model" -t "$threads" --pp "${PP:-32}" --tg "${TG:-16}" --reps "${REPS:-2}" 2>/dev/null; }
ref=$(run ggml-cpu "$bin/libggml-cpu.so")
rf=$(run rocmforge "$bin/libggml-rocmforge.so")
echo "$ref"
echo "$rf"
python3 - "$ref" "$rf" "$bw" "$bytes" <<'PY'
import sys
def parse(s): return {k: v for k, v in (kv.split("=") for kv in s.split())}
a, b, bw, nbytes = parse(sys.argv[1]), parse(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"memory read bandwidth {bw:.1f} GB/s, {nbytes / 1e9:.2f} GB of weights read per token")
for k in a:
    if k.startswith(("pp", "tg")):
        line = f"{k}: ggml-cpu {float(a[k]):7.2f} t/s | rocmforge {float(b[k]):7.2f} t/s | ratio {float(b[k]) / float(a[k]):.2f}x"
        if k.startswith("tg"):
            line += f" | bandwidth used: ggml-cpu {float(a[k]) * nbytes / 1e9 / bw:.0%}, rocmforge {float(b[k]) * nbytes / 1e9 / bw:.0%}"
        print(line)
PY
