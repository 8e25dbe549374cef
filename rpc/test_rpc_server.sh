#!/usr/bin/env bash
# rocmforge-rpc-server end to end (ctest rpc_server_e2e):
#   test_rpc_server.sh SERVER LLAMA_RUN BIN_DIR MODEL WORK_DIR
# 1. an unknown device is refused with the list of available ones;
# 2. the server starts on a free loopback port (--port 0; it prints the port) with a tensor cache;
# 3. a second server on that port is refused with "in use";
# 4. a client killed in the middle of its work does not end the server (its replies then fail with
#    EPIPE, not SIGPIPE); then SmolLM2 through libllama in a client process (ggml-cpu + the RPC device, every layer on it):
#    16 greedy tokens, the same as a local RFCPU run's;
# 5. the tied output weights (> 10 MiB) went through ggml's tensor cache into --cache DIR;
# 6. off loopback the server warns; SIGINT and SIGTERM stop the server with status 0, and a cache
#    file written in the run that does not hash to its name (a write cut by the stop) is removed
#    then, a good one kept.
set -u
server=$1 llama_run=$2 bin=$3 model=$4 work=$5
rm -rf "$work"
mkdir -p "$work"
spid=""
fail() {
    echo "rpc_server_e2e: FAIL: $*"
    for f in server.log client.log; do [ -f "$work/$f" ] && { echo "--- $f"; tail -n 30 "$work/$f"; }; done
    [ -n "$spid" ] && kill -9 "$spid" 2>/dev/null
    exit 1
}
[ -f "$model" ] || fail "test model $model missing (scripts/fetch-model.sh)"

# Waits up to $2 seconds for the server $1 to print its "listening on" line into $3.
wait_listening() {
    for _ in $(seq 1 $(($2 * 10))); do
        grep -qs "listening on" "$3" && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# 1. unknown device
out=$("$server" --device NOPE 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "unknown device 'NOPE'" <<<"$out" && grep -q "RFCPU" <<<"$out" ||
    fail "unknown device: status $rc, output: $out"
echo "unknown device refused: $(grep -A9 "unknown device" <<<"$out")"

# 2. the server on a free loopback port
"$server" --host 127.0.0.1 --port 0 --device RFCPU --threads 2 --cache "$work/cache" >"$work/server.log" 2>&1 &
spid=$!
wait_listening "$spid" 60 "$work/server.log" || fail "server did not start listening"
endpoint=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$work/server.log")
port=${endpoint##*:}
[ -n "$port" ] && [ "$port" -gt 0 ] || fail "no port in the listening line"
grep -q "WARNING" "$work/server.log" && fail "warning on loopback"
echo "server: $(grep 'listening on' "$work/server.log")"

# 3. the same port again
out=$("$server" --port "$port" 2>&1)
rc=$?
[ $rc -eq 1 ] && grep -q "port $port on 127.0.0.1 is in use" <<<"$out" || fail "port in use: status $rc, output: $out"
echo "port in use refused: $(grep "in use" <<<"$out")"

# 4. a client killed mid-run, then the client through RPC against a local RFCPU run (16 greedy ids
#    at the end of each file)
# The client's CPU backend: ggml-cpu, or rocmforge where ggml-cpu was built as variants
# (ROCMFORGE_GGML_CPU_ALL_VARIANTS) with no libggml-cpu.so.
client_cpu=(-b ggml-cpu -l "$bin/libggml-cpu.so")
[ -f "$bin/libggml-cpu.so" ] || client_cpu=(-b rocmforge -l "$bin/libggml-rocmforge.so")
"$llama_run" bench -m "$model" --pp 64 --tg 256 --reps 20 -t 2 "${client_cpu[@]}" \
    -L "$bin/libggml-rpc.so" --rpc "$endpoint" >"$work/killed_client.log" 2>&1 &
kpid=$!
sleep 2
kill -9 "$kpid"
wait "$kpid" 2>/dev/null
sleep 1  # the server finishes the graph it was running and replies to a closed socket
kill -0 "$spid" 2>/dev/null || fail "the server ended when a client was killed"
common=(logits -m "$model" --positions 16 --gen 16 -t 2 --fa on)
"$llama_run" "${common[@]}" "${client_cpu[@]}" -L "$bin/libggml-rpc.so" --rpc "$endpoint" \
    -o "$work/rpc.bin" >"$work/client.log" 2>&1 || fail "client run failed"
grep -q "offloading to RPC0 ($endpoint)" "$work/client.log" || fail "client did not offload to the RPC device"
grep -q "Accepted client connection" "$work/server.log" || fail "server saw no client"
"$llama_run" "${common[@]}" -b rocmforge -l "$bin/libggml-rocmforge.so" -o "$work/local.bin" \
    >"$work/local.log" 2>&1 || fail "local run failed: $(tail -n 5 "$work/local.log")"
rpc_ids=$(tail -c 64 "$work/rpc.bin" | od -An -v -tu4 | xargs)
local_ids=$(tail -c 64 "$work/local.bin" | od -An -v -tu4 | xargs)
echo "RPC   tokens: $rpc_ids"
echo "local tokens: $local_ids"
[ "$(wc -w <<<"$rpc_ids")" -eq 16 ] || fail "expected 16 token ids"
[ "$rpc_ids" = "$local_ids" ] || fail "tokens differ between the RPC and the local RFCPU run"
if cmp -s "$work/rpc.bin" "$work/local.bin"; then echo "logits of 16 positions: bit-identical"
else echo "logits of 16 positions: not bit-identical (tokens are)"; fi

# 5. the tensor cache
n_cached=$(find "$work/cache" -type f | wc -l)
[ "$n_cached" -ge 1 ] || fail "nothing in the tensor cache $work/cache"
echo "tensor cache: $n_cached file(s)"

# 6. the warning off loopback (and a clean stop of that one), then SIGTERM to the first server
good=$(find "$work/cache" -type f | head -n 1)
mkdir -p "$work/cache2"
"$server" --host 0.0.0.0 --port 0 --threads 1 --cache "$work/cache2" >"$work/server_any.log" 2>&1 &
apid=$!
wait_listening "$apid" 60 "$work/server_any.log" || { kill -9 "$apid"; fail "0.0.0.0 server did not start"; }
cp "$good" "$work/cache2/"  # written after the start, the newest, hashes to its name: kept
printf 'cut short' >"$work/cache/0123456789abcdef"  # the newest of the first server's cache: removed
kill -INT "$apid"
wait "$apid"
arc=$?
grep -q "WARNING: listening on 0.0.0.0, not on loopback" "$work/server_any.log" || fail "no warning off loopback"
[ $arc -eq 0 ] || fail "SIGINT: status $arc"
[ -f "$work/cache2/$(basename "$good")" ] || fail "a good cache file was removed at the stop"
kill -TERM "$spid"
for _ in $(seq 1 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$spid" 2>/dev/null && fail "server still running 10 s after SIGTERM"
wait "$spid"
rc=$?
spid=""
[ $rc -eq 0 ] || fail "SIGTERM: status $rc"
grep -q "SIGTERM received, stopping" "$work/server.log" || fail "no stop message"
[ -f "$work/cache/0123456789abcdef" ] && fail "a cut cache file was kept at the stop"
[ -f "$good" ] || fail "the good cache file of the first server was removed"
echo "stopped on SIGINT and SIGTERM with status 0"
echo "rpc_server_e2e: PASS"
