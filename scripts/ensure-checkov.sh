#!/usr/bin/env bash
# checkov (the PyPI package), the scanner scripts/check-infra.sh runs over
# infra/'s Bicep files: its Bicep framework parses them itself (no Bicep
# compiler, which installs from no registry this project uses). Installed
# once into its own virtual environment under .tools/checkov (kept out of
# git); prints the path of the `checkov` it leaves there.
#
# CHECKOV_VERSION pins the version (default below: the one infra/ was
# checked with).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CHECKOV_VERSION:-3.3.30}"
venv=.tools/checkov
checkov="$venv/bin/checkov"
if [ -x "$checkov" ] && [ "$(cat "$venv/.version" 2>/dev/null)" = "$version" ]; then
  echo "$checkov"
  exit 0
fi
echo "==> installing checkov $version (PyPI) into $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --no-compile --disable-pip-version-check "checkov==$version" >&2
echo "$version" > "$venv/.version"
echo "$checkov"
