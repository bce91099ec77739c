#!/usr/bin/env bash
# The real T-SQL engine the SQL Server tests run on (Babelfish for PostgreSQL,
# started by ../shared/tools/tsql-server/tsql-server, or $ORDER_GUARD_TSQL_SERVER).
#
#   scripts/tsql-engine.sh path            the tsql-server command, or exit 1 if absent
#   scripts/tsql-engine.sh start DATABASE  start it (installing the one library it
#                                          needs when missing); prints an ADO.NET string
#   scripts/tsql-engine.sh stop
#
# The port is $TSQL_SERVER_PORT (default 1433).
set -euo pipefail
cd "$(dirname "$0")/.."

tool=${ORDER_GUARD_TSQL_SERVER:-../shared/tools/tsql-server/tsql-server}
port=${TSQL_SERVER_PORT:-1433}

case "${1:-}" in
  path)
    [ -x "$tool" ] || { echo "no T-SQL engine at $tool (set ORDER_GUARD_TSQL_SERVER to its tsql-server command)" >&2; exit 1; }
    echo "$(cd "$(dirname "$tool")" && pwd)/$(basename "$tool")"
    ;;
  start)
    db=${2:?database name}
    [ -x "$tool" ] || { echo "no T-SQL engine at $tool (set ORDER_GUARD_TSQL_SERVER to its tsql-server command)" >&2; exit 1; }
    # Babelfish loads the uuid-ossp extension, which needs libossp-uuid.
    # grep without -q reads all of ldconfig's output: with -q and pipefail,
    # an early exit would SIGPIPE ldconfig and read as "not found".
    if ! ldconfig -p | grep 'libossp-uuid\.so\.16' >/dev/null; then
      echo "==> libossp-uuid16 (needed by the T-SQL engine) not found: installing it with apt-get" >&2
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      export DEBIAN_FRONTEND=noninteractive
      { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libossp-uuid16; } >&2 \
        || { echo "error: cannot install libossp-uuid16; run: sudo apt-get install -y libossp-uuid16" >&2; exit 1; }
    fi
    # A cluster left half-initialised by an earlier failed start is started afresh.
    state=${TSQL_SERVER_DIR:-/tmp/tsql-server}/$port
    if [ -d "$state" ] && [ ! -f "$state/initialized" ]; then
      "$tool" stop --port "$port" >/dev/null 2>&1 || true
      rm -rf "$state"
    fi
    "$tool" start --port "$port" --database "$db"
    ;;
  stop)
    [ -x "$tool" ] && "$tool" stop --port "$port" >/dev/null
    ;;
  *)
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
