#!/usr/bin/env bash
# Install redis-server and redis-cli (which creates the test clusters; Debian's
# redis-server package brings redis-tools) (and openssl, which the TLS test uses to make a
# certificate) with apt when missing (tests start their own instances;
# nothing is left running). Fails with a clear message otherwise.
set -euo pipefail
if command -v "${REDIS_SERVER_BIN:-redis-server}" >/dev/null 2>&1 && command -v "${REDIS_CLI_BIN:-redis-cli}" >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1; then
  exit 0
fi
echo "==> redis-server or openssl not found: installing them with apt-get"
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  echo "error: redis-server is missing and this user cannot install packages; run: sudo apt-get install -y redis-server" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server redis-tools openssl >/dev/null
# The package may start a system instance on 6379; the tests do not use it.
command -v redis-server >/dev/null || { echo "error: redis-server still missing after apt-get install" >&2; exit 1; }
echo "==> $(redis-server --version)"
