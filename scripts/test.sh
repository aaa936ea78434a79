#!/usr/bin/env bash
# Run every blobdrive test, on a fresh machine too: install what is missing,
# start an in-memory Azurite (or reuse one that already answers), then
# cargo fmt --check, clippy with warnings as errors, and the whole test suite.
#
#   scripts/test.sh [extra arguments for cargo nextest run / cargo test]
#
# Environment:
#   BLOBDRIVE_AZURITE_PORT            Azurite blob port (default 10000)
#   BLOBDRIVE_TEST_CONNECTION_STRING  test against this account instead of a
#                                     local Azurite (none is started then)
#   BLOBDRIVE_REQUIRE_FUSE=1          tests that need FUSE/loop devices fail
#                                     instead of printing SKIPPED (set by CI)
#   BLOBDRIVE_SKIP_INSTALL=1          install nothing; use what is there
#
# An Azurite this script started is stopped when it exits; one that was
# already running is left alone.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export BLOBDRIVE_AZURITE_PORT=${BLOBDRIVE_AZURITE_PORT:-10000}

say() { echo "test.sh: $*" >&2; }

# --- system packages --------------------------------------------------------

# Tool the tests use, and the Debian package that provides it. A tool that is
# already on the machine (from any source, e.g. npm from NodeSource) is kept.
tools=(fusermount3:fuse3 losetup:util-linux mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs
  fio:fio qemu-img:qemu-utils npm:npm)

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

install_rust_components() {
  if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || { say "cargo fmt and cargo clippy are required"; exit 1; }
    say "installing rustfmt and clippy"
    rustup component add rustfmt clippy
  fi
}

if [ "${BLOBDRIVE_SKIP_INSTALL:-0}" != 1 ]; then
  install_system_packages
  install_python_sdk
  install_rust_components
fi

# --- Azurite ----------------------------------------------------------------

started_azurite=0
azurite_pid=
stop_azurite() {
  [ "$started_azurite" = 1 ] || return 0
  say "stopping the Azurite started on port $BLOBDRIVE_AZURITE_PORT"
  scripts/azurite.sh stop || true
  # Azurite closes its port on the first SIGTERM but its node process can stay
  # alive; make sure the one we started is gone (only that pid, nothing else).
  [ -n "$azurite_pid" ] || return 0
  for _ in $(seq 1 30); do
    kill -0 "$azurite_pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -TERM "$azurite_pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$azurite_pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$azurite_pid" 2>/dev/null || true
}
trap stop_azurite EXIT
trap 'exit 130' INT TERM

if [ -n "${BLOBDRIVE_TEST_CONNECTION_STRING:-}" ]; then
  say "testing against the account of BLOBDRIVE_TEST_CONNECTION_STRING; no Azurite started"
else
  if scripts/azurite.sh status; then
    say "reusing the Azurite already listening on port $BLOBDRIVE_AZURITE_PORT"
  else
    scripts/azurite.sh start --memory
    started_azurite=1
    azurite_pid=$(cat ".azurite/azurite-$BLOBDRIVE_AZURITE_PORT.pid" 2>/dev/null || true)
  fi
  # The well-known development account (public, documented by Microsoft) on
  # the chosen port, for the tests and for tools such as the Python SDK.
  export BLOBDRIVE_TEST_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$BLOBDRIVE_AZURITE_PORT/devstoreaccount1;"
fi

# --- checks and tests -------------------------------------------------------

say "cargo fmt --check"
cargo fmt --all --check

say "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
  # Doc tests first: nextest does not run them, and its summary should be the
  # run's closing line.
  say "cargo test --doc"
  cargo test --doc --quiet
  say "cargo nextest run"
  cargo nextest run --no-fail-fast "$@"
else
  say "cargo test (cargo-nextest not installed)"
  cargo test --no-fail-fast "$@"
fi

say "all tests passed"
