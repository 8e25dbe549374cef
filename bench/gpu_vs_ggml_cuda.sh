#!/bin/sh
# rocmforge's RFGPU0 against ggml's own CUDA backend on one NVIDIA GPU: llama_run bench
# (pp and tg tokens/s, best of REPS) for both, then the ratio rocmforge / ggml-cuda.
#
#   bench/gpu_vs_ggml_cuda.sh build SRC BUILD     builds libggml-cuda.so from the pinned
#       llama.cpp sources SRC (needs nvcc, cmake, ninja) into BUILD/bin (sm_90 by default;
#       CUDA_ARCH=80 etc. for others)
#   bench/gpu_vs_ggml_cuda.sh run MODEL LLAMA_RUN ROCMFORGE_SO GGML_BIN CUDA_SO
#       GGML_BIN: directory with libggml-base.so, libggml.so, libllama.so, libggml-cpu.so
#       (the reference build llama_run was linked against); CUDA_SO: libggml-cuda.so of the
#       same sources. Env: PP (512), TG (128), REPS (3), THREADS (8).
set -eu
mode=${1:-}
case "$mode" in
build)
    src=$2 build=$3
    cmake -G Ninja -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF >"$build.cmake.log" 2>&1 || { tail -30 "$build.cmake.log"; exit 1; }
    cmake --build "$build" --target ggml-cuda -j"$(nproc)"
    ls -la "$build"/bin/libggml-cuda.so
    ;;
run)
    model=$2 exe=$3 rf_so=$4 gbin=$5 cuda_so=$6
    pp=${PP:-512} tg=${TG:-128} reps=${REPS:-3} thr=${THREADS:-8}
    export LD_LIBRARY_PATH="$gbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    out=$(mktemp)
    for fa in on off; do
        "$exe" bench -b ggml-cuda -l "$cuda_so" -L "$gbin/libggml-cpu.so" -m "$model" --device CUDA0 --fa $fa \
            -t "$thr" --pp "$pp" --tg "$tg" --reps "$reps" | sed "s/^/fa=$fa /" | tee -a "$out"
        "$exe" bench -b rocmforge -l "$rf_so" -m "$model" --device RFGPU0 --fa $fa \
            -t "$thr" --pp "$pp" --tg "$tg" --reps "$reps" | sed "s/^/fa=$fa /" | tee -a "$out"
    done
    # Ratio table: rocmforge / ggml-cuda per fa setting.
    awk -v pp="pp$pp" -v tg="tg$tg" '
        { fa=$1; be=""; for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "backend") be = kv[2];
              if (kv[1] == pp) P[fa, be] = kv[2]; if (kv[1] == tg) T[fa, be] = kv[2]; } }
        END { printf "\n| %-6s | %-12s | %-12s | %-8s |\n", "", "ggml-cuda", "RFGPU0", "ratio";
              for (f = 0; f < 2; f++) { fa = f == 0 ? "fa=on" : "fa=off";
                  printf "| %-6s | %12.1f | %12.1f | %8.3f |  %s %s\n", pp, P[fa, "ggml-cuda"], P[fa, "rocmforge"], P[fa, "rocmforge"] / P[fa, "ggml-cuda"], fa, "tokens/s";
                  printf "| %-6s | %12.1f | %12.1f | %8.3f |  %s %s\n", tg, T[fa, "ggml-cuda"], T[fa, "rocmforge"], T[fa, "rocmforge"] / T[fa, "ggml-cuda"], fa, "tokens/s"; } }' "$out"
    rm -f "$out"
    ;;
*)
    echo "usage: $0 build SRC BUILD | run MODEL LLAMA_RUN ROCMFORGE_SO GGML_BIN CUDA_SO" >&2
    exit 2
    ;;
esac
