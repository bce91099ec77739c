#!/usr/bin/env bash
# Install Azurite, Microsoft's Blob Storage emulator (npm package `azurite`),
# into .tools/ (git-ignored) when missing. The dead-letter tests start their
# own azurite-blob on a free loopback port, always with --disableTelemetry
# (by default Azurite reports usage to a host on the internet), and fail
# with a message naming this script when it is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.tools/node_modules/.bin/azurite-blob
if [ -x "$bin" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "==> npm not found: installing nodejs and npm with apt-get"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null; } \
    || { echo "error: cannot install npm; run: sudo apt-get install -y nodejs npm" >&2; exit 1; }
fi
echo "==> installing azurite (npm) into .tools/"
mkdir -p .tools
npm install --prefix .tools --no-audit --no-fund --silent azurite@3 >&2 \
  || { echo "error: npm could not install azurite into .tools/ (no access to the npm registry?)" >&2; exit 1; }
[ -x "$bin" ] || { echo "error: $bin is missing after npm install" >&2; exit 1; }
echo "==> azurite $(node .tools/node_modules/azurite/dist/src/blob/main.js --disableTelemetry --version 2>/dev/null || echo installed)"
