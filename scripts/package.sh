#!/usr/bin/env bash
# The Functions package: a static Linux x86-64 binary (musl) laid out as the
# host expects, zipped with the binary's executable bit kept.
#
#   scripts/package.sh                  writes dist/order-guard-<version>-linux-x64.zip
#   scripts/package.sh --out FILE       writes the zip to FILE instead (azd's
#                                       prepackage hook)
#   scripts/package.sh --prerequisites  only installs what the build needs
#
# Built with `cargo zigbuild`: Zig is the C compiler and linker for the
# musl target (the bundled SQLite, ring, mimalloc), so the same command
# runs on Linux (x86-64 or ARM), macOS (Intel or Apple silicon), Windows
# (Git Bash, which azd runs `sh` hooks with) and WSL, with no root, no
# package manager and no musl-gcc. Zig and cargo-zigbuild come from PyPI
# (the `cargo-zigbuild` package brings the `ziglang` one), installed under
# .tools/zigbuild with the Python 3 you have; ones already on PATH are used
# as they are. The Rust target comes from rustup.
#
# ORDER_GUARD_PACKAGE_PROFILE names the cargo profile (default release, what
# you deploy). tests/package.rs sets dev: it checks the layout, the static
# link and the start, not the optimizer. Whatever the profile, the binary
# is built without debug info (its symbols stay, so a backtrace names its
# functions): line tables were four fifths of the file, uploaded on every
# deploy and mapped on every start.
#
# Why musl: a glibc build needs the build machine's glibc or older on the
# Functions worker image; a static musl binary runs on any of them
# (Microsoft's Rust custom-handler quickstart builds this target too). It
# never falls back to a glibc build: when the target or Zig cannot be
# installed it says why and what to run.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-musl
profile="${ORDER_GUARD_PACKAGE_PROFILE:-release}"
# cargo's output folder for a profile: dev's is `debug`.
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out=dist/order-guard-$version-linux-x64.zip

usage="usage: scripts/package.sh [--out FILE | --prerequisites]"
prerequisites=""
case "${1:-}" in
  "") ;;
  --prerequisites) prerequisites=1 ;;
  --out)
    [ -n "${2:-}" ] || { echo "$usage" >&2; exit 2; }
    out=$2 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

# Python 3, by the name this system gives it (Windows: python or py -3).
python=""
for candidate in python3 python; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "error: the package needs Python 3 (3.8 or newer) with pip, for Zig and cargo-zigbuild (PyPI) and to write the zip." >&2
  echo "       Install it (python.org, Homebrew, your distribution's python3 and python3-pip), then run this again." >&2
  exit 1
fi

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "==> installing the Rust target $target (rustup)" >&2
  if ! rustup target add "$target" >&2; then
    echo "error: cannot install the Rust target $target: rustup could not fetch its standard library" >&2
    echo "       (no access to static.rust-lang.org?). Install it where there is, then run this again:" >&2
    echo "       rustup target add $target" >&2
    exit 1
  fi
fi

# cargo-zigbuild and Zig: the ones on PATH, or PyPI's under .tools/zigbuild.
tools=$PWD/.tools/zigbuild
if ! command -v cargo-zigbuild >/dev/null || ! { command -v zig >/dev/null || "$python" -c 'import ziglang' 2>/dev/null; }; then
  if [ ! -x "$tools/bin/cargo-zigbuild" ] && [ ! -x "$tools/bin/cargo-zigbuild.exe" ]; then
    echo "==> installing cargo-zigbuild and Zig from PyPI into .tools/zigbuild ($python -m pip)" >&2
    if ! "$python" -m pip install --quiet --disable-pip-version-check --target "$tools" cargo-zigbuild >&2; then
      rm -rf "$tools"
      echo "error: cannot install cargo-zigbuild (PyPI) with $python -m pip; install pip for it, or install" >&2
      echo "       cargo-zigbuild and Zig yourself (pip install cargo-zigbuild), then run this again." >&2
      exit 1
    fi
  fi
  export PATH="$tools/bin:$PATH"
  # cargo-zigbuild runs `python -m ziglang` when no zig is on PATH.
  export PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
fi

[ -n "$prerequisites" ] && exit 0

echo "==> cargo zigbuild --profile $profile --target $target" >&2
profile_var=CARGO_PROFILE_$(echo "$profile" | tr '[:lower:]-' '[:upper:]_')
env "${profile_var}_DEBUG=false" "${profile_var}_STRIP=debuginfo" \
  cargo zigbuild --profile "$profile" --locked --target "$target" --bin order-guard >&2
binary=target/$target/$profile_dir/order-guard
[ -n "${CARGO_TARGET_DIR:-}" ] && binary=$CARGO_TARGET_DIR/$target/$profile_dir/order-guard

# The layout the host reads, zipped by Python: the same on every system
# (no zip, unzip or readelf needed), the binary's mode 0755 in its entry
# whatever the file system it was built on (NTFS has no mode).
"$python" - "$binary" "$out" <<'PY'
import os, stat, struct, sys, zipfile

binary, dest = sys.argv[1:3]
files = [
    ("host.json", "host.json", 0o644),
    ("OrderTrigger/function.json", "OrderTrigger/function.json", 0o644),
    ("DeadLetterSweep/function.json", "DeadLetterSweep/function.json", 0o644),
    ("order-guard", binary, 0o755),
]

# A static binary asks for no program interpreter (PT_INTERP, type 3): the
# Functions worker has no musl loader.
with open(binary, "rb") as f:
    head = f.read(64)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        sys.exit(f"error: {binary} is not a 64-bit ELF file")
    phoff, = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        if struct.unpack("<I", f.read(4))[0] == 3:
            sys.exit(f"error: {binary} is dynamically linked; the package needs a static binary")

os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
tmp = dest + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
    for name, src, perm in files:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.create_system = 3  # Unix: the mode below is read
        info.external_attr = (stat.S_IFREG | perm) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(src, "rb") as f:
            z.writestr(info, f.read())
os.replace(tmp, dest)
PY

size=$(( $(wc -c <"$binary") / 1024 / 1024 ))
echo "$out"
cat >&2 <<EOF
==> wrote $out (static $target binary, $size MiB, profile $profile, executable bit kept)
Publish it:
  zip deploy:  az functionapp deployment source config-zip -g <resource-group> -n <app> --src $out
  or:          unzip $out -d app && cd app && func azure functionapp publish <app>
EOF
