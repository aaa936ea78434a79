#!/usr/bin/env bash
# Build the Debian package: target/debian/blobdrive_VERSION_ARCH.deb (the
# binary stripped, in /usr/bin; mount.blobdrive, the unit template, manual
# pages and completions from scripts/stage.sh) and blobdrive-dbgsym_*.ddeb
# (the release profile's debug info, /usr/lib/debug/.build-id/), then run
# lintian on it. Needs cargo-deb and lintian (scripts/setup.sh --package
# installs them).
#
#   scripts/package.sh            build, package, lintian
#
# The version is Cargo.toml's plus the commit's UTC time and hash,
# 0.1.0+git202611270747.e93956e-1, so each later commit's package upgrades the
# one before; BLOBDRIVE_DEB_REVISION sets the part after '-' (default 1).
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
# The package's version: Cargo.toml's, then the time and hash of the commit
# built (0.1.0+git202611270812.e93956e-1), so that each later commit's package
# is newer to apt and dpkg than the one before (every build of one Cargo.toml
# version would otherwise be "already the newest"). The commit's date, not
# now, so a rebuild of one commit gives the same version. BLOBDRIVE_DEB_REVISION
# (default 1) is the part after the last '-'.
version=$(target/release/blobdrive --version | cut -d' ' -f2)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if stamp=$(TZ=UTC0 git log -1 --date=format-local:%Y%m%d%H%M --format=%cd 2>/dev/null) && [ -n "$stamp" ]; then
  deb_version=$version+git$stamp.$commit-${BLOBDRIVE_DEB_REVISION:-1}
else
  deb_version=$version-${BLOBDRIVE_DEB_REVISION:-1}
fi
# Debian wants a changelog: one entry, that version and the commit it was
# built from, dated by the commit.
date=$(git log -1 --format=%cD 2>/dev/null || date -R)
maintainer=$(sed -n 's/^maintainer = "\(.*\)"$/\1/p' Cargo.toml)
cat >target/deb-root.changelog <<CHANGELOG
blobdrive ($deb_version) unstable; urgency=medium

  * Built from commit $commit; see the project's git history for the changes.

 -- $maintainer  $date
CHANGELOG
say "cargo deb"
rm -f target/debian/blobdrive_*.deb target/debian/blobdrive-dbgsym_*.ddeb
cargo deb --no-build --locked -p blobdrive --deb-version "$deb_version"
deb=$(ls target/debian/blobdrive_*.deb)
if command -v lintian >/dev/null; then
  say "lintian $deb"
  lintian --fail-on error,warning "$deb"
else
  say "lintian is not installed: not checked (scripts/setup.sh --package installs it)"
fi
say "built $deb"
