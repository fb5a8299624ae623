#!/usr/bin/env bash
# The whole flow on one machine: a private redis-server on a free port, the Batch API emulator, the daemon, and
# two sample jobs submitted with `batchd submit --wait`. Everything is stopped and removed on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/target/debug"
work=$(mktemp -d "${TMPDIR:-/tmp}/batchd-demo.XXXXXX")
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

port_is_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$(( 20000 + RANDOM % 40000 ))
    if port_is_free "$port"; then echo "$port"; return; fi
  done
  echo "no free port found" >&2; exit 1
}
wait_for_port() {
  for _ in $(seq 1 100); do
    if ! port_is_free "$1"; then return; fi
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2; exit 1
}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

redis_port=$(free_port)
step "starting a private redis-server on 127.0.0.1:$redis_port (data in $work, removed afterwards)"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work" --save "" --appendonly no \
  --daemonize no --loglevel warning >"$work/redis.log" 2>&1 &
pids+=($!)
wait_for_port "$redis_port"

step "starting the Batch API emulator (batches stay queued 1.5 s, then run 1.5 s)"
"$bin/batchd-emulator" --listen 127.0.0.1:0 --queued-ms 1500 --running-ms 1500 >"$work/emulator.out" 2>"$work/emulator.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q "listening on" "$work/emulator.out" 2>/dev/null && break; sleep 0.05; done
api=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/emulator.out")
echo "emulator at $api"

export REDIS_URL="redis://127.0.0.1:$redis_port"
export BATCHD__CLOUDFLARE__BASE_URL="$api"
export CLOUDFLARE_ACCOUNT_ID="emulator-account"
export CLOUDFLARE_API_TOKEN="emulator-token"
export BATCHD__POLL__INITIAL_INTERVAL_MS=500
export BATCHD__POLL__MAX_INTERVAL_MS=1000

step "starting the daemon (logs in $work/daemon.log)"
"$bin/batchd" run 2>"$work/daemon.log" &
pids+=($!)

for job in demo-embeddings demo-generation; do
  step "batchd submit --wait examples/$job.json"
  "$bin/batchd" submit --wait "$root/examples/$job.json"
done

step "batchd status demo-bge-m3"
"$bin/batchd" status demo-bge-m3

step "the daemon's log"
cat "$work/daemon.log"
step "done; stopping everything"
