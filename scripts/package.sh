#!/usr/bin/env bash
# The Functions package: a static Linux x86_64 binary (musl) laid out as the
# host expects, zipped with the binary's executable bit kept.
#
#   scripts/package.sh                  writes dist/order-guard-<version>-linux-x64.zip
#   scripts/package.sh --prerequisites  only installs what the build needs
#
# ORDER_GUARD_PACKAGE_PROFILE names the cargo profile (default release, what
# you deploy). tests/package.rs sets dev: it checks the layout, the static
# link and the start, not the optimizer, and a release build of the whole
# tree for musl was a fifth of CI's time.
#
# Why musl: a glibc build needs the build machine's glibc or older on the
# Functions worker image; a static musl binary runs on any of them
# (Microsoft's Rust custom-handler quickstart builds this target too).
# Installs the Rust target (rustup) and musl-tools (apt) when missing, and
# says why when it cannot: it never falls back to a glibc build.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-musl
profile="${ORDER_GUARD_PACKAGE_PROFILE:-release}"
# cargo's output folder for a profile: dev's is `debug`.
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out=dist/order-guard-$version-linux-x64.zip

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "==> installing the Rust target $target (rustup)" >&2
  if ! timeout 300 rustup target add "$target" >&2; then
    echo "error: cannot install the Rust target $target: rustup could not fetch its standard library" >&2
    echo "       (no access to static.rust-lang.org?). Install it where there is, then run this again:" >&2
    echo "       rustup target add $target" >&2
    exit 1
  fi
fi
if ! command -v musl-gcc >/dev/null; then
  echo "==> installing musl-tools (apt), the C toolchain for the bundled SQLite and TLS code" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq musl-tools; } >&2 \
    || { echo "error: cannot install musl-tools; run: sudo apt-get install -y musl-tools" >&2; exit 1; }
fi
if ! command -v zip >/dev/null; then
  echo "==> installing zip (apt)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq zip; } >&2 \
    || { echo "error: cannot install zip; run: sudo apt-get install -y zip" >&2; exit 1; }
fi

[ "${1:-}" = --prerequisites ] && exit 0

echo "==> cargo build --profile $profile --target $target" >&2
CC_x86_64_unknown_linux_musl=musl-gcc cargo build --profile "$profile" --locked --target "$target" --bin order-guard >&2
binary=target/$target/$profile_dir/order-guard

# A static binary asks for no program interpreter (no dynamic loader).
if readelf -l "$binary" | grep -q 'program interpreter'; then
  echo "error: $binary is dynamically linked; the package needs a static binary" >&2
  exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/OrderTrigger" "$stage/DeadLetterSweep"
cp host.json "$stage/"
cp OrderTrigger/function.json "$stage/OrderTrigger/"
cp DeadLetterSweep/function.json "$stage/DeadLetterSweep/"
install -m 0755 "$binary" "$stage/order-guard"
mkdir -p dist
rm -f "$out"
# zip keeps Unix modes (the executable bit) in the entries' external attributes.
(cd "$stage" && zip -q -X -r "$OLDPWD/$out" host.json OrderTrigger DeadLetterSweep order-guard)

echo "$out"
cat >&2 <<EOF
==> wrote $out (static $target binary, profile $profile, executable bit kept)
Publish it:
  zip deploy:  az functionapp deployment source config-zip -g <resource-group> -n <app> --src $out
  or:          unzip $out -d app && cd app && func azure functionapp publish <app>
EOF
