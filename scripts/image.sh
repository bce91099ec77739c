#!/usr/bin/env bash
# The webhook's container image (Containerfile), built with podman.
#
#   scripts/image.sh                 builds localhost/order-guard:<version>
#   scripts/image.sh --save FILE     and writes it to FILE (an OCI archive,
#                                    for `podman load` or a registry push)
#   scripts/image.sh --context DIR   only stages the build context (the
#                                    Containerfile beside what it copies) in
#                                    DIR, for a build elsewhere (`az acr build`)
#
# ORDER_GUARD_PACKAGE_PROFILE names the binary's cargo profile (default
# release, what you deploy; tests/webhook_image.rs sets dev), as for
# scripts/package.sh, which builds the static musl binary.
#
# Installs podman and runc (apt) when missing (scripts/ensure-podman.sh).
# Without CONTAINERS_CONF it writes one under .tools/ that runs containers
# with runc and the cgroupfs manager and sets no default ulimits: what
# works inside another container or a VM without systemd (this project's
# CI among them). Prints the image's name.
set -euo pipefail
cd "$(dirname "$0")/.."

save="" stage=""
while [ $# -gt 0 ]; do
  case "$1" in
    --save) save="$2"; shift 2 ;;
    --context) stage="$2"; shift 2 ;;
    *) echo "usage: scripts/image.sh [--save FILE | --context DIR]" >&2; exit 2 ;;
  esac
done

if [ -n "$stage" ]; then
  # Only the CA certificates the context copies.
  if [ ! -f /etc/ssl/certs/ca-certificates.crt ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "==> installing ca-certificates (apt)" >&2
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ca-certificates; } >&2 \
      || { echo "error: cannot install ca-certificates; run: sudo apt-get install -y ca-certificates" >&2; exit 1; }
  fi
else
  scripts/ensure-podman.sh
fi
if [ -z "$stage" ] && [ -z "${CONTAINERS_CONF:-}" ]; then
  mkdir -p .tools
  cat > .tools/containers.conf <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
  export CONTAINERS_CONF="$PWD/.tools/containers.conf"
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
profile="${ORDER_GUARD_PACKAGE_PROFILE:-release}"
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
# package.sh builds the static binary (and says why when it cannot).
scripts/package.sh >/dev/null
binary=target/x86_64-unknown-linux-musl/$profile_dir/order-guard

if [ -n "$stage" ]; then
  mkdir -p "$stage"
  context=$stage
else
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
fi
install -m 0755 "$binary" "$context/order-guard"
cp /etc/ssl/certs/ca-certificates.crt "$context/"
printf 'root:x:0:0:root:/:/sbin/nologin\norder-guard:x:65532:65532:order-guard:/:/sbin/nologin\n' >"$context/passwd"
printf 'root:x:0:\norder-guard:x:65532:\n' >"$context/group"
cp Containerfile "$context/"
if [ -n "$stage" ]; then
  echo "==> the build context is in $stage (VERSION=$version)" >&2
  echo "$stage"
  exit 0
fi
image=localhost/order-guard:$version
echo "==> podman build $image (profile $profile)" >&2
podman build --quiet --build-arg "VERSION=$version" -f "$context/Containerfile" -t "$image" "$context" >&2
if [ -n "$save" ]; then
  rm -f "$save"
  podman save --format oci-archive -o "$save" "$image" >&2
  echo "==> wrote $save" >&2
fi
echo "$image"
