#!/usr/bin/env bash
# Installs the build tools the project needs when they are missing (Debian/Ubuntu, as root):
# cmake and ninja for the ggml build, hipcc to check that the HIP kernels compile for AMD.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v hipcc >/dev/null 2>&1 || need+=(hipcc)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
else
    echo "missing tools: ${need[*]} (install them; not root or no apt)" >&2
    for t in "${need[@]}"; do [ "$t" = hipcc ] || exit 1; done
fi
