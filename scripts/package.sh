#!/usr/bin/env bash
# Build the Debian package: target/debian/blobdrive_VERSION-1_ARCH.deb (the
# binary stripped, in /usr/bin; mount.blobdrive, the unit template, manual
# pages and completions from scripts/stage.sh) and blobdrive-dbgsym_*.ddeb
# (the release profile's debug info, /usr/lib/debug/.build-id/), then run
# lintian on it. Needs cargo-deb and lintian (scripts/setup.sh --package
# installs them).
#
#   scripts/package.sh            build, package, lintian
#
# Exits non-zero when lintian reports an error or a warning; the tags the
# package overrides, each with its reason, are in packaging/debian/lintian-overrides.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "package.sh: $*" >&2; }

if ! cargo deb --version >/dev/null 2>&1; then
  say "cargo-deb is not installed: run scripts/setup.sh --package"
  exit 1
fi
say "cargo build --release"
cargo build --release --locked -p blobdrive
rm -rf target/deb-root
scripts/stage.sh target/deb-root target/release/blobdrive /usr /usr/lib/systemd/system
# Debian wants a changelog: one entry, the version Cargo.toml gives and the
# commit it was built from (its date, so a rebuild gives the same package).
version=$(target/release/blobdrive --version | cut -d' ' -f2)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
maintainer=$(sed -n 's/^maintainer = "\(.*\)"$/\1/p' Cargo.toml)
cat >target/deb-root.changelog <<CHANGELOG
blobdrive ($version-1) unstable; urgency=medium

  * Built from commit $commit; see the project's git history for the changes.

 -- $maintainer  $date
CHANGELOG
say "cargo deb"
rm -f target/debian/blobdrive_*.deb target/debian/blobdrive-dbgsym_*.ddeb
cargo deb --no-build --locked -p blobdrive
deb=$(ls target/debian/blobdrive_*.deb)
if command -v lintian >/dev/null; then
  say "lintian $deb"
  lintian --fail-on error,warning "$deb"
else
  say "lintian is not installed: not checked (scripts/setup.sh --package installs it)"
fi
say "built $deb"
