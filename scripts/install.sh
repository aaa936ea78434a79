#!/usr/bin/env bash
# Build blobdrive and install it system-wide:
#   /usr/local/bin/blobdrive            the binary
#   /sbin/mount.blobdrive               so `mount -t blobdrive` and /etc/fstab work
#   /etc/systemd/system/blobdrive@.service   the unit template (see its header)
#   /etc/blobdrive/                     where per-drive configuration lives
# PREFIX (default /usr/local) and DESTDIR are honoured for packaging.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-/usr/local}
dest=${DESTDIR:-}

cd "$root"
cargo build --release --locked
install -D -m 0755 target/release/blobdrive "$dest$prefix/bin/blobdrive"
install -d "$dest/sbin"
ln -sf "$prefix/bin/blobdrive" "$dest/sbin/mount.blobdrive"
install -D -m 0644 scripts/blobdrive@.service "$dest/etc/systemd/system/blobdrive@.service"
sed -i "s#/usr/local/bin/blobdrive#$prefix/bin/blobdrive#" "$dest/etc/systemd/system/blobdrive@.service"
install -d -m 0700 "$dest/etc/blobdrive"
if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed blobdrive into $dest$prefix/bin (mount helper: $dest/sbin/mount.blobdrive)"
