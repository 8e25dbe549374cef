#!/bin/bash
# One device call for the token-generation work (run from the repository root on the GPU
# machine, with .device-carry/common and .device-carry/gpu-tg carried):
#   STEPS="membw ops bench prof ncu 8b" bash .device-carry/gpu-tg/gpu_tg_call.sh
# new.so = this branch's library, common/bin/libggml-rocmforge.so = main's (baseline).
set -u
C=$PWD/.device-carry/common; M=$PWD/.device-carry/gpu-tg; B=$C/bin
export LD_LIBRARY_PATH=$B ROCMFORGE_CACHE_DIR=/tmp/rfc
NEW=$M/new.so; BASE=$B/libggml-rocmforge.so
STEPS=${STEPS:-"membw ops bench prof"}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
$B/make_model --preset smollm2 --tokenizer $C/smol-tokenizer.gguf -o /tmp/smol.gguf 2>&1 | tail -1
bench() { # LABEL SO MODEL [env...]
    local label=$1 so=$2 model=$3; shift 3
    env "$@" $B/llama_run bench -b rocmforge -l $so -m $model --device RFGPU0 --fa on -t 8 --pp ${PP:-512} --tg 128 --reps ${REPS:-3} 2>$OUT/bench-$label.err | sed "s/^/$label: /"
}
if has membw; then
    nvcc -O3 -arch=sm_90 -o /tmp/gpu_membw $M/gpu_membw.cu && /tmp/gpu_membw
fi
if has ops; then
    ( time RF_TEST_BIN_DIR=$B RF_TEST_LIB=$NEW timeout 150 $B/test_ops --gpus ) > $OUT/test_ops.log 2>&1; echo "test_ops rc=$?"
    grep -E "FAIL|passed|failed|real" $OUT/test_ops.log | tail -12
fi
if has fusecmp; then  # fusion must not change a single bit: same greedy text with and without
    for f in 1 0; do ROCMFORGE_GPU_FUSE=$f ROCMFORGE_GPU_DUMP=$f $B/llama_run generate -b rocmforge -l $NEW -m /tmp/smol.gguf --device RFGPU0 --fa on -t 8 -p "Once upon a time" -n 48 > /tmp/gen-$f.txt 2>$OUT/gen-$f.err; echo "generate fuse=$f rc=$? $(md5sum < /tmp/gen-$f.txt)"; done
    cmp /tmp/gen-1.txt /tmp/gen-0.txt && echo "fusecmp: identical text"
    $B/llama_run generate -b rocmforge -l $BASE -m /tmp/smol.gguf --device RFGPU0 --fa on -t 8 -p "Once upon a time" -n 48 > /tmp/gen-base.txt 2>/dev/null
    cmp /tmp/gen-1.txt /tmp/gen-base.txt && echo "new vs main: identical text" || { echo "new vs main text:"; head -c 300 /tmp/gen-1.txt; echo; head -c 300 /tmp/gen-base.txt; echo; }
    grep -A 90 "graph of" $OUT/gen-1.err | head -92 > $OUT/graph-dump.txt
fi
if has bench; then  # interleaved: the host's speed drifts between runs
    for r in 1 2; do
        bench base$r $BASE /tmp/smol.gguf
        bench new$r $NEW /tmp/smol.gguf
    done
    bench new-nofuse $NEW /tmp/smol.gguf ROCMFORGE_GPU_FUSE=0
fi
if has prof; then
    PP=16 REPS=1 bench prof-new $NEW /tmp/smol.gguf ROCMFORGE_GPU_PROFILE=1 >/dev/null
    grep -A 28 "kernel profile" $OUT/bench-prof-new.err | head -30
fi
if has ncu; then
    timeout 100 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --launch-skip ${NCU_SKIP:-1200} --launch-count ${NCU_COUNT:-300} \
        env ROCMFORGE_GPU_GRAPHS=0 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/smol.gguf --device RFGPU0 --fa on -t 8 --pp 16 --tg 8 --reps 1 > $OUT/ncu.csv 2>$OUT/ncu.err
    echo "ncu rc=$?"
    python3 - $OUT/ncu.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    try: t = float(r[v].replace(",", ""))
    except ValueError: continue
    a = agg[r[k].split("(")[0]]; a[0] += 1; a[1] += t
