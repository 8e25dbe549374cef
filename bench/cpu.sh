#!/usr/bin/env bash
# RFCPU against ggml-cpu's best build for this machine, back to back in one invocation, same model,
# same threads. Every ggml-cpu variant is built (ROCMFORGE_GGML_CPU_ALL_VARIANTS=ON, in its own build
# directory, so build/ keeps the single AVX2 build the tests use) and the variant ggml itself would load
# (highest ggml_backend_score, as ggml_backend_load_best picks it) is used and named. Each step prints
# the rows of the ratio table that docs/performance.md shows.
#
#   STEPS="build smol" bench/cpu.sh          (default STEPS: build smol)
#
# Steps:
#   build    configure and build BENCH_BUILD_DIR (default build-bench) with every ggml-cpu variant
#            (ggml-cpu compiled 14 times on x86-64: on two cores, count on half an hour the first time)
#   smol     SmolLM2-135M-Instruct Q4_1 (MODEL), pp PP (512) and tg TG (128), best of REPS (3)
#   8b       an 8B-class llama (Llama-3-8B shapes: 32 layers, 4096 wide, GQA 32/8, FFN 14336; SmolLM2's
#            vocabulary; random Q4_0 weights; writes models/llama-8b-q4_0.gguf, 4.2 GB, once): pp32 and
#            tg16, best of 2, and the share of the machine's read bandwidth each reaches (every weight
#            but the embedding table is read once a generated token)
#   threads  SmolLM2 pp256 / tg64 at each of THREAD_LIST (default: 1 2 4 ... up to the cores)
#   repack   RFCPU's load-time repack (RFCPU_REPACK) off and on against ggml-cpu, interleaved: an 8B-class
#            llama with REPACK_LAYERS (8) of its 32 layers and the 1B-class one (16 layers), Q4_0 and Q4_K,
#            pp PP (512) and tg TG (32), best of REPS (2), ROUNDS (2) rounds; the models are written once
#            to REPACK_MODELS (default models/; 1.2 GB each for the 8B-class, 0.6 GB for the 1B-class);
#            REPACK_TYPES (default "q4_0 q4_k"; q8_0, q6_k: make_model's types) and REPACK_SPECS
#            (default "8b:REPACK_LAYERS 1b:16", preset:layers) pick other models
# Env: THREADS (default: the machine's cores), JOBS (build jobs, default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-"build smol"}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
build=${BENCH_BUILD_DIR:-build-bench}
bin=$build/bin
threads=${THREADS:-$(nproc)}
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log=$(mktemp /tmp/bench-cpu.XXXXXX.log)  # llama_run's stderr

if has build; then
    scripts/install-deps.sh
    scripts/fetch-model.sh
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DROCMFORGE_GGML_CPU_ALL_VARIANTS=ON
    cmake --build "$build" -j "${JOBS:-$(nproc)}"
fi
[ -x "$bin/llama_run" ] || { echo "no $bin/llama_run: run with STEPS=build first" >&2; exit 1; }

