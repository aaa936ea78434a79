#!/usr/bin/env bash
# Run every blobdrive test, on a fresh machine too: install what is missing,
# start an in-memory Azurite (or reuse one that already answers), then
# cargo fmt --check, clippy with warnings as errors, the whole test suite,
# and (without arguments) the Debian package: scripts/package.sh builds it
# and runs lintian, scripts/package-test.sh installs it into a clean Debian
# root and mounts a drive with it.
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

# --- what the tests need ----------------------------------------------------

# The package's tools (cargo-deb, lintian, mmdebstrap) only for a whole run:
# a filtered one runs no package test.
if [ $# = 0 ]; then
  scripts/setup.sh
else
  scripts/setup.sh --no-package
fi

# --- Azurite ----------------------------------------------------------------

# The many-hosts tests (tests/multihost.rs) start their own Azurite inside a
# network namespace from .azurite/, even when a running one is reused here.
scripts/azurite.sh install

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
    # Azurite sweeps deleted data every ten minutes of its life and answers
    # nothing while it lists the extents the suite wrote (minutes, near the
    # end of a whole run): no sweep during the run. What the suite deletes
    # stays in Azurite's memory until it stops (1.8 GB of RSS at the end).
    export BLOBDRIVE_AZURITE_SWEEP_MINUTES=${BLOBDRIVE_AZURITE_SWEEP_MINUTES:-240}
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
  if [ "$started_azurite" = 1 ] && [ $# = 0 ]; then
    # The transfer tests, which move the most data and time their requests,
    # get a fresh Azurite after the others, with none of their deleted data.
    status=0
    cargo nextest run --no-fail-fast -E 'not binary(transfer)' || status=$?
    say "a fresh Azurite for the transfer tests"
    stop_azurite
    scripts/azurite.sh start --memory
    azurite_pid=$(cat ".azurite/azurite-$BLOBDRIVE_AZURITE_PORT.pid" 2>/dev/null || true)
    cargo nextest run --no-fail-fast -E 'binary(transfer)' || status=$?
    [ "$status" = 0 ] || exit "$status"
  else
    cargo nextest run --no-fail-fast "$@"
  fi
else
  say "cargo test (cargo-nextest not installed)"
  cargo test --no-fail-fast "$@"
fi

if [ $# = 0 ]; then
  say "the Debian package: scripts/package.sh, then scripts/package-test.sh"
  step=$SECONDS
  scripts/package.sh
  say "scripts/package.sh: $((SECONDS - step)) s"
  step=$SECONDS
  scripts/package-test.sh
  say "scripts/package-test.sh: $((SECONDS - step)) s"
fi

say "all tests passed"
