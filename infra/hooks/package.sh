#!/usr/bin/env bash
# azd prepackage (service api): the package scripts/package.sh builds (a
# static musl binary, host.json, both functions), written where azure.yaml's
# `dist` names it. azd deploys a .zip it is given as it is, so the binary's
# mode is the one package.sh writes in its entry (0755), on every system
# the build runs on: azd's own zip of a folder built on Windows would carry
# no executable bit, and a custom handler without one does not start.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/package.sh --out dist/azd/order-guard.zip >/dev/null
