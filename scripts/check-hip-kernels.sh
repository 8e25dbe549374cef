#!/bin/sh
# Compiles every kernel group offline for two AMD targets (CDNA2 wave64, RDNA2 wave32) with
# hipcc, so the HIP side of the kernels is checked without an AMD GPU. The groups are the
# programs the library compiles (src/gpu/kernel_groups.rs, written out with their -D options
# by the ignored unit test write_group_sources), each on its own: a group that misses a
# definition fails here. Fails on any error.
# Needs hipcc (Debian/Ubuntu: apt-get install hipcc) and cargo. Extra targets:
# HIP_ARCHS="gfx90a gfx1100". Jobs: HIP_JOBS (default: the number of cores).
set -eu
cd "$(dirname "$0")/.."
HIPCC=${HIPCC:-hipcc}
ARCHS=${HIP_ARCHS:-"gfx90a gfx1030"}
command -v "$HIPCC" >/dev/null 2>&1 || { echo "check-hip-kernels: $HIPCC not found" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ROCMFORGE_KERNEL_GROUPS_OUT="$out/groups" "${CARGO:-cargo}" test -q --release --lib \
    gpu::kernel_groups::tests::write_group_sources -- --ignored --exact >/dev/null
# One line per (group, target): compiled by `sh -c` below, in parallel.
for src in "$out"/groups/*.hip; do
    for arch in $ARCHS; do
        echo "$src $arch"
    done
done >"$out/jobs"
export HIPCC out
xargs -P "${HIP_JOBS:-$(nproc)}" -L 1 sh -c '
    src=$1 arch=$2 name=$(basename "$1" .hip)
    start=$(date +%s.%N)
    # shellcheck disable=SC2046 # the options are words
    if "$HIPCC" --genco --offload-arch="$arch" -O3 -Werror $(cat "${src%.hip}.opts") "$src" \
        -o "$out/$name-$arch.co" 2>"$out/$name-$arch.log"; then
        awk -v n="$name" -v a="$arch" -v s="$start" -v e="$(date +%s.%N)" \
            "BEGIN { printf \"ok    %-24s %-8s %5.1f s\\n\", n, a, e - s }"
    else
        cat "$out/$name-$arch.log" >&2
        echo "FAIL  $name ($arch)" >&2
        touch "$out/failed"
    fi
' sh <"$out/jobs"
[ ! -e "$out/failed" ]
