#!/bin/bash
# gpu-mv device call 2: test_ops, e2e with BLAS off for prompts (rounding hypothesis), 8B one-column kernel shape sweep (ncu) + tg.
set -u
C=$PWD/.device-carry/common; M=$PWD/.device-carry/gpu-mv; B=$C/bin
export LD_LIBRARY_PATH=$B ROCMFORGE_CACHE_DIR=/tmp/rfc
NEW=$M/new.so; BASE=$B/libggml-rocmforge.so
( $B/make_model --preset 8b --type q4_0 --tokenizer $C/smol-tokenizer.gguf -o /tmp/8b.gguf > $OUT/make8b.log 2>&1 ) &
P8=$!
( time RF_TEST_BIN_DIR=$B RF_TEST_LIB=$NEW timeout 130 $B/test_ops --gpus ) > $OUT/test_ops.txt 2>&1; echo "test_ops rc=$?"
grep -E "FAIL|passed|failed|real" $OUT/test_ops.txt | tail -6
mkdir -p /tmp/e2e
for spec in qwen3moe:q4_0 llama:q6_k; do
  a=${spec%:*} t=${spec#*:}; m=/tmp/e2e/$a-$t.gguf; mkdir -p /tmp/e2e/$a-$t
  $B/make_model --arch $a --type $t --tokenizer $C/smol-tokenizer.gguf -o $m 2>/dev/null
  ROCMFORGE_GPU_BLAS_MIN_COLS=100000 timeout 40 $B/test_llama_e2e $B/llama_run $NEW $B/libggml-cpu.so $m /tmp/e2e/$a-$t --fa both --threads 8 --min-stable 0 --device RFGPU0 > $OUT/e2e-noblas-$a-$t.log 2>&1
  echo "e2e noblas $spec rc=$? $(grep -E '^fa=' $OUT/e2e-noblas-$a-$t.log | cut -c1-200 | tr '\n' ' ')"
done
wait $P8; tail -1 $OUT/make8b.log
for cfg in 2,4,4 2,4,2 2,4,8 1,4,4 1,8,4 1,8,2 2,8,4 4,4,4 4,2,4 4,4,2; do
  ROCMFORGE_GPU_MV1=$cfg timeout 40 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:"mul_mat_vec_q" --launch-skip 300 --launch-count 6 \
    --metrics gpu__time_duration.sum --csv \
    env ROCMFORGE_GPU_GRAPHS=0 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/8b.gguf --device RFGPU0 --fa on -t 8 --pp 8 --tg 3 --reps 1 > $OUT/ncu-$cfg.csv 2>/dev/null
  python3 - $OUT/ncu-$cfg.csv $cfg <<'PY' | tee -a $OUT/sweep.txt
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(sys.argv[2], "no data"); sys.exit()
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value"); g = h.index("Grid Size")
out = []; tot = 0.0
for r in rows[1:]:
    t = float(r[v].replace(",", "")) / 1e3; tot += t
    out.append(f"{r[k].split('(')[0].replace('mul_mat_vec_q','mvq')}{r[g]}={t:.1f}")
print(f"cfg {sys.argv[2]}: layer mat-vec {tot:.1f} us | " + " ".join(out))
PY
done
BEST=$(grep "^cfg" $OUT/sweep.txt | sort -t' ' -k5 -g | head -1 | cut -d' ' -f2 | tr -d :)
echo "best by ncu: $BEST"
for cfg in 2,4,4 $BEST; do
  ROCMFORGE_GPU_MV1=$cfg timeout 40 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/8b.gguf --device RFGPU0 --fa on -t 8 --pp 16 --tg 64 --reps 2 2>/dev/null | sed "s/^/8b cfg $cfg: /"
done
