#!/bin/sh
# Compiles every kernels/*.hip offline for two AMD targets (CDNA2 wave64, RDNA2 wave32) with
# hipcc, so the HIP side of the kernels is checked without an AMD GPU. Fails on any error.
# Needs hipcc (Debian/Ubuntu: apt-get install hipcc). Extra targets: HIP_ARCHS="gfx90a gfx1100".
set -eu
cd "$(dirname "$0")/.."
HIPCC=${HIPCC:-hipcc}
ARCHS=${HIP_ARCHS:-"gfx90a gfx1030"}
command -v "$HIPCC" >/dev/null 2>&1 || { echo "check-hip-kernels: $HIPCC not found" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for f in kernels/*.hip; do
    for arch in $ARCHS; do
        name=$(basename "$f" .hip)
        if "$HIPCC" --genco --offload-arch="$arch" -O3 -Werror -Ikernels "$f" -o "$out/$name-$arch.co"; then
            echo "ok    $f ($arch)"
        else
            echo "FAIL  $f ($arch)" >&2
            status=1
        fi
    done
done
exit $status
