#!/usr/bin/env bash
# Mutation testing of the files that make decisions. NOT part of
# CI: a run takes tens of minutes. Run it before changing those files' tests,
# or to check that a new test really pins the behaviour it claims to.
#
#   scripts/mutants.sh [FILE...] [-- CARGO_TEST_ARGS...]
#
# FILE       source files to mutate, one cargo-mutants run (`--file`) each;
#            default: the files of the scores table in docs/testing.md
#            (src/decision.rs src/finished.rs src/store/sqlite/mod.rs
#            src/processor.rs src/guard/redis.rs src/hosting.rs
#            src/config/state.rs src/deadletter/name.rs src/deadletter/fate.rs
#            src/store/sqlserver/silence.rs src/store/sqlserver/retry.rs
#            src/outbox/pack.rs src/outbox/lease.rs src/outbox/destination.rs
#            src/outbox/dispatch.rs src/outbox/retention.rs
#            src/store/walk_back.rs)
# CARGO_TEST_ARGS
#            the test selection every mutant is judged by: cargo arguments
#            given to both the build (`cargo test --no-run`, so only these
#            targets are compiled per mutant) and the test run; default:
#            each file's own selection (`selection_for` below, the one its
#            score in docs/testing.md was taken with), else
#            --lib --test processor --test guard --test bad_input
#            --test host_protocol --test store_conformance
#            (chaos, operational and the SQL Server engine tests are left out
#            to keep a run affordable; name them to include them)
# MUTANTS_RE  only the mutants whose name matches this regex (`--re`), e.g.
#            to check that a new test catches what a run left
#
# Examples:
#   scripts/mutants.sh src/order/number.rs src/guard/memory.rs
#   scripts/mutants.sh src/processor.rs -- --lib --test processor --test guard
#
# Every run builds with `--features failpoints`, installs cargo-mutants when
# it is missing (`cargo install --locked cargo-mutants`) and makes sure
# redis-server and Azurite are installed (the guard and processor tests start
# their own redis-server, the outbox tests their own Azurite).
# The SQL Server conformance tests run only if ORDER_GUARD_TEST_MSSQL is set.
#
# Environment:
#   MUTANTS_JOBS        parallel cargo-mutants jobs (default 1: each job is a
#                       full build; more than one needs cores and memory)
#   MUTANTS_OUT         where results go (default target/mutants): one
#                       directory per file, each with cargo-mutants'
#                       mutants.out (caught.txt, missed.txt, timeout.txt,
#                       unviable.txt, outcomes.json, logs/)
#   MUTANTS_TARGET_DIR  cargo target dir for the mutated builds (default
#                       target/mutants-build), kept between runs so the
#                       dependencies are built once; only with MUTANTS_JOBS=1
#
# Prints, per file: caught / viable (viable = caught + missed + timeout;
# unviable mutants do not compile and do not count), the percentage, and the
# mutants that were missed or timed out. Exits non-zero only when a run could
# not be made (baseline tests failing, tool errors), not for survivors.
set -euo pipefail
cd "$(dirname "$0")/.."

files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  files=(src/decision.rs src/finished.rs src/store/sqlite/mod.rs src/processor.rs src/guard/redis.rs
    src/hosting.rs src/config/state.rs src/deadletter/name.rs src/deadletter/fate.rs
    src/store/sqlserver/silence.rs src/store/sqlserver/retry.rs
    src/outbox/pack.rs src/outbox/lease.rs src/outbox/destination.rs
    src/outbox/dispatch.rs src/outbox/retention.rs src/store/walk_back.rs)
fi
given_args=("$@")

