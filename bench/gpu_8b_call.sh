#!/bin/bash
# Device call for 8B-class token generation (sessions 5-6): correctness (test_ops --gpus,
# gpu_smoke, test_gpu_io), the 8B tg against ggml-cuda interleaved, sweeps of measuring knobs,
# the in-stream profile and an ncu window of one layer's kernels.
# Carry .device-carry/common (bin/, smol-tokenizer.gguf)
# and .device-carry/cuda (libggml-cuda.so.xz: `bench/gpu_vs_ggml_cuda.sh build` on the device from
# the pinned sources, stripped, brought back through $OUT, compressed here to fit the 64 MiB carry).
#   STEPS="ops smoke 8b smol" bash bench/gpu_8b_call.sh   (AB=0: without the A/B runs of 8b / smol)
# Steps: ops (test_ops --gpus), smoke (gpu_smoke, test_gpu_io), 8b / smol (tg and pp against
# ggml-cuda, fa on and off, interleaved, and without the projection+add+norm launch), glupf (gate/up
# prefetch budget sweep), warps (block sizes of the add+norm and gate/up launches), e2e (synthetic
# llama-family models on RFGPU0 against ggml-cpu), detail (ncu sections of the norm and attention
# kernels, attention split modes), prof (in-stream profile and an ncu window of one layer), fav
# (generation attention: blocks per SM of the KV-head-grouped kernel, 0 = the row kernel, the build before
# as bin/libggml-rocmforge-base.so where carried), depth (pp512 and tg after 2048 tokens of context, SmolLM2
# and 8B; with AB=1 also the build before and the attention variants), q8 (Q8_0 caches, fa on: SmolLM2 and 8B,
# depth 0, and 2048 for 8B), ffi (host time inside rocmforge per generated token: ROCMFORGE_FFI_TIMING
# with tg 0 and tg 256, SmolLM2-shaped; subtract), skip (tg64 of the 8B-class model with each fused kernel's launches
# left out: its cost inside the replayed graph), staging (small writes staged, not staged, the build before),
# floor (the per-token floor of llama's loop: a 32-layer llama of tiny widths, the 8B's graph with next to no
# bytes to read, ggml-cuda and RFGPU0 interleaved; RFGPU0's GPU time and stream idle per token for it and the 8B).
set -u
R=$PWD; C=$R/.device-carry/common
STEPS=${STEPS:-"ops smoke 8b"}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p /tmp/gc && cp -a $C/bin/* $C/smol-tokenizer.gguf /tmp/gc/ && cd /tmp/gc
[ -s libggml-cuda.so ] || { [ -f $R/.device-carry/cuda/libggml-cuda.so.xz ] && xz -dc $R/.device-carry/cuda/libggml-cuda.so.xz > libggml-cuda.so; }
mkdir -p lib && cp -a libggml-base.so* libggml.so* libllama.so* libggml-cpu.so lib/
export LD_LIBRARY_PATH=/tmp/gc ROCMFORGE_CACHE_DIR=/tmp/rfc RF_TEST_BIN_DIR=/tmp/gc RF_TEST_LIB=/tmp/gc/libggml-rocmforge.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
P8=; if { has 8b || has prof || has glupf || has detail || has warps || has fav || has depth || has q8 || has skip || has staging || has floor ; } && [ ! -f 8b.gguf ]; then ( ./make_model --preset 8b --type q4_0 --tokenizer smol-tokenizer.gguf -o 8b.gguf > $OUT/make8b.log 2>&1 ) & P8=$!; fi
if has ops; then
    ( time timeout 300 ./test_ops --gpus ) > $OUT/test_ops.log 2>&1; echo "test_ops --gpus rc=$?"
    grep -E "FAIL|cases:|passed|failed|real" $OUT/test_ops.log | tail -6
fi
if has smoke; then
    timeout 200 ./gpu_smoke ./libggml-rocmforge.so ./libggml-cpu.so > $OUT/smoke.log 2>&1; echo "gpu_smoke rc=$? $(grep -c FAIL $OUT/smoke.log) FAIL lines"
    grep -iE "layer|attention input|ffn" $OUT/smoke.log | head -20
    timeout 120 ./test_gpu_io > $OUT/gpu_io.log 2>&1; echo "test_gpu_io rc=$? $(tail -1 $OUT/gpu_io.log)"
fi
b() { # LABEL BACKEND-ARGS... (env before)
    local label=$1; shift
    "$@" 2>$OUT/bench-$label.err | grep "backend=" | sed "s/^/$label: /"
}
if has 8b; then  # interleaved; rf-noaddnorm = without the projection+add+norm launch (the build before)
    [ -n "$P8" ] && wait $P8; tail -1 $OUT/make8b.log
    for fa in on off; do
        for r in 1 2; do
            b 8b-$fa-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m 8b.gguf --device CUDA0 --fa $fa -t 8 --pp 512 --tg 64 --reps 2
            b 8b-$fa-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa $fa -t 8 --pp 512 --tg 64 --reps 2
            [ "${AB:-1}" = 1 ] && b 8b-$fa-rf-noaddnorm$r env ROCMFORGE_GPU_ADD_NORM=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa $fa -t 8 --pp 512 --tg 64 --reps 2
        done
    done
fi
if has fav; then  # attention for generation: the KV-head-grouped kernel's blocks per SM (0 = the row kernel), the build before (base)
    [ -n "$P8" ] && wait $P8
    BASE=; [ -f libggml-rocmforge-base.so ] && BASE=./libggml-rocmforge-base.so
    for r in 1 2; do
        b fav-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m 8b.gguf --device CUDA0 --fa on -t 8 --pp 512 --tg 64 --reps 2
        [ -n "$BASE" ] && b fav-base$r ./llama_run bench -b rocmforge -l $BASE -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2
        for w in 0 1 2 4; do
            b fav-w$w-$r env ROCMFORGE_GPU_FA_VEC=$w ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2
        done
    done
fi
if has depth; then  # pp512 and tg after 2048 tokens of context (llama-bench -d 2048), fa on: attention's share grows
    # (AB=1 adds the build before and the generation/prompt attention variants)
    [ -n "$P8" ] && wait $P8
    [ -f smol.gguf ] || ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf > /dev/null 2>&1
    BASE=; [ -f libggml-rocmforge-base.so ] && BASE=./libggml-rocmforge-base.so
    for r in 1 2; do
        b smol-d2048-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m smol.gguf --device CUDA0 --fa on -t 8 --pp 512 --tg 128 --reps 2 --depth 2048
        b smol-d2048-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m smol.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 128 --reps 2 --depth 2048
        b d2048-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m 8b.gguf --device CUDA0 --fa on -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
        b d2048-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
        [ "${AB:-1}" = 1 ] || continue
        b smol-d2048-nosplit$r env ROCMFORGE_GPU_FA_MMA_SPLIT=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m smol.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 128 --reps 2 --depth 2048
        [ -n "$BASE" ] && b d2048-base$r ./llama_run bench -b rocmforge -l $BASE -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
        b d2048-scalar-tiles$r env ROCMFORGE_GPU_FA_MMA=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
        for w in 2 0; do
            b d2048-fav$w-$r env ROCMFORGE_GPU_FA_VEC=$w ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
        done
    done
fi
if has q8; then  # Q8_0 caches (llama.cpp adds Hadamard rotations of Q, K, V and the attention output), fa on, interleaved
    [ -n "$P8" ] && wait $P8
    [ -f smol.gguf ] || ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf > /dev/null 2>&1
    for r in 1 2; do
        b smol-q8-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m smol.gguf --device CUDA0 --fa on --kv q8_0 -t 8 --pp 512 --tg 128 --reps 3
        b smol-q8-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m smol.gguf --device RFGPU0 --fa on --kv q8_0 -t 8 --pp 512 --tg 128 --reps 3
    done
    for r in 1 2; do
        b 8b-q8-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m 8b.gguf --device CUDA0 --fa on --kv q8_0 -t 8 --pp 512 --tg 64 --reps 2
        b 8b-q8-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on --kv q8_0 -t 8 --pp 512 --tg 64 --reps 2
    done
    b 8b-q8-d2048-cuda ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m 8b.gguf --device CUDA0 --fa on --kv q8_0 -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
    b 8b-q8-d2048-rf ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on --kv q8_0 -t 8 --pp 512 --tg 64 --reps 2 --depth 2048
fi
if has smol; then
    ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf > /dev/null 2>&1
    for fa in on off; do
        for r in 1 2; do
            b smol-$fa-cuda$r ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so -m smol.gguf --device CUDA0 --fa $fa -t 8 --pp 512 --tg 128 --reps 3
            b smol-$fa-rf$r ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m smol.gguf --device RFGPU0 --fa $fa -t 8 --pp 512 --tg 128 --reps 3
            [ "${AB:-1}" = 1 ] && b smol-$fa-rf-noaddnorm$r env ROCMFORGE_GPU_ADD_NORM=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m smol.gguf --device RFGPU0 --fa $fa -t 8 --pp 512 --tg 128 --reps 3
        done
    done
fi
if has glupf; then
    [ -n "$P8" ] && wait $P8
    for r in 1 2; do
        for mb in 100 0 12 24 36; do
            b "glupf$mb-$r" env ROCMFORGE_GPU_GLU_PF_MB=$mb ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 16 --tg 64 --reps 2
        done
    done
fi
if has detail; then  # ncu sections of the norm and the attention kernel, FA split modes at a 512-token context
    [ -n "$P8" ] && wait $P8
    timeout 150 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:"fused_rms_norm|flash_attn" --launch-skip 200 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats \
        env ROCMFORGE_GPU_GRAPHS=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 8 --reps 1 > $OUT/ncu-detail.txt 2>&1
    grep -E "fused_rms_norm|flash_attn|Duration|Elapsed Cycles|SM Active Cycles|Block Size|Grid Size|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Memory Throughput|Dynamic Shared|Static Shared" $OUT/ncu-detail.txt | head -60
    for m in 1 2 0; do
        b "fa$m" env ROCMFORGE_GPU_FA_SPLIT=$m ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2
    done
    ROCMFORGE_GPU_PROFILE=1 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 32 --reps 1 > /dev/null 2> $OUT/prof512.err
    echo "profile at 512 context:"; grep -A12 "kernel profile" $OUT/prof512.err | grep -v "op 74 " ; grep "op 74 " $OUT/prof512.err | head -3
fi
if has warps; then  # warps per block of the projection+add+norm and gate/up launches
    [ -n "$P8" ] && wait $P8
    for r in 1 2; do
        for v in "32 8" "16 8" "8 8" "32 4" "16 4" "16 6"; do
            set -- $v
            b "an$1-glu$2-$r" env ROCMFORGE_GPU_ADD_NORM_WARPS=$1 ROCMFORGE_GPU_GLU_WARPS=$2 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 512 --tg 64 --reps 2
        done
    done
fi
if has e2e; then  # synthetic llama-family models fully on RFGPU0 against ggml-cpu
    mkdir -p e2e
    for spec in llama:q4_0 qwen3:q4_k llama:f16 gemma3:f16 qwen3moe:q4_0 qwen2:f16; do
      a=${spec%:*} t=${spec#*:}; m=/tmp/gc/e2e/$a-$t.gguf; mkdir -p /tmp/gc/e2e/$a-$t
      ./make_model --arch $a --type $t --tokenizer smol-tokenizer.gguf -o $m >/dev/null 2>&1
      timeout 90 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so $m /tmp/gc/e2e/$a-$t --fa both --threads 8 --min-stable 0 --device RFGPU0 > $OUT/e2e-$a-$t.log 2>&1
      echo "e2e $spec rc=$? $(grep -E '^fa=' $OUT/e2e-$a-$t.log | cut -c1-150 | tr '\n' ' ')"
    done
fi
if has prof; then
    [ -n "$P8" ] && wait $P8
    ROCMFORGE_GPU_PROFILE=1 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 8 --tg 32 --reps 1 > /dev/null 2> $OUT/prof.err
    echo "profile:"; grep -A16 "kernel profile" $OUT/prof.err
    timeout 120 /usr/local/cuda/bin/ncu --clock-control none --launch-skip 1200 --launch-count 30 \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum --csv \
        env ROCMFORGE_GPU_GRAPHS=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on -t 8 --pp 8 --tg 8 --reps 1 > $OUT/ncu.csv 2>/dev/null
    python3 - $OUT/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("ncu: no data"); sys.exit()
h = rows[0]; k = h.index("Kernel Name"); n = h.index("Metric Name"); v = h.index("Metric Value"); g = h.index("Grid Size"); i = h.index("ID")
by = {}
for r in rows[1:]:
    by.setdefault(r[i], [r[k].split('(')[0], r[g], {}])[2][r[n]] = float(r[v].replace(",", ""))
for key, (name, grid, m) in by.items():
    print(f"{name[:40]:40s} {grid:>16s} {m.get('gpu__time_duration.sum',0)/1e3:8.1f} us  dram {m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed',0):5.1f}%  {m.get('dram__bytes_read.sum',0)/1e6:7.2f} MB")
PY
fi
if has ffi; then  # host time inside rocmforge's entry points per generated token (tg256 minus tg0)
    [ -f smol.gguf ] || ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf > /dev/null 2>&1
    RF="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 -t 8 -m smol.gguf --fa on --pp 8 --reps 1"
    $RF --tg 16 > /dev/null 2>&1  # kernels compiled and cached first
    for tg in 0 256; do
        ROCMFORGE_FFI_TIMING=1 ROCMFORGE_GPU_TIMING=1 $RF --tg $tg 2>&1 > /dev/null | grep -A16 -E "timing per graph|host time inside" | sed "s/^/ffi-tg$tg: /"
    done
fi
if has skip; then  # what each fused kernel costs inside the replayed 8B token graph: tg64 with its launches left out (ROCMFORGE_GPU_SKIP; results wrong)
    [ -n "$P8" ] && wait $P8
    B="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 -t 8 --fa on --pp 8 --tg 64 --reps 2"
    for sk in none flash_attn_vec mul_mat_vec_q1_qkv mul_mat_vec_q_add_norm mul_mat_vec_q_glu "mul_mat_vec_q1_qkv,mul_mat_vec_q_add_norm,mul_mat_vec_q_glu,flash_attn_vec"; do
        echo "skip $sk: $(ROCMFORGE_GPU_SKIP=$sk $B 2>/dev/null | grep -o 'tg64=.*')"
    done
fi
if has floor; then  # per-token floor: the 8B's 613-node graph with tiny widths; GPU time and stream idle a token (ROCMFORGE_GPU_TIMING)
    [ -f tiny32.gguf ] || ./make_model --arch llama --layers 32 --type q4_0 --tokenizer smol-tokenizer.gguf -o tiny32.gguf > /dev/null 2>&1
    RF="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 -t 8 --fa on"
    CU="./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so --device CUDA0 -t 8 --fa on"
    $RF -m tiny32.gguf --pp 8 --tg 16 --reps 1 > /dev/null 2>&1  # kernels compiled and cached first
    for r in 1 2 3; do
        echo "floor tiny32 r$r: cuda $($CU -m tiny32.gguf --pp 8 --tg 128 --reps 3 2>/dev/null | grep -o 'tg128=[0-9.]*')  rf $($RF -m tiny32.gguf --pp 8 --tg 128 --reps 3 2>/dev/null | grep -o 'tg128=[0-9.]*')"
    done
    ROCMFORGE_GPU_TIMING=1 $RF -m tiny32.gguf --pp 8 --tg 128 --reps 1 2>&1 | grep -A2 "timing per graph" | sed "s/^/floor tiny32 timing: /"
    [ -n "$P8" ] && wait $P8
    ROCMFORGE_GPU_TIMING=1 $RF -m 8b.gguf --pp 8 --tg 64 --reps 1 2>&1 | grep -A2 "timing per graph" | sed "s/^/floor 8b timing: /"
fi
if has staging; then  # small writes staged or not (ROCMFORGE_GPU_STAGING=0), interleaved; the build before where carried
    [ -n "$P8" ] && wait $P8
    [ -f smol.gguf ] || ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf > /dev/null 2>&1
    for r in 1 2 3; do
        for v in base new off; do
            L=./libggml-rocmforge.so; E=; [ $v = base ] && L=./libggml-rocmforge-base.so; [ $v = off ] && E=ROCMFORGE_GPU_STAGING=0
            [ -f $L ] || continue
            echo "staging $v$r: smol $(env $E ./llama_run bench -b rocmforge -l $L -m smol.gguf --device RFGPU0 -t 8 --fa on --pp 64 --tg 128 --reps 3 2>/dev/null | grep -o 'tg128=.*')  8b $(env $E ./llama_run bench -b rocmforge -l $L -m 8b.gguf --device RFGPU0 -t 8 --fa on --pp 8 --tg 64 --reps 2 2>/dev/null | grep -o 'tg64=.*')"
        done
    done
fi
