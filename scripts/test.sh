#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this).
#
# 1. makes sure redis-server is installed (the Redis tests start their own on
#    a free loopback port; they fail loudly when it is missing), Azurite
#    (scripts/ensure-azurite.sh: the dead-letter tests start their own Blob
#    Storage emulator), podman (scripts/ensure-podman.sh: the image test)
#    and Azure's CLI (scripts/ensure-azure-cli.sh: the README's az commands
#    are parsed by it, tests/az_commands.rs);
# 2. starts the real T-SQL engine (scripts/tsql-engine.sh) for the SQL Server
#    tests, unless ORDER_GUARD_TEST_MSSQL already names a server (your own SQL
#    Server or Azure SQL: see the README). With
#    ORDER_GUARD_REQUIRE_TSQL_ENGINE=true (the project's own CI: .ci/run sets
#    it) the engine is required; elsewhere, a fork's CI included (CI=true says
#    nothing here), its absence is said once and the SQL Server tests do not
#    run (the T-SQL is still parsed below);
# 3. checks formatting and lints;
# 4. scans the azd template (infra/) with checkov (scripts/check-infra.sh);
# 5. runs every test target, with the fault points compiled in;
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's header says when it began (minutes into the run): where CI's
# time goes, read from its log.
step() { printf '==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# Work that needs little of this step's CPU starts in the background and is
# waited for where its result is needed: Azure's CLI (a download, then
# unpacking; needed by the tests) and, with ORDER_GUARD_FUZZ_SECONDS, the
# fuzz targets' build under `nice -n 19`, which takes the CPU the other
# steps leave idle (the tests leave a fifth to two fifths of it); on a core
# shared by two vCPUs it still slows them some (docs/testing.md, "Where CI's
# time goes"). Each writes its log under .tools/ and runs in a process
# group of its own (setsid), so an early exit stops it whole, compilers too.
mkdir -p .tools
background=()
cleanup() {
  for pid in ${background[@]+"${background[@]}"}; do kill -- "-$pid" 2>/dev/null || true; done
  if [ -n "${started_engine:-}" ]; then scripts/tsql-engine.sh stop || true; fi
}
trap cleanup EXIT
# wait_for NAME PID LOG: the background job's status; its log when it failed.
# A job waited for leaves the list cleanup kills (its id may be reused).
wait_for() {
  if ! wait "$2"; then
    echo "error: $1 failed; its log ($3):" >&2
    tail -40 "$3" >&2
    exit 1
  fi
  local kept=()
  for pid in "${background[@]}"; do [ "$pid" = "$2" ] || kept+=("$pid"); done
  background=(${kept[@]+"${kept[@]}"})
}
setsid scripts/ensure-azure-cli.sh >.tools/azure-cli.log 2>&1 &
azure_cli=$!
background+=("$azure_cli")
setsid scripts/ensure-checkov.sh >.tools/checkov.log 2>&1 &
checkov_install=$!
background+=("$checkov_install")
if [ -n "${ORDER_GUARD_FUZZ_SECONDS:-}" ]; then
  # Under the kernel's autogroup scheduling a new session is a group of its
  # own, sharing the CPU equally with the rest whatever its nice: the
  # group's own nice (/proc/self/autogroup) is set too, where there is one.
  # Its own target directory (fuzz/target), even when CARGO_TARGET_DIR names
  # one: a shared one's lock would hold up clippy and the tests.
  setsid env -u CARGO_TARGET_DIR bash -c \
    '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec nice -n 19 scripts/fuzz.sh build' \
    >.tools/fuzz-build.log 2>&1 &
  fuzz_build=$!
  background+=("$fuzz_build")
  step "the fuzz build started, niced, in the background (.tools/fuzz-build.log)"
fi

started_engine=""
if [ -z "${ORDER_GUARD_TEST_MSSQL:-}" ]; then
  if engine=$(scripts/tsql-engine.sh path 2>/dev/null); then
    echo "==> starting the T-SQL engine ($engine)"
    # Set first: a start that fails half-way is stopped too.
    started_engine=1
    # A fresh database per run: no state from an earlier run or schema.
    ORDER_GUARD_TEST_MSSQL=$(scripts/tsql-engine.sh start "og_test_$(date +%s)_$$")
    export ORDER_GUARD_TEST_MSSQL
    export ORDER_GUARD_TSQL_SERVER="$engine"
  elif [ "${ORDER_GUARD_REQUIRE_TSQL_ENGINE:-}" = "true" ]; then
    echo "error: ORDER_GUARD_REQUIRE_TSQL_ENGINE=true: the SQL Server tests must run on the T-SQL engine, and none was found: $(scripts/tsql-engine.sh path 2>&1 || true) (or set ORDER_GUARD_TEST_MSSQL to a server of your own)" >&2
    exit 1
  fi
fi
if [ -z "${ORDER_GUARD_TEST_MSSQL:-}" ]; then
  echo "==> NOTE: SQL Server tests NOT RUN: no T-SQL engine found and ORDER_GUARD_TEST_MSSQL is not set (T-SQL is still parsed below)"
elif [ -n "$started_engine" ]; then
  echo "==> SQL Server tests will run on the T-SQL engine (Babelfish) on 127.0.0.1:${TSQL_SERVER_PORT:-1433}"
else
  echo "==> SQL Server tests will run against ORDER_GUARD_TEST_MSSQL"
fi

# What the tests need and apt, npm or rustup installs when missing
# (redis-server, Azurite, podman, the musl target and Zig: one after
# another, apt allows one at a time), in the background: fetching and
# unpacking leave the CPU to fmt and clippy. After the engine's start,
# which may install a library of its own.
setsid bash -c 'scripts/ensure-redis.sh && scripts/ensure-azurite.sh && scripts/ensure-podman.sh \
  && scripts/package.sh --prerequisites' \
  >.tools/packages.log 2>&1 &
packages=$!
background+=("$packages")

step "cargo fmt --check (and fuzz/, a crate of its own)"
cargo fmt --all -- --check
(cd fuzz && cargo fmt --all -- --check)

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features failpoints -- -D warnings

wait_for "scripts/ensure-checkov.sh" "$checkov_install" .tools/checkov.log
step "checkov over infra/ (scripts/check-infra.sh)"
scripts/check-infra.sh

wait_for "scripts/ensure-azure-cli.sh" "$azure_cli" .tools/azure-cli.log
wait_for "the tests' packages (redis-server, Azurite, podman, the musl target and Zig)" "$packages" .tools/packages.log
cat .tools/packages.log
step "cargo test --all-targets --features failpoints"
cargo test --all-targets --features failpoints "$@"

# 6. With ORDER_GUARD_FUZZ_SECONDS (.ci/run sets 30), every fuzz target for
#    that long on its corpus (scripts/fuzz.sh; its build, started at the
#    beginning, is mostly done by then).
if [ -n "${ORDER_GUARD_FUZZ_SECONDS:-}" ]; then
  step "waiting for the fuzz build"
  wait_for "scripts/fuzz.sh build" "$fuzz_build" .tools/fuzz-build.log
  step "scripts/fuzz.sh all $ORDER_GUARD_FUZZ_SECONDS"
  scripts/fuzz.sh all "$ORDER_GUARD_FUZZ_SECONDS"
fi
step "all passed"
