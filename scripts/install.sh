#!/usr/bin/env bash
# Build blobdrive and install it system-wide, without a package:
#   /usr/local/bin/blobdrive            the binary (with the release profile's
#                                       debug info; the .deb strips it)
#   /etc/blobdrive/                     where per-drive configuration lives (0700)
#   and what scripts/stage.sh lists: /sbin/mount.blobdrive, the unit template
#   in /etc/systemd/system, the manual pages and the shell completions.
# PREFIX (default /usr/local) and DESTDIR are honoured. A Debian package of the
# same files, under /usr: scripts/package.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-/usr/local}
dest=${DESTDIR:-}

cd "$root"
cargo build --release --locked -p blobdrive
install -D -m 0755 target/release/blobdrive "$dest$prefix/bin/blobdrive"
install -d -m 0700 "$dest/etc/blobdrive"
scripts/stage.sh "$dest" target/release/blobdrive "$prefix" /etc/systemd/system
if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed blobdrive into $dest$prefix/bin (mount helper: $dest/sbin/mount.blobdrive)"
