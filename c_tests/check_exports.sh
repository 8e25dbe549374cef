#!/usr/bin/env bash
# The shared library exports ggml's loader entry points and the public C API, and nothing of the
# C API is missing from the header. Usage: check_exports.sh LIB HEADER
set -euo pipefail
lib=$1 header=$2
syms=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}')
fail=0
for s in ggml_backend_init ggml_backend_score ggml_backend_rocmforge_reg ggml_backend_rocmforge_cpu_init \
         ggml_backend_is_rocmforge ggml_backend_rocmforge_get_device_count \
         ggml_backend_rocmforge_get_device_description ggml_backend_rocmforge_get_device_memory \
         ggml_backend_rocmforge_set_n_threads ggml_backend_rocmforge_cpu_buffer_type \
         ggml_backend_rocmforge_hybrid_set_strategy ggml_backend_rocmforge_hybrid_set_vram_budget \
         ggml_backend_rocmforge_hybrid_set_telemetry ggml_backend_rocmforge_hybrid_telemetry_json \
         ggml_backend_rocmforge_capabilities_json ggml_backend_rocmforge_split_buffer_type; do
    grep -qx "$s" <<<"$syms" || { echo "missing export: $s"; fail=1; }
done
# Every exported ggml_backend_rocmforge_* / ggml_backend_is_rocmforge function is declared in the header.
for s in $(grep -E '^ggml_backend_(rocmforge_|is_rocmforge)' <<<"$syms"); do
    grep -q "\b$s(" "$header" || { echo "exported but not in the header: $s"; fail=1; }
done
echo "$(wc -l <<<"$syms") exported functions checked"
exit $fail
