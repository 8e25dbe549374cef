#!/usr/bin/env bash
# make_model --threads: each chunk of rows has its own generator, so two runs with 2 threads and one
# with 3 write the same file whichever thread takes which chunk; the layout (size) is the one thread's.
# gpt-oss mxfp4: F32, F16 and quantized tensors, 3-D experts.
#   check_make_model_threads.sh MAKE_MODEL TOKENIZER_SRC.gguf
set -euo pipefail
mk=$1 tok=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gen() { "$mk" --arch gpt-oss --type mxfp4 --tokenizer "$tok" -o "$dir/$1.gguf" --threads "$2" 2>/dev/null; }
gen one 1
gen two_a 2
gen two_b 2
gen three 3
cmp "$dir/two_a.gguf" "$dir/two_b.gguf" || { echo "FAIL: two runs with 2 threads differ"; exit 1; }
cmp "$dir/two_a.gguf" "$dir/three.gguf" || { echo "FAIL: 2 and 3 threads differ"; exit 1; }
[ "$(stat -c %s "$dir/one.gguf")" = "$(stat -c %s "$dir/two_a.gguf")" ] || { echo "FAIL: size differs from 1 thread's"; exit 1; }
echo "make_model --threads 2, 2, 3: identical files ($(stat -c %s "$dir/two_a.gguf") bytes)"
