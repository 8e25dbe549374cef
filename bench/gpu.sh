#!/usr/bin/env bash
# RFGPU0 against ggml's own CUDA backend on one NVIDIA GPU, both backends interleaved in one call
# (the host's speed drifts between calls: compare only within one). Run from the repository root on
# the GPU machine. The comparison steps end with the ratio table that docs/performance.md shows (one
# value per round: a / b).
#
#   STEPS="cuda smol 8b" bench/gpu.sh       (default STEPS: cuda membw ops smol 8b)
#
# Inputs, in $CARRY (default .device-carry/common):
#   bin/                 build/bin of this repository: llama_run, make_model, test_ops, test_gpu_io,
#                        gpu_smoke, test_llama_e2e, libggml-rocmforge.so, libggml-base.so*, libggml.so*,
#                        libllama.so*, libggml-cpu.so
#   smol-tokenizer.gguf  SmolLM2's tokenizer (make_model --tokenizer-only --tokenizer SmolLM2.gguf -o ...)
#   ggml-src.tgz         the pinned llama.cpp sources, for step cuda; or cuda-libs.tar.xz.part-*, a build
#                        of it from an earlier call (step cuda leaves them in $OUT: libggml-cuda.so and
#                        the icelake / sapphirerapids ggml-cpu variants, in parts of at most 15 MiB, the
#                        size a device call hands back)
#   optional: libggml-rocmforge-base.so (step ab), SmolLM2-135M-Instruct.Q4_1.gguf or its pieces
#             model.part* (step e2e runs the real model too)
#
# Steps:
#   cuda   build libggml-cuda.so from ggml-src.tgz (nvcc, cmake, ninja; sm_$CUDA_ARCH, default 90)
#          unless cuda-libs.tar.xz.part-* are carried (then any step that needs it unpacks it)
#   membw  HBM read bandwidth (gpu_membw.cu); step 8b then prints the share of it each backend reaches
#   ops    test_ops --gpus (every op and type RFGPU0 claims, against ggml-cpu)
#   smoke  gpu_smoke, test_gpu_io and test_offload
#   e2e    synthetic llama-family models, and the real SmolLM2 where carried, fully on RFGPU0 against
#          ggml-cpu (test_llama_e2e)
#   e2ecuda  the e2e step's synthetic models (E2E_SPECS) through ggml-cuda + ggml-cpu instead of RFGPU0, fa off
#          (test_llama_e2e --with-lib): how ggml's own GPU backend fares on the same criteria
#   smol   SmolLM2-shaped Q4_1 (make_model --preset smollm2, same speed as the real model): pp512 and
#          tg128, fa on and off, best of 3
#   defaults  SmolLM2-shaped pp512 / tg128 with libllama's default context parameters (llama_run
#          --ctx defaults: n_ctx 512, n_batch 2048, n_ubatch 512, flash attention auto) beside
#          llama_run's own (n_ctx pp+tg+16, n_batch = n_ubatch = 512, fa on), 3 rounds of 3 repetitions;
#          every repetition printed (reps_pp=), the first one included
#   8b     8B-class Q4_0 (make_model --preset 8b, 4.04 GB read a token): pp512 and tg64, fa on and
#          off, best of 2
#   depth  pp512 and tg after 2048 tokens of context (llama-bench -d), fa on, SmolLM2 and 8B
#   q8     Q8_0 KV caches, fa on: SmolLM2 and 8B, the 8B also at depth 2048
#   ab     this build against libggml-rocmforge-base.so (SmolLM2 tg128, 8B tg64, fa on)
#   prof   in-stream kernel profile of an 8B token (ROCMFORGE_GPU_PROFILE) and an ncu window of one
#          layer (time, DRAM throughput, bytes read per kernel)
#   ffi    host time inside rocmforge's C entry points per generated token (ROCMFORGE_FFI_TIMING,
#          SmolLM2-shaped tg256 minus tg0)
#   skip   8B tg64 with each fused kernel's launches left out (ROCMFORGE_GPU_SKIP: results wrong,
#          timing only): each kernel's cost inside the replayed token graph
#   split  8B-class Q4_0 split with --ngl 16 (half the layers on the GPU, as llama.cpp's -ngl 16):
#          ggml-cuda + ggml-cpu's best variant that runs on the host against RFGPU0 + RFCPU, pp512
#          and tg32 (the prompt's products of the CPU layers offloaded to the GPU by offload_op)
#   pin    8B-class Q4_0 with --ngl 16 on RFGPU0 + RFCPU only, pp512 and tg32: RFCPU's weights pinned
#          for the GPU (default), not pinned (ROCMFORGE_GPU_PIN_HOST=0), and libggml-rocmforge-base.so
#          (carried), interleaved; no ggml-cuda needed
#   htest  RFHYBRID on the GPU: test_hybrid (real GPU, and the stand-in), test_ops --device RFHYBRID,
#          SmolLM2-shaped end to end on RFHYBRID against ggml-cpu
#   hybrid 8B-class Q4_0 on RFHYBRID (--device RFHYBRID, every layer) with a GPU budget of half the
#          weights (ROCMFORGE_HYBRID_VRAM: each of $HYBRID_VRAM, default "2048MiB 2600MiB", the second
#          about what ggml-cuda's --ngl 16 holds with its KV cache and compute buffer) against ggml-cuda + ggml-cpu's
#          best variant at --ngl 16 and RFGPU0 + RFCPU at --ngl 16; with the default budget (the
#          whole model fits) against RFGPU0; SmolLM2-shaped on RFHYBRID without a GPU (ROCMFORGE_GPU=0)
#          against RFCPU; then one telemetry summary and a Chrome trace ($OUT/trace.json) of the
#          budgeted run (FA as $HYBRID_FA, default off: ggml-cuda may be built without FA kernels)
#   moe    MoE row: qwen3moe of Qwen3-30B-A3B's shapes (MOE_LAYERS, default 24 of 48) on RFHYBRID with a
#          budget for all but the experts (each of $MOE_VRAM, default "1024MiB 2048MiB") against
#          ggml-cuda + ggml-cpu --cpu-moe and RFGPU0 + RFCPU --cpu-moe; the whole model on ggml-cuda
#          and on RFGPU0; RFGPU0 and RFHYBRID with ROCMFORGE_GPU_MMID_SORTED_MIN=0; a telemetry summary.
#          Both steps run RFHYBRID once per budget first (a user's first run: the calibration and the
#          measured choices later processes take), so their rows show a later process
#   fit    llama.cpp's automatic placement (common_fit_params, bench/fit_params.cpp, built here with
#          llama-common) at each budget, ggml-cuda + ggml-cpu run with what it picks, against RFHYBRID
#   start  first start: seconds from ggml_backend_load to the first token (sampled after the prompt)
#          and the second (after the first one-token graph) of SmolLM2-shaped Q4_1 on RFGPU0
#          (llama_run generate, fa on), 3 times with an empty kernel cache then 3 times warm; the
#          kernel group lines of the first cold run; libggml-rocmforge-base.so once cold where carried
#   cpu    RFCPU against ggml-cpu's best variant on this host (issue 23): 8B-shaped (CPU_LAYERS of 32,
#          default 8) and 1B-shaped (CPU_SIZES, default "8b 1b"; "smol" adds the SmolLM2-shaped Q4_1) models
#          of each of $CPU_TYPES (default "q4_0 q4_k"; q4_k_m, q8_0, iq4_xs ... too), pp512 / tg$CPU_TG
#          (default 32) at each of $CPU_THREADS (default "4 16")
#   mgpu   every GPU of the machine (issue 26): test_multi_gpu, SmolLM2-shaped end to end with -sm layer,
#          -sm row and -sm tensor over all GPUs (test_llama_e2e --device 'RFGPU*'), then 8B-class Q4_0 pp512 / tg64,
#          fa on, over all GPUs: ggml-cuda against rocmforge with -sm layer, -sm row (the pinned
#          ggml-cuda has no split buffer type: its row is -sm tensor, ggml's own tensor parallelism) and
#          -sm tensor (rocmforge's also without its AllReduce and without its graph cache); the same
#          model's one-GPU tg (CUDA0, RFGPU0) for the "row split >= 1.3x one GPU"
#          target; with MGPU_70B=N also a 70B-shaped Q4_0 of N layers (make_model --preset 70b);
#          MGPU_PEER_OFF=0 leaves out the row split without peer access
#   fmt    the weight formats of issue 25 on RFGPU0 against ggml-cuda: 8B-shaped models of FMT_LAYERS
#          (default 8) layers in each of $FMT_TYPES, pp512 / tg64, fa off (the carried ggml-cuda may lack
#          its FA kernels: with fa on its attention ran on the CPU)
#   floor  the per-token floor of llama's host loop: a 32-layer llama of tiny widths (the 8B's graph
#          with next to no bytes), ggml-cuda and RFGPU0; GPU time and stream idle a token
# Env: ROUNDS (2), THREADS (8 host threads), CARRY, CUDA_ARCH. Work files in /tmp/gc.
set -u
R=$PWD
CARRY=${CARRY:-$R/.device-carry/common}
OUT=${OUT:-/tmp/gc/out}
STEPS=${STEPS:-"cuda membw ops smol 8b"}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-8}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p /tmp/gc "$OUT" && cp -a "$CARRY"/bin/* "$CARRY"/smol-tokenizer.gguf /tmp/gc/ && cd /tmp/gc || exit 1
[ -f "$CARRY/libggml-rocmforge-base.so" ] && cp -a "$CARRY/libggml-rocmforge-base.so" .
# ggml-cpu variants built by step cuda of an earlier call (step split picks the best that runs).
for v in "$CARRY"/libggml-cpu-*.so; do [ -f "$v" ] && cp -a "$v" .; done
mkdir -p lib && cp -a libggml-base.so* libggml.so* libllama.so* libggml-cpu.so lib/
export LD_LIBRARY_PATH=/tmp/gc ROCMFORGE_CACHE_DIR=/tmp/rfc RF_TEST_BIN_DIR=/tmp/gc RF_TEST_LIB=/tmp/gc/libggml-rocmforge.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# The device machine gets a copy of the working tree whose git metadata need not match it: the
# caller records which commit built the carried binaries.
echo "date $(date -u +%F); binaries as carried in $CARRY (their commit: see the caller)"

# Models: made in the background while the tests run, on every core (make_model --threads; the e2e
# step keeps the one-thread models CI tests).
need8b() { has 8b || has mgpu || has split || has pin || has depth || has q8 || has ab || has prof || has skip || has floor || has hybrid; }
P8=
if need8b && [ ! -f 8b.gguf ]; then
    (./make_model --preset 8b --type q4_0 --threads "$(nproc)" --tokenizer smol-tokenizer.gguf -o 8b.gguf >"$OUT/make8b.log" 2>&1) &
    P8=$!
fi
wait8b() { [ -n "$P8" ] && wait "$P8"; P8=; }
PM=
if has moe && [ ! -f moe.gguf ]; then
    (./make_model --preset moe --layers "${MOE_LAYERS:-24}" --type q4_0 --threads "$(nproc)" --tokenizer smol-tokenizer.gguf -o moe.gguf \
        >"$OUT/makemoe.log" 2>&1) &
    PM=$!
fi
waitmoe() { [ -n "$PM" ] && wait "$PM"; PM=; }
# Step fit: libllama and llama-common of the pinned tree (no GPU backend: the carried or built
# libggml-cuda.so is loaded at run time) and bench/fit_params.cpp, built in the background.
PF=
if has fit; then
    (
        mkdir -p src && { [ -f src/llama.cpp/CMakeLists.txt ] || tar xzf "$CARRY/ggml-src.tgz" -C src; }
        s=src; [ -f src/CMakeLists.txt ] || for c in src/*/CMakeLists.txt; do s=$(dirname "$c"); done
        cmake -G Ninja -S "$s" -B fit-build -DCMAKE_BUILD_TYPE=Release -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON \
            -DGGML_NATIVE=OFF -DGGML_CPU=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$OUT/fit-build.log" 2>&1 &&
            cmake --build fit-build --target llama-common -j"$(nproc)" >>"$OUT/fit-build.log" 2>&1 &&
            g++ -O2 -std=c++17 -o fit_params "$R/bench/fit_params.cpp" -I"$s/common" -I"$s/include" -I"$s/ggml/include" \
                -Lfit-build/bin -Wl,-rpath,"$PWD/fit-build/bin" $(find fit-build -name 'libllama-common*.a' -o -name 'libllama-common*.so' | sort -r) \
                -lllama -lggml -lggml-base >>"$OUT/fit-build.log" 2>&1
    ) &
    PF=$!
