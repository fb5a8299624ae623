#!/usr/bin/env bash
# Makes sure redis-server is on PATH: installs it with the system package manager when it can (root with
# apt-get, or Homebrew), and otherwise says exactly what to run.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found; the tests and the demo start private redis-server processes." >&2
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing it with apt-get ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >/dev/null || {
    apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >/dev/null
  }
elif command -v brew >/dev/null 2>&1; then
  echo "installing it with Homebrew ..." >&2
  brew install redis
else
  cat >&2 <<'MSG'
Install Redis 7 or newer, then run make again:
  Debian/Ubuntu:  sudo apt-get install redis-server
  Fedora/RHEL:    sudo dnf install redis
  macOS:          brew install redis
MSG
  exit 1
fi
command -v redis-server >/dev/null 2>&1 || { echo "redis-server is still not on PATH" >&2; exit 1; }
# The Debian package starts a system service on 6379; the tests do not need it (they use their own ports).
redis-server --version >&2
