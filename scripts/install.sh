#!/usr/bin/env bash
# Build blobdrive and install it system-wide:
#   /usr/local/bin/blobdrive            the binary
#   /sbin/mount.blobdrive               so `mount -t blobdrive` and /etc/fstab work
#   /etc/systemd/system/blobdrive@.service   the unit template (see its header)
#   /etc/blobdrive/                     where per-drive configuration lives
#   $PREFIX/share/man/man1, man8        the manual pages (blobdrive man)
#   bash, zsh and fish completions      where each shell's packages put theirs
# PREFIX (default /usr/local) and DESTDIR are honoured for packaging.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-/usr/local}
dest=${DESTDIR:-}

cd "$root"
cargo build --release --locked -p blobdrive
install -D -m 0755 target/release/blobdrive "$dest$prefix/bin/blobdrive"
install -d "$dest/sbin"
ln -sf "$prefix/bin/blobdrive" "$dest/sbin/mount.blobdrive"
install -D -m 0644 scripts/blobdrive@.service "$dest/etc/systemd/system/blobdrive@.service"
sed -i "s#/usr/local/bin/blobdrive#$prefix/bin/blobdrive#" "$dest/etc/systemd/system/blobdrive@.service"
install -d -m 0700 "$dest/etc/blobdrive"
bin=target/release/blobdrive
mandir="$dest$prefix/share/man"
pages=$(mktemp -d)
"$bin" man "$pages" >/dev/null
install -d "$mandir/man1" "$mandir/man8"
install -m 0644 "$pages"/*.1 "$mandir/man1/"
install -m 0644 "$pages"/*.8 "$mandir/man8/"
rm -rf "$pages"
install -d "$dest$prefix/share/bash-completion/completions" \
  "$dest$prefix/share/zsh/site-functions" "$dest$prefix/share/fish/vendor_completions.d"
"$bin" completions bash >"$dest$prefix/share/bash-completion/completions/blobdrive"
"$bin" completions zsh >"$dest$prefix/share/zsh/site-functions/_blobdrive"
"$bin" completions fish >"$dest$prefix/share/fish/vendor_completions.d/blobdrive.fish"
if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed blobdrive into $dest$prefix/bin (mount helper: $dest/sbin/mount.blobdrive)"