# The tests that judge a file's mutants: the targets that exercise it.
selection_for() {
  case "$1" in
    src/decision.rs) echo --lib --test model --test processor --test liveness ;;
    src/finished.rs) echo --lib --test processor ;;
    src/store/sqlite/mod.rs)
      echo --lib --test store_conformance --test processor --test sqlite_writer \
        --test store_identity --test liveness ;;
    src/processor.rs)
      echo --lib --test processor --test guard --test bad_input --test host_protocol \
        --test store_conformance --test liveness --test log_lines --test log_severity \
        --test telemetry ;;
    src/guard/redis.rs)
      echo --lib --test guard --test processor --test liveness --test store_identity \
        --test redis_entra_id --test bad_input --test host_protocol ;;
    # Pure decision files: their unit tests judge them.
    src/hosting.rs|src/deadletter/name.rs|src/deadletter/fate.rs|src/config/state.rs)
      echo --lib ;;
    src/store/sqlserver/silence.rs|src/store/sqlserver/retry.rs|src/store/walk_back.rs)
      echo --lib ;;
    # The outbox: its pure rules by their unit tests; the files that drive
    # a destination, a round and the retention by the outbox's tests too.
    src/outbox/pack.rs|src/outbox/lease.rs) echo --lib ;;
    src/outbox/destination.rs|src/outbox/dispatch.rs|src/outbox/retention.rs)
      echo --lib --test outbox --test outbox_topic --test outbox_history ;;
    *) echo --lib --test processor --test guard --test bad_input --test host_protocol \
        --test store_conformance ;;
  esac
}
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "error: no such file: $f" >&2; exit 1; }
done

jobs="${MUTANTS_JOBS:-1}"
out="${MUTANTS_OUT:-$PWD/target/mutants}"
mkdir -p "$out"

if ! cargo mutants --version >/dev/null 2>&1; then
  echo "==> installing cargo-mutants"
  cargo install --locked cargo-mutants
fi
scripts/ensure-redis.sh
scripts/ensure-azurite.sh

# Mutants need no debugger: without debug info each mutant builds and links
# much faster. (Only these builds: they have their own target dir.)
export CARGO_PROFILE_DEV_DEBUG=0
if [ "$jobs" = 1 ]; then
  # One shared target dir for every mutated copy of the tree: dependencies
  # are compiled once, each mutant rebuilds only this crate.
  export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$PWD/target/mutants-build}"
else
  # Parallel jobs must not share one target dir (cargo would serialise them).
  unset CARGO_TARGET_DIR
fi

echo "==> cargo-mutants $(cargo mutants --version | awk '{print $2}')"
re_args=()
if [ -n "${MUTANTS_RE:-}" ]; then
  re_args=(--re "$MUTANTS_RE")
fi
summary=()
for f in "${files[@]}"; do
  if [ ${#given_args[@]} -gt 0 ]; then
    test_args=("${given_args[@]}")
  else
    read -r -a test_args <<<"$(selection_for "$f")"
  fi
  # As --cargo-arg, not after `--`: cargo-mutants' build step then compiles
  # only the selected test targets, not every target of the package.
  cargo_args=()
  for a in "${test_args[@]}"; do
    cargo_args+=("--cargo-arg=$a")
  done
  name=$(echo "$f" | tr '/.' '__')
  echo "==> mutating $f; tests: cargo test ${test_args[*]}"
  status=0
  nice -n 10 cargo mutants --features failpoints --file "$f" --jobs "$jobs" \
    --output "$out/$name" --no-shuffle ${re_args[@]+"${re_args[@]}"} "${cargo_args[@]}" || status=$?
  # 0: all caught; 2: some missed; 3: some timed out. Anything else means the
  # run itself failed (4: the baseline tests fail on the unmutated tree).
  case "$status" in
    0|2|3) ;;
    *) echo "error: cargo mutants on $f exited with $status (see $out/$name/mutants.out/debug.log)" >&2
       exit "$status" ;;
  esac
  dir="$out/$name/mutants.out"
  count() { if [ -s "$dir/$1.txt" ]; then wc -l < "$dir/$1.txt"; else echo 0; fi; }
  caught=$(count caught); missed=$(count missed); timeout=$(count timeout); unviable=$(count unviable)
  viable=$((caught + missed + timeout))
  if [ "$viable" -gt 0 ]; then
    pct=$(awk -v c="$caught" -v v="$viable" 'BEGIN { printf "%.1f", 100 * c / v }')
  else
    pct="n/a"
  fi
  summary+=("$(printf '%-22s %4s / %-4s caught  %6s %%   (missed %s, timeout %s, unviable %s)' \
    "$f" "$caught" "$viable" "$pct" "$missed" "$timeout" "$unviable")")
  for kind in missed timeout; do
    if [ -s "$dir/$kind.txt" ]; then
      summary+=("$(sed "s/^/    $kind: /" "$dir/$kind.txt")")
    fi
  done
done

echo
echo "==> mutation score per file (caught / viable)"
printf '%s\n' "${summary[@]}"
