#!/bin/sh
# Runs the Rust unit tests built for aarch64 under qemu-user, so the NEON kernels are tested on
# an x86 machine. Exits 2 ("skipped") without the aarch64 Rust target, the cross linker or
# qemu-aarch64 (Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
# qemu-user; rustup target add aarch64-unknown-linux-gnu). Extra arguments go to the test binary
# (a name filter, --nocapture, ...); QEMU_CPU=<model> runs on that CPU model only. Builds in
# target/aarch64-qemu unless CARGO_TARGET_DIR is set.
set -eu
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
LINKER=${AARCH64_LINKER:-aarch64-linux-gnu-gcc}
SYSROOT=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
skip() { echo "skipped: $*"; exit 2; }
command -v cargo >/dev/null 2>&1 || skip "cargo not found"
rustc --print sysroot >/dev/null 2>&1 && [ -d "$(rustc --print sysroot)/lib/rustlib/$TARGET/lib" ] \
    || skip "Rust target $TARGET not installed (rustup target add $TARGET)"
command -v "$LINKER" >/dev/null 2>&1 || skip "cross linker $LINKER not found (apt-get install gcc-aarch64-linux-gnu)"
[ -d "$SYSROOT/lib" ] || skip "aarch64 libc not found in $SYSROOT (apt-get install libc6-dev-arm64-cross)"
command -v qemu-aarch64 >/dev/null 2>&1 || skip "qemu-aarch64 not found (apt-get install qemu-user)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/aarch64-qemu}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="$LINKER"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"
run() { cargo test --release --lib --target "$TARGET" -- "$@"; }
[ -n "${QEMU_CPU:-}" ] && { run "$@"; exit; }
# qemu's "max" CPU has SDOT and FP16, a Cortex-A53 (ARMv8.0) neither: every way through the
# run-time dispatch gets tested.
QEMU_CPU=max run "$@"
echo "again on a Cortex-A53 (no SDOT, no FP16):"
QEMU_CPU=cortex-a53 run "$@"