tot = sum(a[1] for a in agg.values()); n = sum(a[0] for a in agg.values())
print(f"ncu: {n} kernels, {tot/1e3:.1f} us total, {tot/max(n,1):.0f} ns each")
for name, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:14]:
    print(f"  {t/1e3:8.1f} us {c:5d} x {t/c:7.0f} ns  {name}")
PY
fi
if has diag; then  # host vs GPU: threads, graphs; GPU time of one generated token (ncu, clocks free)
    bench new-t1 $NEW /tmp/smol.gguf
    THR=1; $B/llama_run bench -b rocmforge -l $NEW -m /tmp/smol.gguf --device RFGPU0 --fa on -t 1 --pp 64 --tg 128 --reps 3 2>/dev/null | sed "s/^/new -t 1: /"
    ROCMFORGE_GPU_GRAPHS=0 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/smol.gguf --device RFGPU0 --fa on -t 8 --pp 64 --tg 128 --reps 3 2>/dev/null | sed "s/^/new graphs=0: /"
    timeout 100 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 --launch-count 400 \
        env ROCMFORGE_GPU_GRAPHS=0 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/smol.gguf --device RFGPU0 --fa on -t 8 --pp 8 --tg 16 --reps 1 > $OUT/ncu.csv 2>$OUT/ncu.err
    python3 - $OUT/ncu.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value")
agg = collections.defaultdict(lambda: [0, 0.0]); n = 0
for r in rows[1:]:
    t = float(r[v].replace(",", "")); a = agg[r[k].split("(")[0]]; a[0] += 1; a[1] += t
tot = sum(a[1] for a in agg.values()); n = sum(a[0] for a in agg.values())
print(f"ncu (clocks free): {n} kernels, {tot/1e3:.1f} us, {tot/max(n,1):.0f} ns each; per layer-token ~ {tot/max(n,1)*13/1e3:.1f} us")
for name, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:10]:
    print(f"  {t/1e3:8.1f} us {c:5d} x {t/c:7.0f} ns  {name}")
PY
fi
if has 8b; then
    ( time $B/make_model --preset 8b --type q4_0 --tokenizer $C/smol-tokenizer.gguf -o /tmp/8b.gguf ) 2>&1 | tail -4
    ls -la /tmp/8b.gguf
    PP=${PP8:-64} REPS=2 bench 8b-new $NEW /tmp/8b.gguf
    if has 8bnofuse; then PP=${PP8:-64} REPS=2 bench 8b-nofuse $NEW /tmp/8b.gguf ROCMFORGE_GPU_FUSE=0; fi
    if has 8bncu; then  # achieved DRAM bandwidth of the 8B matrix-vector kernels (clocks not locked)
        timeout 90 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:mul_mat_vec_q --launch-skip 200 --launch-count 16 \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv \
            env ROCMFORGE_GPU_GRAPHS=0 $B/llama_run bench -b rocmforge -l $NEW -m /tmp/8b.gguf --device RFGPU0 --fa on -t 8 --pp 8 --tg 4 --reps 1 > $OUT/ncu8b.csv 2>$OUT/ncu8b.err
        echo "ncu8b rc=$?"
        python3 - $OUT/ncu8b.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; k = h.index("Kernel Name"); m = h.index("Metric Name"); v = h.index("Metric Value"); g = h.index("Grid Size"); i = h.index("ID")
per = collections.defaultdict(dict)
for r in rows[1:]:
    per[(r[i], r[k].split("(")[0], r[g])][r[m]] = float(r[v].replace(",", ""))
for (id_, name, grid), d in list(per.items())[:16]:
    t = d.get("gpu__time_duration.sum", 0); b = d.get("dram__bytes_read.sum", 0)
    print(f"  {name:28s} grid {grid:14s} {t/1e3:7.1f} us {b/1e6:8.2f} MB {b/max(t,1):7.1f} GB/s  {d.get('dram__throughput.avg.pct_of_peak_sustained_elapsed',0):.0f}% peak")
PY
    fi
    if has 8bbase; then PP=${PP8:-64} REPS=2 bench 8b-base $BASE /tmp/8b.gguf; fi
fi
