#!/usr/bin/env bash
# Coverage-guided fuzzing (fuzz/, cargo-fuzz): scripts/fuzz.sh [TARGET|all] [SECONDS]
#                                       or scripts/fuzz.sh build
# Runs one target or all of them, as many at a time as there are CPUs, for
# SECONDS each (default 30) on the committed corpus, and prints per target
# the inputs run and the coverage (libFuzzer's final `#N DONE cov: … ft: …`).
# Stable toolchain: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its nightly flags.
# A crash fails the run (exit non-zero, once the targets running beside it
# end); its input is under fuzz/artifacts/.
# `build` only builds every target (and installs cargo-fuzz when missing):
# scripts/test.sh starts it niced at the beginning, so the build uses the
# CPU the tests leave idle, and the runs later find it done.
#
# ORDER_GUARD_FUZZ_BUILD picks the build:
#   release (default)  optimised, with AddressSanitizer: the most inputs a
#                      second, for a real campaign; a cold build of the whole
#                      tree so instrumented takes about 15 min on 2 cores;
#   quick              fuzz/Cargo.toml's dev profile (opt-level 1) without a
#                      sanitizer (the fuzzed code is safe Rust; a panic is
#                      still a finding): a cold build in about half the time,
#                      fewer inputs a second. .ci/run sets it: CI's 30 s a
#                      target replay the corpus and explore a little.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-all}"
seconds="${2:-30}"
case "${ORDER_GUARD_FUZZ_BUILD:-release}" in
  release) build=(-O) ;;
  quick) build=(--dev -s none) ;;
  *) echo "fuzz.sh: ORDER_GUARD_FUZZ_BUILD must be release or quick, not ${ORDER_GUARD_FUZZ_BUILD}" >&2; exit 2 ;;
esac
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi
if [[ "$target" == build ]]; then
  exec cargo fuzz build "${build[@]}"
fi
targets=(invocation connection_strings numbers dead_letters webhook_delivery webhook_token)
if [[ "$target" != all ]]; then
  targets=("$target")
fi
if [[ "$target" == all ]]; then cargo fuzz build "${build[@]}"; else cargo fuzz build "${build[@]}" "$target"; fi
# One target per CPU at a time, each on one CPU of its own (libFuzzer in
# process, one thread), so each gets its SECONDS of a whole CPU.
cpus="$(nproc 2>/dev/null || echo 1)"
results="$(mktemp -d)"
# run_target T: T for SECONDS on a scratch copy of its corpus (what
# libFuzzer adds stays out of the tree); its log and exit status land in
# $results.
run_target() {
  local t="$1" work status=0
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  work="$(mktemp -d)"
  cp -r "fuzz/corpus/$t/." "$work/"
  echo "fuzz.sh: $t for ${seconds}s" >&2
  cargo fuzz run "${build[@]}" "$t" "$work" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -print_final_stats=0 2>"$results/$t.log" || status=$?
  rm -rf "$work"
  echo "$status" >"$results/$t.status"
}
running=0
for t in "${targets[@]}"; do
  run_target "$t" &
  running=$((running + 1))
  if ((running >= cpus)); then
    wait -n || true # each target's own status is in its file
    running=$((running - 1))
  fi
done
wait || true
summary=()
failed=0
for t in "${targets[@]}"; do
  # No file: the target failed before libFuzzer ran (its corpus copied).
  status="$(cat "$results/$t.status" 2>/dev/null || echo 1)"
  if [[ $status -ne 0 ]]; then
    grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)|^ +#[0-9]+ 0x' "$results/$t.log" 2>/dev/null | tail -40 >&2 || true
    echo "fuzz.sh: $t FAILED (exit $status); input saved under fuzz/artifacts/$t/" >&2
    echo "fuzz.sh: reproduce with RUSTC_BOOTSTRAP=1 cargo fuzz run ${build[*]} $t fuzz/artifacts/$t/<file>" >&2
    failed="$status"
    continue
  fi
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$results/$t.log" | tail -1 || true)"
  summary+=("$t: ${done_line:-no DONE line}")
done
rm -rf "$results"
if [[ $failed -ne 0 ]]; then
  exit "$failed"
fi
printf '%s\n' "${summary[@]}"
