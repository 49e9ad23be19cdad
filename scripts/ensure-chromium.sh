#!/usr/bin/env bash
# The browser tests (tests/ui_browser) drive Debian's Chromium at $LATENCY_LAB_CHROMIUM (default
# /usr/bin/chromium; `playwright install` cannot download here). Install it when missing and we may
# (root, or sudo without a password); else stop with the one line to run. Used by `make test` and .ci/run.
set -euo pipefail
chromium="${LATENCY_LAB_CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] && exit 0
if [ -n "${LATENCY_LAB_CHROMIUM:-}" ]; then
  echo "error: LATENCY_LAB_CHROMIUM=$chromium is not an executable; point it at Chromium, or unset it" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; else sudo="none"; fi
fi
if [ "$sudo" = none ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the browser tests need Chromium at $chromium: run \`sudo apt-get install -y chromium\`" \
       "(or set LATENCY_LAB_CHROMIUM; \`make test-fast\` runs without it)" >&2
  exit 1
fi
echo "installing Debian's chromium for the browser tests (apt-get)..." >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
[ -x "$chromium" ] || { echo "error: apt-get installed chromium but $chromium is still missing" >&2; exit 1; }
