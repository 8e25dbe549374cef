#!/bin/bash
# The H100 run behind the README's GPU tables, as two device calls (the 98 MB model travels in
# parts). Call 1: stage binaries in /tmp/gc, build ggml-cuda from the pinned sources while the GPU
# tests run (test_ops --gpus, test_gpu_io, gpu_smoke), measure HBM bandwidth, 8B Q4_0 benchmark
# against ggml-cuda. Call 2 (within 30 s, /tmp kept): the real SmolLM2 fully on RFGPU0 vs ggml-cpu,
# the SmolLM2 benchmark against ggml-cuda, the 12 synthetic architecture models on RFGPU0.
#   carry .device-carry/common (bin/ = build/bin binaries + our .so, smol-tokenizer.gguf from
#   make_model --tokenizer-only) and .device-carry/final (ggml-src.tgz of the pinned llama.cpp,
#   model.partaa); call 2 carries .device-carry/final2 (model.partab, model.partac).
#   bench/gpu_h100_run.sh call1 | call2
set -u
case "${1:-}" in
call1)
    R=$PWD; C=$R/.device-carry/common; F=$R/.device-carry/final
    mkdir -p /tmp/gc && cp -a $C/bin/* $C/smol-tokenizer.gguf $F/model.partaa $R/bench/gpu_vs_ggml_cuda.sh $R/bench/gpu_membw.cu /tmp/gc/ && cd /tmp/gc
    export LD_LIBRARY_PATH=/tmp/gc ROCMFORGE_CACHE_DIR=/tmp/rfc RF_TEST_BIN_DIR=/tmp/gc RF_TEST_LIB=/tmp/gc/libggml-rocmforge.so
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
    mkdir -p src && tar xzf $F/ggml-src.tgz -C src
    ( time ./gpu_vs_ggml_cuda.sh build /tmp/gc/src /tmp/gc/build ) > $OUT/cuda-build.log 2>&1 &
    bpid=$!
    ./make_model --preset 8b --type q4_0 --tokenizer smol-tokenizer.gguf -o /tmp/gc/8b.gguf > $OUT/make8b.log 2>&1
    ( time timeout 240 ./test_ops --gpus ) > $OUT/test_ops.log 2>&1; echo "test_ops --gpus rc=$?"; grep -E "FAIL|cases:|GPU device|real" $OUT/test_ops.log | tail -6
    timeout 120 ./test_gpu_io > $OUT/gpu_io.log 2>&1; echo "test_gpu_io rc=$? $(tail -1 $OUT/gpu_io.log)"
    timeout 200 ./gpu_smoke ./libggml-rocmforge.so ./libggml-cpu.so > $OUT/smoke.log 2>&1; echo "gpu_smoke rc=$? $(grep -c '^ok\|PASS' $OUT/smoke.log) ok lines; $(grep -c FAIL $OUT/smoke.log) FAIL lines"
    wait $bpid; tail -4 $OUT/cuda-build.log
    nvcc -O3 -arch=sm_90 -o gpu_membw gpu_membw.cu && ./gpu_membw | tee $OUT/membw.log
    mkdir -p lib && cp libggml-base.so.0 libggml.so.0 libllama.so.0 libggml-cpu.so lib/
    PP=512 TG=64 REPS=2 ./gpu_vs_ggml_cuda.sh run 8b.gguf ./llama_run ./libggml-rocmforge.so ./lib /tmp/gc/build/bin/libggml-cuda.so 2>&1 | grep -E "backend=|^\|" | tee $OUT/bench8b.log
    ls -la 8b.gguf | awk '{print "8b.gguf bytes", $5}'
    ;;
call2)
    F2=$PWD/.device-carry/final2
    cd /tmp/gc || { echo "no /tmp/gc: machine went cold"; exit 1; }
    export LD_LIBRARY_PATH=/tmp/gc ROCMFORGE_CACHE_DIR=/tmp/rfc
    cat model.partaa $F2/model.partab $F2/model.partac > smol.gguf
    mkdir -p e2e
    timeout 200 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so smol.gguf e2e --fa both --threads 8 --device RFGPU0 > $OUT/e2e-smol.log 2>&1; echo "e2e SmolLM2 on RFGPU0 rc=$?"
    grep -E "fa=|FAIL|PASS" $OUT/e2e-smol.log | cut -c1-400
    ./gpu_vs_ggml_cuda.sh run smol.gguf ./llama_run ./libggml-rocmforge.so ./lib /tmp/gc/build/bin/libggml-cuda.so 2>&1 | grep -E "backend=|^\|" | tee $OUT/bench-smol.log
    for spec in llama:f16 qwen2:f16 qwen3:f16 gemma3:f16 qwen3moe:f16 llama:bf16 qwen3moe:bf16 llama:q8_0 llama:q4_0 qwen3moe:q4_0 qwen3:q4_k llama:q6_k; do
      a=${spec%:*} t=${spec#*:}; m=/tmp/gc/e2e/$a-$t.gguf; mkdir -p /tmp/gc/e2e/$a-$t
      ./make_model --arch $a --type $t --tokenizer smol.gguf -o $m 2>/dev/null
      timeout 60 ./test_llama_e2e ./llama_run ./libggml-rocmforge.so ./libggml-cpu.so $m /tmp/gc/e2e/$a-$t --fa both --threads 8 --min-stable 0 --device RFGPU0 > /tmp/gc/e2e-$a-$t.log 2>&1
      echo "e2e $spec rc=$?"
    done 2>&1 | tee $OUT/e2e-synth.log | tr '\n' ' '; echo
    ;;
*) echo "usage: $0 call1|call2" >&2; exit 2 ;;
esac
