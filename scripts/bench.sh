#!/usr/bin/env bash
# make bench: builds everything the benchmarks need (release binaries, the pinned peers) and runs batchd-bench,
# which prints the table and writes target/bench/report.json (+ report.md). Arguments go to batchd-bench
# (e.g. scripts/bench.sh --quick, or --scenarios 1 --modes off). Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

scripts/deps.sh
for tool in redis-benchmark node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "bench: $tool is required (redis-benchmark comes with redis; node 18+ and npm for the BullMQ peer)" >&2; exit 1; }
done

echo "bench: building batchd, batchd-emulator and batchd-bench (release) ..." >&2
$CARGO build --release --quiet -p batchd -p batchd-emulator -p batchd-bench --bins

echo "bench: building the apalis-redis 1.0.0 peer (its own lockfile, outside the workspace) ..." >&2
$CARGO build --release --quiet --locked --manifest-path bench/peers/apalis-redis/Cargo.toml --target-dir target/bench-peers

if [ ! -d bench/peers/node_modules/bullmq ] || [ bench/peers/package-lock.json -nt bench/peers/node_modules ]; then
  echo "bench: installing the BullMQ peer (versions pinned in bench/peers/package-lock.json) ..." >&2
  # Not `npm ci`: npm 11 refuses this lock file for the optional native packages of other platforms (msgpackr's),
  # which it leaves out of the lock itself. `npm install --no-save` installs the locked versions and writes nothing.
  (cd bench/peers && npm install --no-save --no-audit --no-fund --loglevel=error)
fi

echo "bench: load average now: $(cut -d' ' -f1-3 /proc/loadavg) (figures are only comparable on a quiet machine)" >&2
exec target/release/batchd-bench "$@"
