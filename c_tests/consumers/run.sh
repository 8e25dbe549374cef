#!/usr/bin/env bash
# Installs the build into a fresh prefix and builds and runs the two consumer programs against
# it: consumers/cmake (find_package(rocmforge)) and consumers/pkgconfig (pkg-config). Also checks
# the installed files (soname links, header versions) and that the CMake package refuses a ggml
# of another version.   run.sh <build dir> [cmake]
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=${2:-cmake}
here=$(cd "$(dirname "$0")" && pwd)
work=$build/consumers
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }

# The library, its soname links and what it says about itself.
lib=$prefix/lib
ver=$(sed -n 's/^#define GGML_ROCMFORGE_VERSION "\(.*\)"$/\1/p' "$prefix/include/ggml-rocmforge.h")
ggml_ver=$(sed -n 's/^#define GGML_ROCMFORGE_GGML_VERSION "\(.*\)"$/\1/p' "$prefix/include/ggml-rocmforge.h")
[ -n "$ver" ] && [ -n "$ggml_ver" ] || fail "installed header states no versions"
major=${ver%%.*}
[ -f "$lib/libggml-rocmforge.so.$ver" ] && [ ! -L "$lib/libggml-rocmforge.so.$ver" ] || fail "lib/libggml-rocmforge.so.$ver"
[ "$(readlink "$lib/libggml-rocmforge.so.$major")" = "libggml-rocmforge.so.$ver" ] || fail "soname link"
[ "$(readlink "$lib/libggml-rocmforge.so")" = "libggml-rocmforge.so.$major" ] || fail "link-time name"
soname=$(readelf -d "$lib/libggml-rocmforge.so.$ver" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libggml-rocmforge.so.$major" ] || fail "soname is '$soname'"
for f in lib/cmake/rocmforge/rocmforgeConfig.cmake lib/cmake/rocmforge/rocmforgeConfigVersion.cmake \
         lib/pkgconfig/rocmforge.pc lib/cmake/ggml/ggml-config.cmake include/ggml.h; do
    [ -f "$prefix/$f" ] || fail "$f not installed"
done
echo "installed: libggml-rocmforge.so.$ver (soname $soname), built for ggml $ggml_ver"

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

# find_package(rocmforge REQUIRED)
"$cmake" -S "$here/cmake" -B "$work/cmake" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configure (find_package)"; }
"$cmake" --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "build (find_package)"; }
readelf -d "$work/cmake/consumer" | grep -q "NEEDED.*\[libggml-rocmforge.so.$major\]" || fail "consumer does not need the soname"
echo "--- find_package consumer"
"$work/cmake/consumer" || fail "find_package consumer"

# A process whose ggml says it is another release: the library refuses to register, and says why.
printf 'const char * ggml_version(void) { return "0.99.0"; }\n' >"$work/other_ggml.c"
cc -shared -fPIC -o "$work/libother_ggml.so" "$work/other_ggml.c"
if LD_PRELOAD="$work/libother_ggml.so" "$work/cmake/consumer" >"$work/other_ggml.log" 2>&1; then
    cat "$work/other_ggml.log"; fail "registered in a process running ggml 0.99.0"
fi
grep -q "built for ggml $ggml_ver (backend API 3) but this process runs ggml 0.99.0" "$work/other_ggml.log" \
    || { cat "$work/other_ggml.log"; fail "no clear message for a host on ggml 0.99.0"; }
echo "host on ggml 0.99.0 refused: $(grep -o "rocmforge.*runs ggml 0.99.0" "$work/other_ggml.log")"

# pkg-config --cflags --libs rocmforge
command -v pkg-config >/dev/null || fail "pkg-config missing (scripts/install-deps.sh installs it)"
export PKG_CONFIG_PATH=$lib/pkgconfig
echo "pkg-config --cflags --libs rocmforge: $(pkg-config --cflags --libs rocmforge)"
[ "$(pkg-config --modversion rocmforge)" = "$ver" ] || fail "pkg-config version"
mkdir -p "$work/pkgconfig"
make -s -C "$here/pkgconfig" OUT="$work/pkgconfig" >"$work/pkgconfig.log" 2>&1 || { cat "$work/pkgconfig.log"; fail "build (pkg-config)"; }
echo "--- pkg-config consumer"
"$work/pkgconfig/consumer" || fail "pkg-config consumer"

# The package combined with another ggml: a prefix where ggml says it is 0.99.0.
other=$work/prefix-other-ggml
mkdir -p "$other/lib/cmake"
cp -rs "$prefix/include" "$other/include"
cp -rs "$lib/cmake/rocmforge" "$other/lib/cmake/rocmforge"
cp -rs "$lib"/lib*.so* "$other/lib/"
cp -r "$lib/cmake/ggml" "$other/lib/cmake/ggml"
sed -i "s/\"$ggml_ver\"/\"0.99.0\"/" "$other/lib/cmake/ggml/ggml-config-version.cmake"
if "$cmake" -S "$here/cmake" -B "$work/cmake-other" "${gen[@]}" -DCMAKE_PREFIX_PATH="$other" \
        >"$work/cmake-other.log" 2>&1; then
    fail "find_package(rocmforge) accepted ggml 0.99.0"
fi
msg=$(tr -s ' \n' ' ' <"$work/cmake-other.log" | grep -o "rocmforge $ver was built for ggml $ggml_ver [^:]* is 0.99.0") \
    || { cat "$work/cmake-other.log"; fail "no clear message for another ggml"; }
echo "another ggml refused: $msg"
echo "consumers: OK"
