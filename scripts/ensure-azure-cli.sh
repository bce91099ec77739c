#!/usr/bin/env bash
# Azure's own CLI (`az`, the PyPI package azure-cli), for tests/az_commands.rs:
# every `az` command the README and docs/ show is parsed by it. Installed once
# into its own virtual environment under .tools/azure-cli (kept out of git);
# prints the path of the `az` it leaves there. No login is needed to parse a
# command: an accepted one stops at "Please run 'az login'".
#
# AZURE_CLI_VERSION pins the version (default below: the one the README's
# commands were checked with).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${AZURE_CLI_VERSION:-2.91.0}"
venv=.tools/azure-cli
az="$venv/bin/az"
if [ -x "$az" ] && [ "$(cat "$venv/.version" 2>/dev/null)" = "$version" ]; then
  echo "$az"
  exit 0
fi
echo "==> installing azure-cli $version (PyPI) into $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv" >&2
# --no-compile: byte-compiling the whole package (tens of thousands of
# files) took half the install; the few modules a parse imports are
# compiled when first imported.
"$venv/bin/pip" install --quiet --no-compile --disable-pip-version-check "azure-cli==$version" >&2
echo "$version" > "$venv/.version"
echo "$az"
