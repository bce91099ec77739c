#!/usr/bin/env bash
# azd prepackage (service api): the package scripts/package.sh builds (a
# static musl binary, host.json, both functions), unpacked into dist/app,
# which azd deploys as it is. unzip keeps the binary's executable bit.
set -euo pipefail
cd "$(dirname "$0")/../.."
zip=$(scripts/package.sh)
rm -rf dist/app
mkdir -p dist/app
unzip -q "$zip" -d dist/app
test -x dist/app/order-guard
