#!/usr/bin/env bash
# Installs the build tools the project needs when they are missing (Debian/Ubuntu, as root):
# cmake and ninja for the ggml build, pkg-config for a consumer of the install tree, hipcc to
# check that the HIP kernels compile for AMD, and an aarch64 cross toolchain with qemu-user to
# run the unit tests (NEON kernels) for aarch64.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v hipcc >/dev/null 2>&1 || need+=(hipcc)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
[ -d /usr/aarch64-linux-gnu/lib ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
# The tests that need these skip without them, so only the others are required.
optional=" hipcc gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user "
# Best effort: fails offline or without rustup, and then the aarch64 tests skip.
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || echo "could not add the Rust target aarch64-unknown-linux-gnu" >&2
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
else
    echo "missing tools: ${need[*]} (install them; not root or no apt)" >&2
    for t in "${need[@]}"; do [[ $optional == *" $t "* ]] || exit 1; done
fi
