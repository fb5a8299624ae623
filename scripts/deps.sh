#!/usr/bin/env bash
# Makes sure what the tests and the demo need from the system is installed: redis-server (every storage test
# starts private ones), faketime (replicas with a shifted wall clock, tests/it/clock.rs), promtool (the alerting
# rules' checks and unit tests in make lint-deploy; Debian's prometheus package), chromium and chromedriver (the
# dashboard's browser tests, tests/it/ui_browser.rs; Debian's chromium and chromium-driver). As root with apt-get it
# installs what is missing; otherwise it names, in one line per package, what to install.
set -euo pipefail

# command-or-file to look for, and the Debian package that provides it.
needs=(
  "redis-server:redis-server"
  "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1:faketime"
  "promtool:prometheus"
  "chromium:chromium"
  "chromedriver:chromium-driver"
)

missing=()
for need in "${needs[@]}"; do
  what="${need%%:*}" package="${need##*:}"
  if [[ "$what" == /* ]]; then
    [ -e "$what" ] || [ -n "$(find /usr/lib -name "$(basename "$what")" -print -quit 2>/dev/null)" ] || missing+=("$package")
  else
    command -v "$what" >/dev/null 2>&1 || missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "missing: ${missing[*]}" >&2
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing with apt-get ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null || {
    apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
  }
else
  echo "install them, then run make again:  sudo apt-get install ${missing[*]}   (Debian/Ubuntu package names)" >&2
  exit 1
fi
# The Debian redis-server package starts a system service on 6379; the tests do not need it (they use their own ports).
redis-server --version >&2
