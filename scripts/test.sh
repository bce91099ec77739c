#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this).
#
# 1. makes sure redis-server is installed (the Redis tests start their own on a
#    free loopback port; they fail loudly when it is missing);
# 2. checks formatting and lints;
# 3. runs every test target, with the fault points compiled in for the chaos test.
#
# SQL Server tests run only when ORDER_GUARD_TEST_MSSQL holds an ADO.NET
# connection string; the T-SQL is parsed in every run regardless.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features failpoints -- -D warnings

if [ -z "${ORDER_GUARD_TEST_MSSQL:-}" ]; then
  echo "==> NOTE: SQL Server conformance suite NOT RUN: set ORDER_GUARD_TEST_MSSQL to an ADO.NET connection string to run it (T-SQL is still parsed below)"
else
  echo "==> SQL Server conformance suite will run against ORDER_GUARD_TEST_MSSQL"
fi

echo "==> cargo test --all-targets --features failpoints"
cargo test --all-targets --features failpoints "$@"