fi
# One thread: the end-to-end checks (steps mgpu, htest) run on this model, the very one CI's tests make
# (a threaded make_model draws other random weights; on one such draw the SmolLM2 shape's chaotic
# greedy tokens left ggml's stable prefix: 2026-11-26, two H200).
[ -f smol.gguf ] || ./make_model --preset smollm2 --tokenizer smol-tokenizer.gguf -o smol.gguf >/dev/null 2>&1

if [ ! -s libggml-cuda.so ] && ls "$CARRY"/cuda-libs.tar.xz.part-* >/dev/null 2>&1; then
    cat "$CARRY"/cuda-libs.tar.xz.part-* | xz -dc | tar x
fi
# Built in the background while the tests run; the comparison steps wait for it.
PC=
if has cuda && [ ! -s libggml-cuda.so ]; then
    (
        mkdir -p src && tar xzf "$CARRY/ggml-src.tgz" -C src
        # The tgz holds the llama.cpp tree at its top level or in one folder.
        s=src
        [ -f src/CMakeLists.txt ] || for c in src/*/CMakeLists.txt; do s=$(dirname "$c"); done
        if ! cmake -G Ninja -S "$s" -B cuda-build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON \
            -DGGML_NATIVE=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DGGML_CPU_ALL_VARIANTS=ON \
            -DGGML_CUDA_FA="${CUDA_FA:-ON}" \
            >"$OUT/cuda-build.log" 2>&1 ||
            ! cmake --build cuda-build --target ggml-cuda ggml-cpu-icelake ggml-cpu-sapphirerapids -j"$(nproc)" \
                >>"$OUT/cuda-build.log" 2>&1; then
            echo "ggml-cuda build failed: $OUT/cuda-build.log"
            tail -20 "$OUT/cuda-build.log"
            exit 1
        fi
        cp cuda-build/bin/libggml-cpu-icelake.so cuda-build/bin/libggml-cpu-sapphirerapids.so .
        cp cuda-build/bin/libggml-cuda.so libggml-cuda.tmp && strip libggml-cuda.tmp && mv libggml-cuda.tmp libggml-cuda.so &&
            tar c libggml-cuda.so libggml-cpu-icelake.so libggml-cpu-sapphirerapids.so | xz -T0 |
            split -b 15M - "$OUT/cuda-libs.tar.xz.part-"
    ) &
    PC=$!
fi
quiet() { wait8b; waitmoe; [ -n "$PC" ] && { wait "$PC"; PC=; }; [ -n "$PF" ] && { wait "$PF"; PF=; }; }  # nothing else loading the host
cuda_ok() {
    [ -n "$PC" ] && { wait "$PC"; PC=; }
    [ -s libggml-cuda.so ] || { echo "no libggml-cuda.so: add step cuda (or carry cuda-libs.tar.xz.part-*)"; return 1; }
}

if has membw; then
    nvcc -O3 -arch=sm_"${CUDA_ARCH:-90}" -o gpu_membw "$R/bench/gpu_membw.cu" && ./gpu_membw | tee "$OUT/membw.log"
fi
if has ops; then
    (time timeout 420 ./test_ops --gpus) >"$OUT/test_ops.log" 2>&1
    echo "test_ops --gpus rc=$?"
    grep -E "FAIL|cases:|passed|failed|real" "$OUT/test_ops.log" | tail -6
fi
if has smoke; then
    timeout 200 ./gpu_smoke ./libggml-rocmforge.so ./libggml-cpu.so >"$OUT/smoke.log" 2>&1
    echo "gpu_smoke rc=$? $(grep -c FAIL "$OUT/smoke.log") FAIL lines"
    timeout 120 ./test_gpu_io >"$OUT/gpu_io.log" 2>&1
    echo "test_gpu_io rc=$? $(tail -1 "$OUT/gpu_io.log")"
    timeout 300 ./test_offload >"$OUT/offload.log" 2>&1
    echo "test_offload rc=$? $(tail -1 "$OUT/offload.log")"
fi
if has e2e; then
    mkdir -p e2e
    if [ ! -f real.gguf ]; then
        if [ -f "$CARRY/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then cp "$CARRY/SmolLM2-135M-Instruct.Q4_1.gguf" real.gguf
        elif ls "$CARRY"/model.part* >/dev/null 2>&1; then cat "$CARRY"/model.part* >real.gguf; fi
    fi
    if [ -f real.gguf ]; then
        timeout 200 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so real.gguf e2e --fa both \
            --threads "$THREADS" --device RFGPU0 >"$OUT/e2e-smol.log" 2>&1
        echo "e2e SmolLM2 on RFGPU0 rc=$?"
        grep -E "fa=|FAIL|PASS" "$OUT/e2e-smol.log" | cut -c1-300
    fi
    for spec in ${E2E_SPECS:-llama:f16 qwen2:f16 qwen3:f16 gemma3:f16 qwen3moe:f16 llama:bf16 qwen3moe:bf16 llama:q8_0 \
        llama:q4_0 qwen3moe:q4_0 qwen3:q4_k llama:q6_k phi3:f16 phi3:q4_0 gemma2:f16 bert:f16 gpt-oss:mxfp4 \
        deepseek2:f16 deepseek2:q8_0 llama:q4_k_m llama:iq4_xs llama:iq3_m}; do
        a=${spec%:*} t=${spec#*:} m=e2e/$a-$t.gguf mode=
        [ "$a" = bert ] && mode=--embd
        mkdir -p "e2e/$a-$t"
        ./make_model --arch "$a" --type "$t" --tokenizer smol-tokenizer.gguf -o "$m" >/dev/null 2>&1
        timeout 90 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so "$m" "e2e/$a-$t" --fa both \
            --threads "$THREADS" --min-stable 0 --device RFGPU0 $mode >"$OUT/e2e-$a-$t.log" 2>&1
        echo "e2e $spec rc=$? $(grep -c '^fa=' "$OUT/e2e-$a-$t.log") fa rows, $(tail -1 "$OUT/e2e-$a-$t.log" | cut -c1-120)"
    done
fi

if has e2ecuda && cuda_ok; then
    mkdir -p e2e
    for spec in ${E2E_SPECS:-llama:q8_0 llama:q4_0 deepseek2:q8_0 llama:iq4_xs llama:q4_k_m}; do
        a=${spec%:*} t=${spec#*:} m=e2e/$a-$t.gguf mode=
        [ "$a" = bert ] && mode=--embd
        mkdir -p "e2e/cuda-$a-$t"
        [ -f "$m" ] || ./make_model --arch "$a" --type "$t" --tokenizer smol-tokenizer.gguf -o "$m" >/dev/null 2>&1
        timeout 90 ./test_llama_e2e ./llama_run ./libggml-cuda.so ./libggml-cpu.so "$m" "e2e/cuda-$a-$t" --fa off \
            --threads "$THREADS" --min-stable 0 --device CUDA0 --with-lib ./libggml-cpu.so $mode >"$OUT/e2ecuda-$a-$t.log" 2>&1
        echo "e2e on ggml-cuda $spec rc=$? $(tail -1 "$OUT/e2ecuda-$a-$t.log" | cut -c1-120)"
    done
fi

# pair MODEL-LABEL FA GGUF PP TG REPS [llama_run options...]: ggml-cuda then RFGPU0, ROUNDS times,
# one line each: "MODEL-LABEL FA backend=... ppN=... tgN=..." (collected in $OUT/pairs.txt).
pair() {
    local label=$1 fa=$2 model=$3 pp=$4 tg=$5 reps=$6 r
    shift 6
    for r in $(seq "$ROUNDS"); do
        ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L "${CPU_SO:-./libggml-cpu.so}" -m "$model" --device CUDA0 \
            --fa "$fa" -t "$THREADS" --pp "$pp" --tg "$tg" --reps "$reps" "$@" 2>>"$OUT/bench.err" | sed "s/^/$label $fa /"
        ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m "$model" --device RFGPU0 \
            --fa "$fa" -t "$THREADS" --pp "$pp" --tg "$tg" --reps "$reps" "$@" 2>>"$OUT/bench.err" | sed "s/^/$label $fa /"
    done | tee -a "$OUT/pairs.txt"
}
# ratio_table < pairs: | model | fa | test | ggml-cuda | RFGPU0 | ratio |, rounds as a / b; with
# membw measured, tg rows of the 8B add each backend's share of HBM bandwidth.
ratio_table() {
    local bw=0 bytes=0
    [ -f "$OUT/membw.log" ] && bw=$(sed -n 's/^membw read: \([0-9.]*\) GB\/s.*/\1/p' "$OUT/membw.log")
    [ -f 8b.gguf ] && bytes=$(($(stat -c %s 8b.gguf) - 49152 * 4096 * 18 / 32))
    python3 -c '
import os, sys
bw, nbytes = float(sys.argv[1] or 0), int(sys.argv[2])
rows = {}
for line in sys.stdin:
    model, fa, *kvs = line.split()
    kv = dict(x.split("=", 1) for x in kvs if "=" in x)
    for k, v in kv.items():
        if k.startswith(("pp", "tg")):
            rows.setdefault((model, fa, k), {}).setdefault(kv["backend"], []).append(float(v))
print("| model | " + (os.environ.get("RT_COL") or "fa") + " | test | ggml-cuda | " + (os.environ.get("RT_RF") or "RFGPU0") + " | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for (model, fa, test), r in rows.items():
    a, b = r.get("ggml-cuda", []), r.get("rocmforge", [])
    def vals(x):
        s = " / ".join(f"{v:.0f}" for v in x) + " t/s"
        if bw and nbytes and model.startswith("8B") and test.startswith("tg"):
            s += " (" + " / ".join(f"{v * nbytes / 1e9 / bw:.0%}" for v in x) + " of HBM)"
        return s
    ratio = " / ".join(f"{y / x:.2f}x" for x, y in zip(a, b) if x)
    name = test.replace("@d", " at depth ")
    print(f"| {model} | {fa} | {name} | {vals(a)} | {vals(b)} | {ratio} |")
' "$bw" "$bytes"
}

# Timing steps first wait for the background jobs (model writing and the ggml-cuda build load the host).
if has smol && cuda_ok; then
    quiet
    {
        pair SmolLM2-Q4_1 on smol.gguf 512 128 3
        pair SmolLM2-Q4_1 off smol.gguf 512 128 3
    } | ratio_table
fi
if has 8b && cuda_ok; then
    quiet
    {
        pair 8B-class-Q4_0 on 8b.gguf 512 64 2
        pair 8B-class-Q4_0 off 8b.gguf 512 64 2
    } | ratio_table
fi
if has depth && cuda_ok; then
    quiet
    {
        pair SmolLM2-Q4_1 on smol.gguf 512 128 2 --depth 2048
        pair 8B-class-Q4_0 on 8b.gguf 512 64 2 --depth 2048
    } | ratio_table
fi
if has q8 && cuda_ok; then
    quiet
    {
        pair SmolLM2-Q4_1-kv-q8_0 on smol.gguf 512 128 3 --kv q8_0
        pair 8B-class-Q4_0-kv-q8_0 on 8b.gguf 512 64 2 --kv q8_0
        ROUNDS=1 pair 8B-class-Q4_0-kv-q8_0 on 8b.gguf 512 64 2 --kv q8_0 --depth 2048
    } | ratio_table
fi
if has ab; then
    quiet
    if [ -f libggml-rocmforge-base.so ]; then
        for r in $(seq "$ROUNDS"); do
            for v in base this; do
                L=./libggml-rocmforge.so; [ $v = base ] && L=./libggml-rocmforge-base.so
                echo "ab $v$r: smol $(./llama_run bench -b rocmforge -l $L -m smol.gguf --device RFGPU0 -t "$THREADS" --fa on --pp 512 --tg 128 --reps 3 2>/dev/null | grep -o 'pp512=.*')" \
                    " 8b $(./llama_run bench -b rocmforge -l $L -m 8b.gguf --device RFGPU0 -t "$THREADS" --fa on --pp 512 --tg 64 --reps 2 2>/dev/null | grep -o 'pp512=.*')"
            done
        done
    else
        echo "ab: no libggml-rocmforge-base.so carried"
    fi
fi
if has prof; then
    quiet
    ROCMFORGE_GPU_PROFILE=1 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 --fa on \
        -t "$THREADS" --pp 8 --tg 32 --reps 1 >/dev/null 2>"$OUT/prof.err"
    echo "profile:"
    grep -A16 "kernel profile" "$OUT/prof.err"
    timeout 120 /usr/local/cuda/bin/ncu --clock-control none --launch-skip 1200 --launch-count 30 \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum --csv \
        env ROCMFORGE_GPU_GRAPHS=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 \
        --fa on -t "$THREADS" --pp 8 --tg 8 --reps 1 >"$OUT/ncu.csv" 2>/dev/null
    python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("ncu: no data")
h = rows[0]
k, n, v, g, i = (h.index(x) for x in ("Kernel Name", "Metric Name", "Metric Value", "Grid Size", "ID"))
by = {}
for r in rows[1:]:
    by.setdefault(r[i], [r[k].split("(")[0], r[g], {}])[2][r[n]] = float(r[v].replace(",", ""))
for name, grid, m in by.values():
    print(f"{name[:40]:40s} {grid:>16s} {m.get('gpu__time_duration.sum', 0) / 1e3:8.1f} us"
          f"  dram {m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', 0):5.1f}%"
          f"  {m.get('dram__bytes_read.sum', 0) / 1e6:7.2f} MB")
PY
fi
if has ffi; then
    quiet
    RF="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 -t $THREADS -m smol.gguf --fa on --pp 8 --reps 1"
    $RF --tg 16 >/dev/null 2>&1 # kernels compiled and cached first
    for tg in 0 256; do
        ROCMFORGE_FFI_TIMING=1 ROCMFORGE_GPU_TIMING=1 $RF --tg $tg 2>&1 >/dev/null |
            grep -A16 -E "timing per graph|host time inside" | sed "s/^/ffi-tg$tg: /"
    done
fi
if has skip; then
    quiet
    B="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 -t $THREADS --fa on --pp 8 --tg 64 --reps 2"
    for sk in none flash_attn_vec mul_mat_vec_q1_qkv mul_mat_vec_q_add_norm mul_mat_vec_q_glu \
        "mul_mat_vec_q1_qkv,mul_mat_vec_q_add_norm,mul_mat_vec_q_glu,flash_attn_vec"; do
        echo "skip $sk: $(ROCMFORGE_GPU_SKIP=$sk $B 2>/dev/null | grep -o 'tg64=.*')"
    done
fi
if has defaults && cuda_ok; then
    quiet
    {
        ROUNDS=3 pair SmolLM2-Q4_1-ctx-defaults auto smol.gguf 512 128 3 --ctx defaults
        ROUNDS=3 pair SmolLM2-Q4_1 on smol.gguf 512 128 3
    } | tee "$OUT/defaults.txt" | ratio_table
    grep -o "^[^ ]* [^ ]* backend=[a-z-]*\|reps_pp=[0-9/]*" "$OUT/defaults.txt" | paste - - | sed 's/^/defaults: /'
fi
if has split && cuda_ok; then
    quiet
    # ggml-cpu's best variant that runs here (on some VMs the sapphirerapids build dies on an AMX
    # instruction the OS does not grant): the CPU half of ggml's split runs on it.
    CPU_SO=./libggml-cpu.so
    for v in icelake sapphirerapids; do
        [ -f libggml-cpu-$v.so ] && ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu-$v.so \
            -m smol.gguf --device CUDA0 --ngl 0 -t "$THREADS" --pp 64 --tg 4 --reps 1 >/dev/null 2>&1 &&
            CPU_SO=./libggml-cpu-$v.so
    done
    echo "split: ggml-cuda's CPU half on $CPU_SO"
    export CPU_SO
    pair 8B-class-Q4_0-ngl16 on 8b.gguf 512 32 2 --ngl 16 | ratio_table
    unset CPU_SO
fi
if has pin; then
    quiet
    B="./llama_run bench -b rocmforge -m 8b.gguf --device RFGPU0 --ngl 16 --fa on -t $THREADS --pp 512 --tg 32 --reps 2"
    $B -l ./libggml-rocmforge.so --tg 4 --reps 1 >/dev/null 2>&1 # kernels compiled and cached first
    for r in $(seq "$ROUNDS"); do
        echo "pin r$r pinned $($B -l ./libggml-rocmforge.so 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "pin r$r pageable $(ROCMFORGE_GPU_PIN_HOST=0 $B -l ./libggml-rocmforge.so 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        [ -f libggml-rocmforge-base.so ] &&
            echo "pin r$r base $($B -l ./libggml-rocmforge-base.so 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
    done | tee "$OUT/pin.txt"
    ROCMFORGE_DEBUG=1 $B -l ./libggml-rocmforge.so --tg 4 --reps 1 2>&1 | grep -m4 "pinned\|not pinned" | cut -c1-300 | sed 's/^/pin log: /'
fi
if has mgpu; then
    # fa off by default: the carried ggml-cuda build may have no flash-attention kernels (its
    # attention then runs on the CPU).
    MFA=${MGPU_FA:-off}
    # mgpu_pair LABEL SM_CUDA SM_RF MODEL PP TG REPS: ggml-cuda over every CUDA device, then rocmforge
    # over every RFGPU, ROUNDS times; the rows are labelled with rocmforge's split mode.
    mgpu_pair() {
        local label=$1 smc=$2 smr=$3 model=$4 pp=$5 tg=$6 reps=$7 r
        for r in $(seq "$ROUNDS"); do
            ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L "${CPU_SO:-./libggml-cpu.so}" -m "$model" --device 'CUDA*' \
                --sm "$smc" --fa "$MFA" -t "$THREADS" --pp "$pp" --tg "$tg" --reps "$reps" 2>>"$OUT/mgpu.err" | sed "s/^/$label $smr /"
            ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m "$model" --device 'RFGPU*' \
                --sm "$smr" --fa "$MFA" -t "$THREADS" --pp "$pp" --tg "$tg" --reps "$reps" 2>>"$OUT/mgpu.err" | sed "s/^/$label $smr /"
        done | tee -a "$OUT/mgpu-pairs.txt"
    }
    nvidia-smi topo -m 2>/dev/null | head -4
    timeout 300 ./test_multi_gpu >"$OUT/test_multi_gpu.log" 2>&1
    echo "test_multi_gpu rc=$?"; grep -E "FAIL|PASS|GPU|skipped" "$OUT/test_multi_gpu.log" | head -20
    for sm in layer row tensor; do
        mkdir -p "e2e-sm-$sm"
        timeout 150 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so smol.gguf "e2e-sm-$sm" --fa on \
            --threads "$THREADS" --min-stable 0 --device 'RFGPU*' --sm "$sm" >"$OUT/e2e-sm-$sm.log" 2>&1
        echo "e2e SmolLM2-shaped -sm $sm over every GPU rc=$?"; grep -E "^fa=|PASS|FAIL|skipped" "$OUT/e2e-sm-$sm.log"
    done
    if cuda_ok; then
        quiet
        {
            mgpu_pair 8B-Q4_0-all-GPUs layer layer 8b.gguf 512 64 2
            mgpu_pair 8B-Q4_0-all-GPUs row row 8b.gguf 512 64 2
            mgpu_pair 8B-Q4_0-all-GPUs tensor tensor 8b.gguf 512 64 2
            # Tensor parallelism without rocmforge's AllReduce (ggml's copies and ADD graphs: peer
            # access off declines it) and without the graph cache (each part launched kernel by kernel).
            for v in ROCMFORGE_GPU_PEER=0 ROCMFORGE_GPU_GRAPH_CACHE=0; do
                env "$v" ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device 'RFGPU*' \
                    --sm tensor --fa "$MFA" -t "$THREADS" --pp 512 --tg 64 --reps 2 2>>"$OUT/mgpu.err" |
                    sed "s/^/8B-Q4_0-all-GPUs tensor-${v#ROCMFORGE_GPU_} /" | tee -a "$OUT/mgpu-pairs.txt"
            done
            # The row split without peer access (copies through host memory, no direct reads).
            [ "${MGPU_PEER_OFF:-1}" = 1 ] && ROCMFORGE_GPU_PEER=0 ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device 'RFGPU*' \
                --sm row --fa "$MFA" -t "$THREADS" --pp 512 --tg 64 --reps 2 2>>"$OUT/mgpu.err" |
                sed "s/^/8B-Q4_0-all-GPUs row-peer-off /" | tee -a "$OUT/mgpu-pairs.txt"
            for r in $(seq "$ROUNDS"); do
                ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L "${CPU_SO:-./libggml-cpu.so}" -m 8b.gguf --device CUDA0 \
                    --fa "$MFA" -t "$THREADS" --pp 512 --tg 64 --reps 2 2>>"$OUT/mgpu.err" | sed "s/^/8B-Q4_0-one-GPU none /"
                ./llama_run bench -b rocmforge -l ./libggml-rocmforge.so -m 8b.gguf --device RFGPU0 \
                    --fa "$MFA" -t "$THREADS" --pp 512 --tg 64 --reps 2 2>>"$OUT/mgpu.err" | sed "s/^/8B-Q4_0-one-GPU none /"
            done | tee -a "$OUT/mgpu-pairs.txt"
            if [ "${MGPU_70B:-0}" -gt 0 ]; then
                [ -f 70b.gguf ] || ./make_model --preset 70b --layers "$MGPU_70B" --type q4_0 --threads "$(nproc)" --tokenizer smol-tokenizer.gguf \
                    -o 70b.gguf >"$OUT/make70b.log" 2>&1
                mgpu_pair "70B-shaped-${MGPU_70B}-layers-Q4_0" layer layer 70b.gguf 512 32 1
                mgpu_pair "70B-shaped-${MGPU_70B}-layers-Q4_0" row row 70b.gguf 512 32 1
            fi
        } | RT_COL="split (rocmforge)" RT_RF="rocmforge" ratio_table
        # Row split's generation against one GPU (the issue's target: >= 1.3x).
        python3 - "$OUT/mgpu-pairs.txt" <<'PY'
import sys
tg = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 3 or not f[0].startswith("8B"):
        continue
    kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
    for k, v in kv.items():
        if k.startswith("tg"):
            tg.setdefault((f[1], kv.get("backend")), []).append(float(v))
one = tg.get(("none", "rocmforge"))
for sm in ("row", "tensor"):
    got = tg.get((sm, "rocmforge"))
    if one and got:
        print(f"rocmforge 8B tg64: -sm {sm} {max(got):.1f} t/s vs one GPU {max(one):.1f} t/s = {max(got) / max(one):.2f}x (target >= 1.3x)")
PY
        # ggml-cuda with only GPU 0 visible (its one-GPU number on a one-GPU machine).
        echo "ggml-cuda, CUDA_VISIBLE_DEVICES=0: $(CUDA_VISIBLE_DEVICES=0 ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so \
            -L "${CPU_SO:-./libggml-cpu.so}" -m 8b.gguf --device CUDA0 --fa "$MFA" -t "$THREADS" --pp 512 --tg 64 --reps 2 2>/dev/null)"
        grep -iE "error|failed|abort" "$OUT/mgpu.err" | sort | uniq -c | sort -rn | head -8
    fi
fi
if has floor && cuda_ok; then
    quiet
    [ -f tiny32.gguf ] || ./make_model --arch llama --layers 32 --type q4_0 --tokenizer smol-tokenizer.gguf -o tiny32.gguf >/dev/null 2>&1
    RF="./llama_run bench -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 -t $THREADS --fa on"
    CU="./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu.so --device CUDA0 -t $THREADS --fa on"
    $RF -m tiny32.gguf --pp 8 --tg 16 --reps 1 >/dev/null 2>&1 # kernels compiled and cached first
    for r in 1 2 3; do
        echo "floor tiny32 r$r: cuda $($CU -m tiny32.gguf --pp 8 --tg 128 --reps 3 2>/dev/null | grep -o 'tg128=[0-9.]*')" \
            " rf $($RF -m tiny32.gguf --pp 8 --tg 128 --reps 3 2>/dev/null | grep -o 'tg128=[0-9.]*')"
    done
    ROCMFORGE_GPU_TIMING=1 $RF -m tiny32.gguf --pp 8 --tg 128 --reps 1 2>&1 | grep -A2 "timing per graph" | sed "s/^/floor tiny32 timing: /"
    ROCMFORGE_GPU_TIMING=1 $RF -m 8b.gguf --pp 8 --tg 64 --reps 1 2>&1 | grep -A2 "timing per graph" | sed "s/^/floor 8b timing: /"
fi
quiet

if has htest; then
    timeout 120 ./test_hybrid --need-gpu >"$OUT/hybrid-gpu.log" 2>&1
    echo "test_hybrid (GPU) rc=$? $(tail -1 "$OUT/hybrid-gpu.log")"
    ROCMFORGE_HYBRID_FAKE_GPU=1 timeout 120 ./test_hybrid >"$OUT/hybrid-fake.log" 2>&1
    echo "test_hybrid (stand-in GPU) rc=$? $(tail -1 "$OUT/hybrid-fake.log")"
    (time timeout 300 ./test_ops --device RFHYBRID) >"$OUT/test_ops_hybrid.log" 2>&1
    echo "test_ops --device RFHYBRID rc=$?"
    grep -E "FAIL|cases:|real" "$OUT/test_ops_hybrid.log" | head -8
    mkdir -p e2e-h
    timeout 150 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so smol.gguf e2e-h --fa both \
        --threads "$THREADS" --min-stable 0 --device RFHYBRID >"$OUT/e2e-hybrid.log" 2>&1
    echo "e2e SmolLM2-shaped on RFHYBRID rc=$?"
    grep -E "fa=|FAIL|PASS" "$OUT/e2e-hybrid.log" | cut -c1-300
fi

# ggml-cuda's CPU half: the best ggml-cpu variant that runs on this host.
best_cpu() {
    CPU_SO=./libggml-cpu.so
    for v in icelake sapphirerapids; do
        [ -f libggml-cpu-$v.so ] && ./llama_run bench -b ggml-cuda -l ./libggml-cuda.so -L ./libggml-cpu-$v.so \
            -m smol.gguf --device CUDA0 --ngl 0 -t "$THREADS" --pp 64 --tg 4 --reps 1 --fa off >/dev/null 2>&1 &&
            CPU_SO=./libggml-cpu-$v.so
    done
    echo "ggml-cuda's CPU half: $CPU_SO"
}

if has hybrid && cuda_ok; then
    timeout 120 ./test_hybrid --need-gpu >"$OUT/hybrid-gpu.log" 2>&1
    echo "test_hybrid (GPU) rc=$? $(tail -1 "$OUT/hybrid-gpu.log")"
    quiet
    best_cpu
    HV=${HYBRID_VRAM:-2048MiB 2600MiB} HF=${HYBRID_FA:-off}
    B="bench -m 8b.gguf -t $THREADS --pp 512 --tg 32 --reps 2 --fa $HF"
    # A first run per budget (calibration, plan trial), as in the moe step.
    for hv in $HV; do
        ROCMFORGE_HYBRID_VRAM=$hv ./llama_run bench -m 8b.gguf -t "$THREADS" --pp 64 --tg 24 --reps 1 --fa "$HF" \
            -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID >/dev/null 2>>"$OUT/bench.err"
    done
    for r in $(seq "$ROUNDS"); do
        echo "8B-half r$r ggml-cuda-ngl16 $(./llama_run $B -b ggml-cuda -l ./libggml-cuda.so -L $CPU_SO --device CUDA0 --ngl 16 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        for hv in $HV; do
            echo "8B-half r$r RFHYBRID-$hv $(ROCMFORGE_HYBRID_VRAM=$hv ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        done
        echo "8B-half r$r RFHYBRID-${HV%% *}-noprefetch $(ROCMFORGE_HYBRID_PREFETCH=0 ROCMFORGE_HYBRID_VRAM=${HV%% *} ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "8B-half r$r RFGPU0-ngl16 $(./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 --ngl 16 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "8B-full r$r RFGPU0 $(./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "8B-full r$r RFHYBRID $(./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        S="bench -m smol.gguf -t $THREADS --pp 512 --tg 64 --reps 2 --fa on -b rocmforge -l ./libggml-rocmforge.so"
        echo "smol-cpu r$r RFCPU $(ROCMFORGE_GPU=0 ./llama_run $S 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "smol-cpu r$r RFHYBRID-noGPU $(ROCMFORGE_GPU=0 ./llama_run $S --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
    done | tee "$OUT/hybrid.txt"
    ROCMFORGE_HYBRID_VRAM=${HV%% *} ROCMFORGE_TELEMETRY=summary ROCMFORGE_TRACE="$OUT/trace.json" \
        ./llama_run bench -m 8b.gguf -t "$THREADS" --pp 512 --tg 8 --reps 1 --fa "$HF" -b rocmforge \
        -l ./libggml-rocmforge.so --device RFHYBRID >"$OUT/telemetry.log" 2>&1
    grep -A40 "RFHYBRID telemetry" "$OUT/telemetry.log" | tail -42
    grep "RFHYBRID:" "$OUT/telemetry.log" | head -5
    xz -T0 "$OUT/trace.json" 2>/dev/null
    # Host time inside rocmforge's entry points, whole model: RFHYBRID against RFGPU0 (where the
    # whole-model gap goes), 5 prompts and 8 tokens each.
    for d in RFGPU0 RFHYBRID; do
        ROCMFORGE_FFI_TIMING=1 ./llama_run bench -m 8b.gguf -t "$THREADS" --pp 512 --tg 8 --reps 5 --fa "$HF" \
            -b rocmforge -l ./libggml-rocmforge.so --device $d 2>&1 | grep -E -A14 "pp512=|host time inside" |
            grep -v "^--" | head -16 | sed "s/^/ffi-full-$d: /"
    done
    # The budgeted split (prefetch groups included) against ggml-cpu, end to end.
    mkdir -p e2e-8b
    ROCMFORGE_HYBRID_VRAM=${HV%% *} timeout 240 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so \
        8b.gguf e2e-8b --fa off --threads "$THREADS" --min-stable 0 --device RFHYBRID >"$OUT/e2e-8b-hybrid.log" 2>&1
    echo "e2e 8B-class on RFHYBRID at ${HV%% *} rc=$?"
    grep -E "fa=|FAIL|PASS" "$OUT/e2e-8b-hybrid.log" | cut -c1-300
    # The whole model in VRAM: five prompts (the first three timed node by node) and 8 tokens.
    ROCMFORGE_TELEMETRY=summary ROCMFORGE_TRACE="$OUT/trace-full.json" ./llama_run bench -m 8b.gguf -t "$THREADS" \
        --pp 512 --tg 8 --reps 5 --fa "$HF" -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID \
        >"$OUT/telemetry-full.log" 2>&1
    grep -A12 "RFHYBRID telemetry" "$OUT/telemetry-full.log" | tail -14
    xz -T0 "$OUT/trace-full.json" 2>/dev/null
fi

# The MoE row: a qwen3moe of Qwen3-30B-A3B's shapes (MOE_LAYERS of its 48 layers, default 24: 8 GB
# of Q4_0) on RFHYBRID with a budget for everything but the experts (each of $MOE_VRAM) against
# ggml-cuda + ggml-cpu with the experts on the CPU (--cpu-moe, llama.cpp's override
# "\.ffn_(up|down|gate)_exps=CPU") and RFGPU0 + RFCPU the same way.
if has moe && cuda_ok; then
    waitmoe
    quiet
    best_cpu
    MV=${MOE_VRAM:-1024MiB 2048MiB}
    B="bench -m moe.gguf -t $THREADS --pp 512 --tg 32 --reps 2 --fa off"
    # A user's first run on a machine calibrates the cost model and measures the plan trial and the
    # expert-sharing width, which later processes take (src/hybrid/learned.rs): made here first, so
    # the rows show a later process, not the ~40 tokens of measuring.
    for mv in $MV; do
        ROCMFORGE_HYBRID_VRAM=$mv ./llama_run bench -m moe.gguf -t "$THREADS" --pp 16 --tg 64 --reps 1 --fa off \
            -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID >/dev/null 2>>"$OUT/bench.err"
    done
    for r in $(seq "$ROUNDS"); do
        echo "moe r$r ggml-cuda-cpu-moe $(./llama_run $B -b ggml-cuda -l ./libggml-cuda.so -L $CPU_SO --device CUDA0 --cpu-moe 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        for mv in $MV; do
            echo "moe r$r RFHYBRID-$mv $(ROCMFORGE_HYBRID_VRAM=$mv ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        done
        echo "moe r$r RFGPU0-cpu-moe $(./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 --cpu-moe 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        # The whole model on the GPU; RFGPU0 also with the prompt's expert products pair by pair
        # (ROCMFORGE_GPU_MMID_SORTED_MIN=0: the kernel before the grouping by expert), and
        # RFHYBRID at the first budget so.
        echo "moe r$r ggml-cuda-all $(./llama_run $B -b ggml-cuda -l ./libggml-cuda.so -L $CPU_SO --device CUDA0 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "moe r$r RFGPU0-all $(./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "moe r$r RFGPU0-all-unsorted $(ROCMFORGE_GPU_MMID_SORTED_MIN=0 ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFGPU0 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
        echo "moe r$r RFHYBRID-${MV%% *}-unsorted $(ROCMFORGE_GPU_MMID_SORTED_MIN=0 ROCMFORGE_HYBRID_VRAM=${MV%% *} ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
    done | tee "$OUT/moe.txt"
    ROCMFORGE_HYBRID_VRAM=${MV%% *} ROCMFORGE_TELEMETRY=summary ./llama_run bench -m moe.gguf -t "$THREADS" \
        --pp 512 --tg 8 --reps 1 --fa off -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID >"$OUT/telemetry-moe.log" 2>&1
    grep -A30 "RFHYBRID telemetry" "$OUT/telemetry-moe.log" | tail -32
    grep "RFHYBRID:" "$OUT/telemetry-moe.log" | head -3
fi

# Step fmt: one model per weight type, ggml-cuda then RFGPU0 (pair), the ratio table of those rows.
if has fmt && cuda_ok; then
    for t in ${FMT_TYPES:-q4_0 q4_k_m iq4_xs iq3_m mxfp4 q2_k q3_k q5_k}; do
        ./make_model --preset 8b --layers "${FMT_LAYERS:-8}" --type "$t" --threads "$(nproc)" --tokenizer smol-tokenizer.gguf \
            -o "fmt-$t.gguf" >"$OUT/make-fmt-$t.log" 2>&1 || { echo "fmt $t: make_model failed"; continue; }
        pair "fmt-$t" off "fmt-$t.gguf" 512 64 2 >/dev/null
        rm -f "fmt-$t.gguf"
    done
    grep "^fmt-" "$OUT/pairs.txt" | ratio_table
fi


# llama.cpp's own automatic placement: common_fit_params (the pinned tree's common/fit.cpp) fits
# --ngl and tensor overrides to the GPU budget (bench/fit_params.cpp); ggml-cuda + ggml-cpu run with
# what it picks, against RFHYBRID at the same budget (8B-class at each of $HYBRID_VRAM, and the MoE
# at each of $MOE_VRAM when step moe ran).
if has fit && cuda_ok; then
    [ -n "$PF" ] && { wait "$PF"; PF=; }
    if [ ! -x fit_params ]; then
        echo "fit_params build failed: $OUT/fit-build.log"; tail -5 "$OUT/fit-build.log"
    else
        quiet
        best_cpu
        fitrun() {  # MODEL BUDGET
            local a
            a=$(LD_LIBRARY_PATH=$PWD/fit-build/bin ./fit_params "$1" "${2%MiB}" 560 ./libggml-cuda.so "$CPU_SO" 2>>"$OUT/fit.log") ||
                { echo "fit $1 $2: common_fit_params failed"; return; }
            echo "fit $1 $2: llama_run $a"
            local -a fitted
            read -ra fitted <<<"$a"  # split on spaces, the patterns' * and ( ) never globbed
            B="bench -m $1 -t $THREADS --pp 512 --tg 32 --reps 2 --fa off"
            for r in $(seq "$ROUNDS"); do
                echo "fit $1 r$r ggml-cuda-fit-$2 $(./llama_run $B -b ggml-cuda -l ./libggml-cuda.so -L $CPU_SO --device CUDA0 "${fitted[@]}" 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
                echo "fit $1 r$r RFHYBRID-$2 $(ROCMFORGE_HYBRID_VRAM=$2 ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so --device RFHYBRID 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
            done
        }
        for hv in ${HYBRID_VRAM:-2048MiB 2600MiB}; do fitrun 8b.gguf "$hv"; done | tee "$OUT/fit.txt"
        if [ -f moe.gguf ]; then for mv in ${MOE_VRAM:-1024MiB 2048MiB}; do fitrun moe.gguf "$mv"; done | tee -a "$OUT/fit.txt"; fi
    fi
fi
if has start; then
    # ROCMFORGE_CACHE_DIR of its own: emptied for each cold run, kept for the warm ones.
    G="./llama_run generate -b rocmforge -m smol.gguf --device RFGPU0 -t $THREADS --fa on -n 16"
    for r in 1 2 3 w1 w2 w3; do
        case $r in w*) kind=warm ;; *) kind=cold; rm -rf /tmp/rfc-start ;; esac
        ROCMFORGE_CACHE_DIR=/tmp/rfc-start timeout 300 $G -l ./libggml-rocmforge.so >/dev/null 2>"$OUT/start-$r.log"
        echo "start $kind $r: $(grep -o 'first token.*' "$OUT/start-$r.log" || echo failed)" \
            "| $(grep -o '[0-9]* groups compiled.*' "$OUT/start-$r.log" | tr '\n' ';')"
    done
    echo "kernel groups of the first cold run:"
    grep -E "kernel group|GPU kernels" "$OUT/start-1.log"
    if [ -f libggml-rocmforge-base.so ]; then
        rm -rf /tmp/rfc-start
        ROCMFORGE_CACHE_DIR=/tmp/rfc-start timeout 300 $G -l ./libggml-rocmforge-base.so >/dev/null 2>"$OUT/start-base.log"
        echo "start cold base: $(grep -o 'first token.*' "$OUT/start-base.log" || echo "no timing line (older llama_run)")"
        grep -E "compiled GPU kernels" "$OUT/start-base.log"
    fi
fi

# RFCPU against ggml-cpu's best variant on this host (issue 23): 8B-shaped (CPU_LAYERS of 32 layers,
# default 8) and 1B-shaped models, Q4_0 and Q4_K, pp512 / tg32, at each of $CPU_THREADS (default "4
# 16"), both interleaved; no GPU used (ROCMFORGE_GPU=0). Needs the ggml-cpu variants of step cuda.
if has cpu; then
    quiet
    [ -s libggml-cuda.so ] && best_cpu
    models=
    for t in ${CPU_TYPES:-q4_0 q4_k}; do
        for size in ${CPU_SIZES:-8b 1b}; do
            [ "$size" = smol ] && continue
            layers=; [ "$size" = 8b ] && layers="--layers ${CPU_LAYERS:-8}"
            [ -f cpu$size-$t.gguf ] || ./make_model --preset $size $layers --type $t --threads "$(nproc)" --tokenizer smol-tokenizer.gguf \
                -o cpu$size-$t.gguf >/dev/null 2>&1
            models="$models cpu$size-$t"
        done
    done
    # SmolLM2-shaped Q4_1 (its own type), when CPU_SIZES names smol.
    case " ${CPU_SIZES:-} " in *" smol "*) models="$models smol" ;; esac
    for th in ${CPU_THREADS:-4 16}; do
        for m in $models; do
            B="bench -m $m.gguf -t $th --pp 512 --tg ${CPU_TG:-32} --reps 2"
            for r in $(seq "$ROUNDS"); do
                echo "cpu $m t$th r$r ggml-cpu($(basename "${CPU_SO:-./libggml-cpu.so}" .so)) $(./llama_run $B -b ggml-cpu -l "${CPU_SO:-./libggml-cpu.so}" 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
                echo "cpu $m t$th r$r RFCPU $(ROCMFORGE_GPU=0 ./llama_run $B -b rocmforge -l ./libggml-rocmforge.so 2>>"$OUT/bench.err" | grep -o 'pp512=.*')"
            done
        done
    done | tee "$OUT/cpu.txt"
fi
