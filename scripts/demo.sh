#!/usr/bin/env bash
# The whole flow on one machine: a private redis-server on a free port, the emulator (Cloudflare Workers AI, OpenAI
# Batch and Anthropic Message Batches on one port), one daemon serving all three providers, four sample jobs (two
# for Cloudflare, one for OpenAI, one for Anthropic) followed to their results, and the dashboard (`batchd ui`; DEMO_KEEP_UI=1 keeps it up
# until Enter). Everything is stopped and removed on exit.
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

step "starting the emulator of the three batch APIs (Cloudflare batches stay queued 1.5 s, then run 1.5 s)"
"$bin/batchd-emulator" --listen 127.0.0.1:0 --queued-ms 1500 --running-ms 1500 >"$work/emulator.out" 2>"$work/emulator.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q "listening on" "$work/emulator.out" 2>/dev/null && break; sleep 0.05; done
api=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/emulator.out")
echo "emulator at $api (Cloudflare), ${api%/client/v4}/openai/v1 (OpenAI), ${api%/client/v4}/anthropic (Anthropic)"

export REDIS_URL="redis://127.0.0.1:$redis_port"
export BATCHD__CLOUDFLARE__BASE_URL="$api"
export CLOUDFLARE_ACCOUNT_ID="emulator-account"
export CLOUDFLARE_API_TOKEN="emulator-token"
# The OpenAI and Anthropic providers are configured by their keys (never in a config file).
export OPENAI_API_KEY="emulator-openai-key"
export BATCHD__OPENAI__BASE_URL="${api%/client/v4}/openai/v1"
export ANTHROPIC_API_KEY="emulator-anthropic-key"
export BATCHD__ANTHROPIC__BASE_URL="${api%/client/v4}/anthropic"
export BATCHD__POLL__INITIAL_INTERVAL_MS=500
export BATCHD__POLL__MAX_INTERVAL_MS=1000
# The admin server on a free port too, so a daemon already running on this machine (on 9090) does not stop the demo.
admin_port=$(free_port)
export BATCHD__ADMIN__LISTEN="127.0.0.1:$admin_port"

step "starting the daemon (logs in $work/daemon.log)"
"$bin/batchd" run 2>"$work/daemon.log" &
pids+=($!)

step "batchd submit: four jobs at once, routed by model name (@cf/... Cloudflare, openai/..., anthropic/...)"
for job in demo-embeddings demo-generation demo-openai demo-anthropic; do
  printf '%-30s -> job ' "examples/$job.json"
  "$bin/batchd" submit "$root/examples/$job.json"
done

step "batchd tail --from-start --count 4: one line per result, as the daemon publishes them"
"$bin/batchd" tail --from-start --count 4 --timeout 60

step "batchd status demo-bge-m3"
"$bin/batchd" status demo-bge-m3

ui_port=$(free_port)
step "batchd ui on http://127.0.0.1:$ui_port/ (the dashboard; read-only)"
"$bin/batchd" ui --listen "127.0.0.1:$ui_port" >"$work/ui.out" 2>"$work/ui.log" &
pids+=($!)
wait_for_port "$ui_port"
echo "its overview as JSON (GET /api/overview), the finished jobs of the last hour:"
curl -fsS "http://127.0.0.1:$ui_port/api/overview" \
  | python3 -c 'import json,sys; ns=json.load(sys.stdin)["namespaces"][0]; print({s: sum(m[s] for m in ns["finished"]["buckets"]) for s in ("completed","failed","expired","cancelled")}, "tokens:", ns["tokens"]["last_hour"])'
if [ -n "${DEMO_KEEP_UI:-}" ]; then
  echo "DEMO_KEEP_UI is set: open http://127.0.0.1:$ui_port/ in a browser; press Enter to stop everything"
  read -r _
fi

step "the daemon's log"
cat "$work/daemon.log"
step "done; stopping everything"
