#!/usr/bin/env bash
# Builds the batchd binary of the previous release (the commit PREVIOUS_RELEASE names, from this repository's own
# history) into target/previous-release/<commit>/, for the chaos suite's rolling-upgrade scenario (11-upgrade).
# Prints the binary's path last. Built once per commit: a second run reuses it.
set -euo pipefail
commit="${PREVIOUS_RELEASE:?set PREVIOUS_RELEASE to a commit (the Makefile does)}"
root="$(git rev-parse --show-toplevel)"
full="$(git -C "$root" rev-parse --verify "${commit}^{commit}")" || {
  echo "previous-release: commit $commit is not in this clone's history (a shallow clone? git fetch --unshallow)" >&2
  exit 1
}
dir="${CARGO_TARGET_DIR:-$root/target}/previous-release/${full:0:12}"
bin="$dir/target/debug/batchd"
if [ ! -x "$bin" ]; then
  echo "previous-release: building batchd at ${full:0:12} (once; a few minutes) in $dir" >&2
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git -C "$root" archive "$full" | tar -x -C "$dir/src"
  CARGO_TARGET_DIR="$dir/target" cargo build --quiet --manifest-path "$dir/src/Cargo.toml" -p batchd --bin batchd >&2
fi
echo "$bin"
