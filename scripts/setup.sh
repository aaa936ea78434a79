#!/usr/bin/env bash
# Install what blobdrive needs on a Debian/Ubuntu machine, only what is missing:
# the kernel-side tools (fuse3, util-linux, e2fsprogs, xfsprogs, and fdisk's
# sfdisk for --partition-table), npm for Azurite, and for tests also dosfstools
# and cryptsetup-bin (partitioned test images), fio, libnbd-bin (nbdinfo, nbdcopy:
# the NBD tests), qemu-utils (and Debian 12's
# qemu-img 7.2, unpacked into .tools/), iproute2, tar, man-db, zsh, promtool, the Python
# azure-storage-blob SDK and rustfmt/clippy, and what building and testing the Debian
# package needs (cargo-deb, lintian, binutils, mmdebstrap). Used by scripts/test.sh
# and scripts/demo.sh.
#
#   scripts/setup.sh            everything the tests need
#   scripts/setup.sh --no-package  the same without the package's tools (what
#                               scripts/test.sh FILTER needs: no package test)
#   scripts/setup.sh --run      only what running blobdrive and the demo need
#   scripts/setup.sh --package  only what scripts/package.sh needs
#
# BLOBDRIVE_SKIP_INSTALL=1 installs nothing.
set -euo pipefail

say() { echo "setup.sh: $*" >&2; }

# --- system packages --------------------------------------------------------

# Tool the tests use, and the Debian package that provides it. A tool that is
# already on the machine (from any source, e.g. npm from NodeSource) is kept.
# The many-hosts tests need ip (network namespaces, veths, a bridge) and
# nsenter; the crash tests tar, e2fsck and xfs_repair; partitioned images
# sfdisk, mkfs.vfat and cryptsetup; the namespace tests getfattr and setfattr.
tools=(fusermount3:fuse3 losetup:util-linux nsenter:util-linux mkfs.ext4:e2fsprogs
  e2fsck:e2fsprogs mkfs.xfs:xfsprogs xfs_repair:xfsprogs ip:iproute2 tar:tar
  sfdisk:fdisk mkfs.vfat:dosfstools cryptsetup:cryptsetup-bin
  fio:fio qemu-img:qemu-utils qemu-io:qemu-utils nbdinfo:libnbd-bin nbdcopy:libnbd-bin
  npm:npm man:man-db zsh:zsh getfattr:attr)

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
  python3 -c 'import azure.storage.blob, cryptography' 2>/dev/null && return 0
  say "installing the Python azure-storage-blob SDK and cryptography (AES-XTS for the encryption tests)"
  python3 -m pip install --quiet azure-storage-blob cryptography 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages azure-storage-blob cryptography
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

# Debian 12's own qemu-img (7.2), unpacked next to the repository (not
# installed), so the VHD tests check our footers with the qemu most machines
# run as well as the newest: qemu before 10 sizes a VHD by its CHS geometry
# unless its creator is one it knows. On a machine whose apt has no 7.2, or
# when the download fails, .tools/qemu-7.2.unavailable says why and the tests
# print SKIPPED for it.
fetch_old_qemu() {
  local root dir version work
  root=$(cd "$(dirname "$0")/.." && pwd)
  dir="$root/.tools/qemu-7.2"
  rm -f "$root/.tools/qemu-7.2.unavailable"
  if "$dir/usr/bin/qemu-img" --version >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p "$root/.tools"
  unavailable() {
    say "qemu-img 7.2 not fetched: $*"
    echo "$*" >"$root/.tools/qemu-7.2.unavailable"
  }
  if ! command -v apt-get >/dev/null; then
    unavailable "not a Debian/Ubuntu system (no apt-get)"
    return 0
  fi
  version=$(apt-cache madison qemu-utils 2>/dev/null | awk -F'|' '$2 ~ /^ *1:7\.2[+.]/ { gsub(/ /, "", $2); print $2; exit }')
  if [ -z "$version" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || true
    version=$(apt-cache madison qemu-utils 2>/dev/null | awk -F'|' '$2 ~ /^ *1:7\.2[+.]/ { gsub(/ /, "", $2); print $2; exit }')
  fi
  if [ -z "$version" ]; then
    unavailable "apt offers no qemu-utils 7.2 (Debian 12's) on this machine"
    return 0
  fi
  work=$(mktemp -d)
  chmod 755 "$work" # apt's download user must be able to write there
  if ! (cd "$work" && apt-get download -qq "qemu-utils=$version" >/dev/null 2>&1); then
    rm -rf "$work"
    unavailable "apt-get download qemu-utils=$version failed"
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  dpkg -x "$work"/qemu-utils_*.deb "$dir"
  rm -rf "$work"
  if ! "$dir/usr/bin/qemu-img" --version >/dev/null 2>&1; then
    unavailable "qemu-img $version does not run here: $(ldd "$dir/usr/bin/qemu-img" 2>&1 | grep 'not found' | tr '\n' ' ')"
    return 0
  fi
  say "qemu-img $version unpacked into .tools/qemu-7.2"
}

# cargo-deb, pinned: the version scripts/package.sh was written against.
CARGO_DEB_VERSION=3.8.0
install_cargo_deb() {
  if cargo deb --version 2>/dev/null | grep -qF "$CARGO_DEB_VERSION"; then
    return 0
  fi
  say "installing cargo-deb $CARGO_DEB_VERSION (cargo install)"
  cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
}

# The Debian package: lintian checks it, objcopy and readelf (binutils) split
# and check its debug info, mmdebstrap makes the clean root the package test
# installs it into.
package_tools=(lintian:lintian objcopy:binutils readelf:binutils mmdebstrap:mmdebstrap)

[ "${BLOBDRIVE_SKIP_INSTALL:-0}" = 1 ] && exit 0
if [ "${1:-}" = "--package" ]; then
  tools=("${package_tools[@]}")
  install_system_packages
  install_cargo_deb
  exit 0
fi
if [ "${1:-}" = "--run" ]; then
  tools=(fusermount3:fuse3 losetup:util-linux blkid:util-linux mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs npm:npm)
  install_system_packages
  exit 0
fi
if [ "${1:-}" != "--no-package" ]; then
  tools+=("${package_tools[@]}")
fi
install_system_packages
[ "${1:-}" = "--no-package" ] || install_cargo_deb
install_promtool
install_python_sdk
install_rust_components
fetch_old_qemu

