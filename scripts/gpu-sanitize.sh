#!/bin/bash
# GPU correctness runs on an NVIDIA machine: the GPU tests, the concurrency stress test, and
# compute-sanitizer (memcheck and racecheck) over test_ops --gpus and the stress test.
#
#   scripts/gpu-sanitize.sh BIN_DIR tests      test_gpu_io, test_ops --gpus, gpu_smoke,
#                                              test_stress --device RFGPU0 (GRAPHS, default 10000)
#   scripts/gpu-sanitize.sh BIN_DIR sanitize   memcheck + racecheck over test_ops on RFGPU0
#                                              (OPS_FILTER: a case-label substring, default all)
#                                              (RACE_FILTER for racecheck, default OPS_FILTER)
#                                              and test_stress (SAN_GRAPHS, default 300;
#                                              RACE_GRAPHS for racecheck, default 100);
#                                              OPS_TIME / STRESS_TIME: time limits (500 / 300 s)
#   scripts/gpu-sanitize.sh BIN_DIR all        both
#
# BIN_DIR holds build/bin's test binaries, libggml-base/libggml/libggml-cpu and
# libggml-rocmforge.so. Logs go to $LOG_DIR (default ./gpu-logs, or $OUT on the device tool).
# Kernels are cached in $ROCMFORGE_CACHE_DIR (default a fresh temporary directory: the first
# test compiles them, ~100 s).
set -u
BIN=$(cd "${1:?BIN_DIR}" && pwd)
MODE=${2:-all}
LOG=${LOG_DIR:-${OUT:-./gpu-logs}}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RF_TEST_BIN_DIR=$BIN RF_TEST_LIB=$BIN/libggml-rocmforge.so
export ROCMFORGE_CACHE_DIR=${ROCMFORGE_CACHE_DIR:-$(mktemp -d)}
cd "$BIN" || exit 2
status=0

run() {  # name timeout command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && status=1
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    grep -E "PASS|FAIL|MISMATCH|graphs compared|cases|ERROR SUMMARY|RACECHECK SUMMARY|skipped|nmse|over 5e-4|out of memory" "$LOG/$name.log" | tail -12
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
    run test_gpu_io 300 ./test_gpu_io
    run test_stress_gpu 200 ./test_stress --device RFGPU0 --graphs "${GRAPHS:-10000}"
    run test_ops_gpus 240 ./test_ops --gpus
    run gpu_smoke 150 ./gpu_smoke ./libggml-rocmforge.so ./libggml-cpu.so
fi
if [ "$MODE" = sanitize ] || [ "$MODE" = all ]; then
    CS=${COMPUTE_SANITIZER:-compute-sanitizer}
    # Our kernels are loaded from nvrtc images; the driver API calls are what is checked too.
    run memcheck_test_ops ${OPS_TIME:-500} $CS --tool memcheck --error-exitcode 3 ./test_ops --device RFGPU0 ${OPS_FILTER:-}
    run memcheck_stress ${STRESS_TIME:-300} $CS --tool memcheck --error-exitcode 3 ./test_stress --device RFGPU0 --threads 4 --graphs "${SAN_GRAPHS:-300}"
    # racecheck loses track of launches made with programmatic dependent launch ("Internal
    # Sanitizer Error: Detected a failure to track a kernel launch", counted as an error), so it
    # runs with PDL off; shared-memory hazards, what it looks for, lie inside one block either way.
    export ROCMFORGE_GPU_PDL=0
    run racecheck_test_ops ${OPS_TIME:-500} $CS --tool racecheck --error-exitcode 3 ./test_ops --device RFGPU0 ${RACE_FILTER:-${OPS_FILTER:-}}
    run racecheck_stress ${STRESS_TIME:-300} $CS --tool racecheck --error-exitcode 3 ./test_stress --device RFGPU0 --threads 2 --graphs "${RACE_GRAPHS:-100}"
fi
echo "gpu-sanitize: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
