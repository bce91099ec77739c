# Shared by the azd hooks (sourced, not run): what every hook checks and
# how it calls Azure. Plain bash 3.2 (macOS's) and Git Bash on Windows: no
# GNU-only flags, no root, no package manager.

# The hooks' own tools, checked before they are needed: what is missing is
# named with where it comes from.
require() {
  local tool=$1 from=$2
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool is needed here and is not on PATH: $from" >&2
    exit 1
  fi
}

# Python 3, by the name this system gives it (Windows: python).
find_python() {
  local candidate
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
      PYTHON=$candidate
      return 0
    fi
  done
  echo "error: Python 3.8 or newer is needed (python3 or python on PATH): python.org, Homebrew or your distribution's python3" >&2
  exit 1
}

# Every az call names the subscription azd deploys to: az's own default
# subscription may be another.
azs() {
  az "$@" --subscription "$AZURE_SUBSCRIPTION_ID"
}

# A warning that does not fail `azd up`: the deployment itself is done.
warn() {
  printf 'WARNING: %s\n' "$*" >&2
}

# Seconds between tries and how long to keep trying, shortened by the
# hooks' rehearsal (tests/deploy_rehearsal.rs); the defaults are for Azure.
: "${ORDER_GUARD_HOOK_PAUSE:=10}"
