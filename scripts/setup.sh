#!/usr/bin/env bash
# Install what blobdrive needs on a Debian/Ubuntu machine, only what is missing:
# the kernel-side tools (fuse3, util-linux, e2fsprogs, xfsprogs), npm for
# Azurite, and for tests also fio, qemu-utils, man-db, zsh, promtool, the Python
# azure-storage-blob SDK and rustfmt/clippy. Used by scripts/test.sh and scripts/demo.sh.
#
#   scripts/setup.sh          everything the tests need
#   scripts/setup.sh --run    only what running blobdrive and the demo need
#
# BLOBDRIVE_SKIP_INSTALL=1 installs nothing.
set -euo pipefail

say() { echo "setup.sh: $*" >&2; }

# --- system packages --------------------------------------------------------

# Tool the tests use, and the Debian package that provides it. A tool that is
# already on the machine (from any source, e.g. npm from NodeSource) is kept.
tools=(fusermount3:fuse3 losetup:util-linux mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs
  fio:fio qemu-img:qemu-utils npm:npm man:man-db zsh:zsh)

have_tool() {
  PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null
}

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    say "need root to run: $*"
    exit 1
  fi
}

install_system_packages() {
  local missing=() tool
  for t in "${tools[@]}"; do
    tool=${t%%:*}
    have_tool "$tool" || missing+=("${t#*:}")
  done
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3 python3-pip)
  [ "${#missing[@]}" -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null; then
    say "not a Debian/Ubuntu system: install ${missing[*]} yourself"
    exit 1
  fi
  say "installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_python_sdk() {
  python3 -c 'import azure.storage.blob' 2>/dev/null && return 0
  say "installing the Python azure-storage-blob SDK"
  python3 -m pip install --quiet azure-storage-blob 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages azure-storage-blob
}

# promtool (tests check the metrics text with it) comes from Debian's
# prometheus package, which would also install and start a whole Prometheus
# server: take only the promtool binary out of the package instead.
install_promtool() {
  have_tool promtool && return 0
  command -v apt-get >/dev/null || { say "install promtool (Prometheus) yourself"; exit 1; }
  say "installing promtool from the prometheus package"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$tmp" && apt-get download prometheus >/dev/null)
  }
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -O ./usr/bin/promtool >"$tmp/promtool"
  as_root install -m 0755 "$tmp/promtool" /usr/local/bin/promtool
  rm -rf "$tmp"
}

install_rust_components() {
  if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || { say "cargo fmt and cargo clippy are required"; exit 1; }
    say "installing rustfmt and clippy"
    rustup component add rustfmt clippy
  fi
}

[ "${BLOBDRIVE_SKIP_INSTALL:-0}" = 1 ] && exit 0
if [ "${1:-}" = "--run" ]; then
  tools=(fusermount3:fuse3 losetup:util-linux blkid:util-linux mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs npm:npm)
  install_system_packages
  exit 0
fi
install_system_packages
install_promtool
install_python_sdk
install_rust_components

