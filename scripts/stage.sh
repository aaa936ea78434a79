#!/usr/bin/env bash
# Lay out under ROOT everything blobdrive installs besides the binary itself,
# where it sits on a running system, for a binary installed as PREFIX/bin/blobdrive:
#   /sbin/mount.blobdrive                  a link to the binary, so `mount -t blobdrive`
#                                          and /etc/fstab work (mount(8) looks in /sbin)
#   UNIT_DIR/blobdrive@.service            the unit template, its paths set to PREFIX/bin
#   PREFIX/share/man/man1, man8            the manual pages (blobdrive man)
#   PREFIX/share/bash-completion/completions/blobdrive,
#   PREFIX/share/zsh/site-functions/_blobdrive,
#   PREFIX/share/fish/vendor_completions.d/blobdrive.fish
#                                          the completions (blobdrive completions)
# This is the one list of those files: scripts/install.sh stages them into /
# (PREFIX /usr/local, the unit in /etc/systemd/system) and scripts/package.sh
# into target/deb-root (PREFIX /usr, the unit in /usr/lib/systemd/system),
# which the .deb takes whole (Cargo.toml, [package.metadata.deb]).
#
#   scripts/stage.sh ROOT BINARY PREFIX UNIT_DIR
#
# ROOT may be empty (the running system). BINARY is a built blobdrive: it
# writes the manual pages and completions.
set -euo pipefail

if [ $# != 4 ]; then
  echo "usage: scripts/stage.sh ROOT BINARY PREFIX UNIT_DIR" >&2
  exit 2
fi
root=$1 bin=$2 prefix=$3 unit_dir=$4
# PREFIX goes into a sed replacement below, where '#', '&' and '\' mean
# something, and into a unit file, where a newline would end the line.
case $prefix in
*[\#\&\\]* | *$'\n'*)
  echo "stage.sh: PREFIX may not hold '#', '&', a backslash or a newline: $prefix" >&2
  exit 2
  ;;
esac
src=$(cd "$(dirname "$0")" && pwd)

install -d "$root/sbin"
ln -sfn "$prefix/bin/blobdrive" "$root/sbin/mount.blobdrive"
# The unit's one source names /usr/local/bin; every other prefix is set here.
install -d "$root$unit_dir"
sed "s#/usr/local/bin/blobdrive#$prefix/bin/blobdrive#g" "$src/blobdrive@.service" \
  >"$root$unit_dir/blobdrive@.service"
chmod 0644 "$root$unit_dir/blobdrive@.service"
mandir="$root$prefix/share/man"
pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
"$bin" man "$pages" >/dev/null
install -d "$mandir/man1" "$mandir/man8"
install -m 0644 "$pages"/*.1 "$mandir/man1/"
install -m 0644 "$pages"/*.8 "$mandir/man8/"
install -d "$root$prefix/share/bash-completion/completions" \
  "$root$prefix/share/zsh/site-functions" "$root$prefix/share/fish/vendor_completions.d"
"$bin" completions bash >"$root$prefix/share/bash-completion/completions/blobdrive"
"$bin" completions zsh >"$root$prefix/share/zsh/site-functions/_blobdrive"
"$bin" completions fish >"$root$prefix/share/fish/vendor_completions.d/blobdrive.fish"
chmod 0644 "$root$prefix/share/bash-completion/completions/blobdrive" \
  "$root$prefix/share/zsh/site-functions/_blobdrive" \
  "$root$prefix/share/fish/vendor_completions.d/blobdrive.fish"
