#!/usr/bin/env bash
# The C tests built with AddressSanitizer + UndefinedBehaviorSanitizer and run against the
# built ggml and libggml-rocmforge.so; any sanitizer report fails the run. Then the leak check:
# 100 ggml_backend_load / ggml_backend_unload cycles under LeakSanitizer (no thread left, RSS
# flat within 1 MiB, no leak).
#
# What is instrumented: the C tests (the host's side of every call: graphs, tensors, buffers
# it hands us, what it reads back). ggml and the Rust library are not: the Rust library
# would need nightly (-Zsanitizer=address), which CI does not have. Its heap still goes
# through ASan's malloc (it uses the system allocator), so LeakSanitizer sees its leaks, ASan
# sees double frees and frees of foreign memory, and a write by the library into the host's
# instrumented memory (the tests' arrays) is caught where the host reads it back... but not
# a stray write by uninstrumented code itself; test_fuzz's guard bytes cover that for RFCPU.
#
# Usage: scripts/sanitize.sh [BUILD_DIR]   (default build; cmake must have built it). ctest
# runs it as the test "sanitize" (label "sanitize").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-${BUILD_DIR:-build}}
BIN=$(cd "$BUILD_DIR/bin" && pwd)
LIB=$BIN/libggml-rocmforge.so
GGML_SRC=$(sed -n 's/^GGML_SOURCE_DIR:PATH=//p' "$BUILD_DIR/CMakeCache.txt")
mkdir -p "$BUILD_DIR/sanitize"
OUT=$(cd "$BUILD_DIR/sanitize" && pwd)
[ -f "$LIB" ] || { echo "sanitize: $LIB missing: build first"; exit 1; }

CC=${CC:-cc}
# Without the sanitizer runtimes (libasan, libubsan) there is nothing to run: skip (exit 2).
if ! echo 'int main(void){return 0;}' | $CC -x c - -fsanitize=address,undefined -o "$OUT/probe" 2>/dev/null; then
    echo "sanitize: skipped: $CC cannot link -fsanitize=address,undefined"
    exit 2
fi
CFLAGS=(-std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
        -D_POSIX_C_SOURCE=200809L "-DROCMFORGE_LIB_PATH=\"$LIB\"" "-DROCMFORGE_BIN_DIR=\"$BIN\""
        -I"$GGML_SRC/ggml/include" -I"$GGML_SRC/ggml/src" -Iinclude)
LDFLAGS=(-fsanitize=address,undefined -L"$BIN" -lggml -lggml-base -lm -ldl -Wl,-rpath,"$BIN")

# allocator_may_return_null: the tests ask for absurd buffers (2^62 bytes) and expect NULL,
# which ASan would otherwise report as a fatal error instead of returning it.
# RFCPU only: the GPU vendor drivers are closed, uninstrumented and keep allocations LSan
# would report; the GPU paths are exercised by the GPU tests and compute-sanitizer instead.
export ROCMFORGE_GPU=0
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:halt_on_error=1:exitcode=23:${ASAN_OPTIONS:-}
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=23:${UBSAN_OPTIONS:-}
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}

fail=0
run() {  # name, args...
    local name=$1
    shift
    local t0=$SECONDS
    if (cd "$BIN" && "$OUT/$name" "$@") >"$OUT/$name.log" 2>&1 &&
        ! grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$OUT/$name.log"; then
        echo "sanitize: $name $* passed ($((SECONDS - t0)) s)"
    else
        echo "sanitize: $name $* FAILED ($((SECONDS - t0)) s); its log:"
        grep -E "Sanitizer|runtime error|FAIL|SUMMARY|^ +#[0-9]" "$OUT/$name.log" | head -60
        fail=1
    fi
}

for t in test_bad_input test_fuzz test_load test_sched test_ops test_load_cycles; do
    $CC "${CFLAGS[@]}" "c_tests/$t.c" c_tests/common.c -o "$OUT/$t" "${LDFLAGS[@]}"
done

run test_bad_input
run test_fuzz --iters 20000 --seed 7 --cpu-only
run test_load
run test_sched
# A reduced catalog: the matrix products, attention and row ops (the cases with the most
# host-side index and buffer handling).
run test_ops MUL_MAT
run test_ops GET_ROWS
run test_ops SET_ROWS
# No quarantine here: ASan holds freed memory back (256 MiB by default), which the test's
# flat-RSS check would count as growth.
ASAN_OPTIONS=quarantine_size_mb=0:$ASAN_OPTIONS run test_load_cycles 100
exit $fail
