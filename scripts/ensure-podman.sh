#!/usr/bin/env bash
# podman and runc, which scripts/image.sh builds and tests/webhook_image.rs
# runs the webhook's image with: installed with apt when missing (Debian's
# packages), with the CA certificates the image copies. Idempotent: exits
# at once when they are there.
set -euo pipefail
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "==> installing ${missing[*]} (apt)" >&2
{ $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 \
  || { echo "error: cannot install ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2; exit 1; }