# The ggml-cpu library ggml_backend_load_best would load here: the variant with the highest score
# (0 = this CPU lacks its instructions). A build without variants has one libggml-cpu.so.
ggml_cpu=$(python3 - "$bin" <<'PY'
import ctypes, glob, os, sys
best = None
for path in sorted(glob.glob(os.path.join(sys.argv[1], "libggml-cpu*.so"))):
    try:
        score_fn = ctypes.CDLL(path).ggml_backend_score
    except (OSError, AttributeError):
        score = 1  # no score function: a single build, usable on any machine it was built for
    else:
        score_fn.restype = ctypes.c_int
        score = score_fn()
    if score > 0 and (best is None or score > best[0]):
        best = (score, path)
if best is None:
    sys.exit("no usable libggml-cpu*.so in " + sys.argv[1])
print(best[1])
PY
)
variant=$(basename "$ggml_cpu" .so)
variant=${variant#libggml-cpu}
variant=${variant#-}
echo "ggml-cpu variant loaded: ${variant:-single build} ($ggml_cpu)"
echo "RFCPU SIMD level: ${ROCMFORGE_SIMD:-best the CPU has}; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"

# bench LABEL BACKEND LIB MODEL THREADS PP TG REPS: one llama_run bench line, prefixed with LABEL.
bench() {
    "$bin/llama_run" bench -b "$2" -l "$3" -m "$4" -t "$5" --pp "$6" --tg "$7" --reps "$8" 2>>"$log" | sed "s/^/$1 /" ||
        { echo "llama_run failed ($2, $4): see $log" >&2; return 1; }
}
# table [BW_GBPS BYTES_PER_TOKEN] < lines: one row per (label, test), ggml-cpu against RFCPU.
table() {
    python3 -c '
import sys
bw, nbytes = (float(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (0, 0)
rows = {}
for line in sys.stdin:
    label, *kvs = line.split()
    kv = dict(x.split("=", 1) for x in kvs if "=" in x)
    for k, v in kv.items():
        if k.startswith(("pp", "tg")):
            rows.setdefault((label, kv.get("threads", "?"), k), {})[kv["backend"]] = float(v)
print("| model | threads | test | ggml-cpu | RFCPU | ratio |" + (" share of read bandwidth |" if bw else ""))
print("| --- | --- | --- | --- | --- | --- |" + (" --- |" if bw else ""))
for (label, thr, test), r in rows.items():
    a, b = r.get("ggml-cpu", 0), r.get("rocmforge", 0)
    line = f"| {label} | {thr} | {test} | {a:.2f} t/s | {b:.2f} t/s | {b / a if a else 0:.2f}x |"
    if bw:
        line += f" ggml-cpu {a * nbytes / 1e9 / bw:.0%}, RFCPU {b * nbytes / 1e9 / bw:.0%} |" if test.startswith("tg") else " |"
    print(line)
' "$@"
}

if has smol; then
    {
        bench SmolLM2 ggml-cpu "$ggml_cpu" "$model" "$threads" "${PP:-512}" "${TG:-128}" "${REPS:-3}"
        bench SmolLM2 rocmforge "$bin/libggml-rocmforge.so" "$model" "$threads" "${PP:-512}" "${TG:-128}" "${REPS:-3}"
    } | tee /dev/stderr | table
fi

if has 8b; then
    m8=models/llama-8b-q4_0.gguf
    [ -f "$m8" ] || "$bin/make_model" --preset 8b --tokenizer "$model" -o "$m8" --type q4_0 --threads "$(nproc)"
    bw=$("$bin/membw" "$threads" 2048 | sed -n 's/.*read=\([0-9.]*\) GB\/s/\1/p')
    # Weight bytes per token: the file less the embedding table (49152 rows of 4096 Q4_0 values).
    bytes=$(($(stat -c %s "$m8") - 49152 * 4096 * 18 / 32))
    echo "memory read bandwidth $bw GB/s, $((bytes / 1000000)) MB of weights read per token"
    {
        bench 8B-class-Q4_0 ggml-cpu "$ggml_cpu" "$m8" "$threads" 32 16 2
        bench 8B-class-Q4_0 rocmforge "$bin/libggml-rocmforge.so" "$m8" "$threads" 32 16 2
    } | tee /dev/stderr | table "$bw" "$bytes"
fi

if has repack; then
    dir=${REPACK_MODELS:-models}
    layers=${REPACK_LAYERS:-8}
    rounds=${ROUNDS:-2}
    for spec in ${REPACK_SPECS:-8b:$layers 1b:16}; do
        preset=${spec%%:*}
        for t in ${REPACK_TYPES:-q4_0 q4_k}; do
            m=$dir/llama-$preset-${spec#*:}l-$t.gguf
            [ -f "$m" ] || "$bin/make_model" --preset "$preset" --layers "${spec#*:}" --type "$t" --threads "$(nproc)" \
                --tokenizer "$model" -o "$m"
            label=$preset-class-${spec#*:}L-$t
            for r in $(seq "$rounds"); do
                bench "$label" ggml-cpu "$ggml_cpu" "$m" "$threads" "${PP:-512}" "${TG:-32}" "${REPS:-2}"
                ROCMFORGE_CPU_REPACK=0 bench "$label-plain" rocmforge "$bin/libggml-rocmforge.so" "$m" "$threads" "${PP:-512}" "${TG:-32}" "${REPS:-2}"
                ROCMFORGE_CPU_REPACK=all bench "$label-repack" rocmforge "$bin/libggml-rocmforge.so" "$m" "$threads" "${PP:-512}" "${TG:-32}" "${REPS:-2}"
            done
        done
    done | tee /dev/stderr | python3 -c '
# One row per (model, test, round): ggml-cpu, RFCPU with the repack off and on, the ratios.
import sys
rows, seen = [], {}
for line in sys.stdin:
    label, *kvs = line.split()
    kv = dict(x.split("=", 1) for x in kvs if "=" in x)
    base = label.rsplit("-", 1)[0] if label.endswith(("-plain", "-repack")) else label
    who = "ggml" if kv["backend"] == "ggml-cpu" else label.rsplit("-", 1)[1]
    for k, v in kv.items():
        if k.startswith(("pp", "tg")):
            key = (base, k)
            n = seen.setdefault((key, who), 0)
            seen[(key, who)] = n + 1
            while len(rows) <= n or key not in rows[n]:
                if len(rows) <= n: rows.append({})
                else: rows[n][key] = {}
            rows[n][key][who] = float(v)
print("| model | test | round | ggml-cpu | RFCPU plain | RFCPU repack | plain/ggml | repack/ggml | repack/plain |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for n, rr in enumerate(rows):
    for (base, test), r in rr.items():
        g, p, q = r.get("ggml", 0), r.get("plain", 0), r.get("repack", 0)
        f = lambda a, b: f"{a / b:.2f}x" if b else "-"
        print(f"| {base} | {test} | {n + 1} | {g:.2f} | {p:.2f} | {q:.2f} | {f(p, g)} | {f(q, g)} | {f(q, p)} |")
'
fi

if has threads; then
    list=${THREAD_LIST:-}
    if [ -z "$list" ]; then
        t=1
        while [ "$t" -le "$(nproc)" ]; do list="$list $t"; t=$((t * 2)); done
    fi
    for t in $list; do
        bench SmolLM2 ggml-cpu "$ggml_cpu" "$model" "$t" 256 64 3
        bench SmolLM2 rocmforge "$bin/libggml-rocmforge.so" "$model" "$t" 256 64 3
    done | tee /dev/stderr | table
fi
