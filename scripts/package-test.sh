#!/usr/bin/env bash
# Test the Debian package scripts/package.sh built, as a user gets it:
#  1. its contents: the binary stripped in /usr/bin, /sbin/mount.blobdrive a
#     link to it, the unit template naming /usr/bin, the manual pages and the
#     completions;
#  2. installed with `apt-get install ./blobdrive_*.deb` into a clean Debian
#     root (mmdebstrap minbase of this host's release; apt brings the declared
#     dependencies, nothing else is there), with /dev, /proc and /sys of
#     the host bound in, and with the installed binary:
#     `blobdrive doctor`, create a drive on Azurite, `mount -t blobdrive`
#     (mount(8) finds /sbin/mount.blobdrive), write a file; then the package
#     installed again (an upgrade: postinst hands the attached drive over to
#     the new binary, the drive stays mounted and keeps its file); unmount,
#     mount again read-only and read the file back; purge the package with
#     that mount attached (it stays, the removal names it), then a plain
#     umount detaches it.
# Every mount under the root is undone when the test ends, failed or not.
#
#   scripts/package-test.sh
#
# Environment: BLOBDRIVE_TEST_CONNECTION_STRING (the account; scripts/test.sh
# sets it for its Azurite). The clean root is kept as a tarball in
# .tools/debian-SUITE-minbase.tar (made once, about 100 s and 40 MB of
# downloads; delete it to make it again). Without root or /dev/fuse only the
# contents are checked and the rest prints SKIPPED (fails with
# BLOBDRIVE_REQUIRE_FUSE=1, as in CI).
set -euo pipefail

root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"
say() { echo "package-test.sh: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

: "${BLOBDRIVE_TEST_CONNECTION_STRING:?set BLOBDRIVE_TEST_CONNECTION_STRING to the test account}"
deb=$(ls target/debian/blobdrive_*.deb 2>/dev/null | head -n1)
[ -n "$deb" ] || fail "no target/debian/blobdrive_*.deb: run scripts/package.sh first"
started=$(date +%s)

# --- 1. contents ------------------------------------------------------------

say "contents of $deb"
contents=$(dpkg-deb --contents "$deb")
for path in ./usr/bin/blobdrive ./usr/lib/systemd/system/blobdrive@.service \
  ./usr/share/man/man1/blobdrive.1.gz ./usr/share/man/man8/mount.blobdrive.8.gz \
  ./usr/share/bash-completion/completions/blobdrive ./usr/share/zsh/site-functions/_blobdrive \
  ./usr/share/fish/vendor_completions.d/blobdrive.fish ./usr/share/doc/blobdrive/copyright; do
  grep -q " $path\( \|$\)" <<<"$contents" || fail "$path is not in the package"
done
grep -q ' ./sbin/mount.blobdrive -> /usr/bin/blobdrive$' <<<"$contents" ||
  fail "/sbin/mount.blobdrive is not a link to /usr/bin/blobdrive"
if grep -q '/usr/local' <<<"$contents"; then fail "the package installs into /usr/local"; fi
unpacked=$(mktemp -d)
root=
cleanup() {
  local status=$?
  if [ -n "$root" ] && [ -d "$root" ]; then
    # Drives still attached in the root (a failure midway): unmount them with
    # the installed binary, then undo every mount below the root, deepest first.
    for dir in /mnt/pkgtest /mnt/pkgtest-ro; do
      if mountpoint -q "$root$dir"; then
        chroot "$root" /usr/bin/blobdrive unmount "$dir" >&2 || true
      fi
    done
    local mounts
    mounts=$(awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    for m in $mounts; do
      umount "$m" 2>/dev/null || umount -l "$m" || true
    done
    if awk -v r="$root" '$5 == r || index($5, r "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
      say "mounts remain under $root; left in place"
    else
      rm -rf --one-file-system "$root"
    fi
  fi
  rm -rf "$unpacked"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
dpkg-deb -x "$deb" "$unpacked"
grep -q '^ExecStart=/usr/bin/blobdrive mount ' "$unpacked/usr/lib/systemd/system/blobdrive@.service" ||
  fail "the unit's ExecStart does not run /usr/bin/blobdrive"
grep -q '^ExecReload=/usr/bin/blobdrive upgrade ' "$unpacked/usr/lib/systemd/system/blobdrive@.service" ||
  fail "the unit's ExecReload does not run /usr/bin/blobdrive upgrade"
if readelf -S "$unpacked/usr/bin/blobdrive" | grep -q '\.debug_info'; then
  fail "/usr/bin/blobdrive is not stripped"
fi
say "binary: $(stat -c %s "$unpacked/usr/bin/blobdrive") bytes stripped (package $(stat -c %s "$deb") bytes)"

# --- 2. a clean Debian root -------------------------------------------------

# The root, its mounts and the drive's need root and /dev/fuse, like the
# mount tests: without them, SKIPPED (a failure with BLOBDRIVE_REQUIRE_FUSE=1).
why=
if [ "$(id -u)" != 0 ]; then
  why="not root (a chroot, loop devices and mounts need it)"
elif [ ! -c /dev/fuse ]; then
  why="no /dev/fuse"
fi
if [ -n "$why" ]; then
  [ "${BLOBDRIVE_REQUIRE_FUSE:-0}" = 1 ] && fail "$why (BLOBDRIVE_REQUIRE_FUSE=1)"
  echo "SKIPPED: package install test: $why"
  exit 0
fi

# The release of this host, from its own archive.
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
mirror=http://deb.debian.org/debian
if [ "$(. /etc/os-release && echo "$ID")" = ubuntu ]; then
  mirror=http://archive.ubuntu.com/ubuntu
fi
cached=.tools/debian-$suite-minbase.tar
if [ ! -s "$cached" ]; then
  say "making a clean $suite root (mmdebstrap --variant=minbase) into $cached"
  mkdir -p .tools
  mmdebstrap --quiet --variant=minbase --mode=root "$suite" "$cached.part" "$mirror"
  mv "$cached.part" "$cached"
fi
root=$(mktemp -d "$root_dir/target/package-test-root.XXXXXX")
tar -xf "$cached" -C "$root"
for fs in dev dev/pts proc sys; do
  mount --bind "/$fs" "$root/$fs"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

say "apt-get install ./$(basename "$deb") in the clean root"
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "./tmp/$(basename "$deb")" >/dev/null
installed=$(date +%s)

# --- 3. the installed binary against Azurite --------------------------------

install -m 0600 /dev/null "$root/root/credentials"
echo "AZURE_STORAGE_CONNECTION_STRING=$BLOBDRIVE_TEST_CONNECTION_STRING" >"$root/root/credentials"
with_account() {
  in_root env "AZURE_STORAGE_CONNECTION_STRING=$BLOBDRIVE_TEST_CONNECTION_STRING" "$@"
}
container=pkgtest-$(date +%s)-$$
drive=$container/d.vhd

say "blobdrive doctor"
with_account blobdrive doctor || fail "blobdrive doctor found a check that fails in the clean root"
with_account blobdrive create "$drive" --size 64M --mkfs ext4
mkdir -p "$root/mnt/pkgtest" "$root/mnt/pkgtest-ro"
in_root mount -t blobdrive "$drive" /mnt/pkgtest -o credentials=/root/credentials
echo "written through the installed package" >"$root/mnt/pkgtest/hello.txt"
sync -f "$root/mnt/pkgtest/hello.txt"
pid_before=$(in_root blobdrive list --mounted --json | grep -o '"pid": *[0-9]*' | head -n1)

say "the package again (an upgrade): postinst hands the drive over"
upgrade_log=$(in_root env DEBIAN_FRONTEND=noninteractive dpkg -i "/tmp/$(basename "$deb")" 2>&1) ||
  fail "dpkg -i (upgrade) failed: $upgrade_log"
echo "$upgrade_log" >&2
grep -q 'upgraded /mnt/pkgtest: ' <<<"$upgrade_log" || fail "postinst did not hand /mnt/pkgtest over"
mountpoint -q "$root/mnt/pkgtest" || fail "the upgrade unmounted the drive"
pid_after=$(in_root blobdrive list --mounted --json | grep -o '"pid": *[0-9]*' | head -n1)
[ "$pid_before" != "$pid_after" ] || fail "the daemon did not change on upgrade ($pid_after)"
grep -qx "written through the installed package" "$root/mnt/pkgtest/hello.txt" ||
  fail "the file changed across the upgrade"
in_root blobdrive unmount /mnt/pkgtest

say "read back on a second, read-only mount"
in_root mount -t blobdrive "$drive" /mnt/pkgtest-ro -o ro,credentials=/root/credentials
grep -qx "written through the installed package" "$root/mnt/pkgtest-ro/hello.txt" ||
  fail "the file did not reach the blob"

say "apt-get purge blobdrive with the drive attached: it stays attached, and the removal says so"
purge_log=$(in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq blobdrive 2>&1) ||
  fail "apt-get purge failed: $purge_log"
[ ! -e "$root/usr/bin/blobdrive" ] || fail "purge left /usr/bin/blobdrive"
grep -q 'these drives stay attached' <<<"$purge_log" || fail "the removal did not name the attached drive: $purge_log"
grep -q '/mnt/pkgtest-ro' <<<"$purge_log" || fail "the removal did not name /mnt/pkgtest-ro: $purge_log"
mountpoint -q "$root/mnt/pkgtest-ro" || fail "the removal unmounted the drive"
grep -qx "written through the installed package" "$root/mnt/pkgtest-ro/hello.txt" ||
  fail "the drive stopped serving after the removal"
# Without the binary, a plain umount still detaches it: the daemon notices
# and exits, taking its private FUSE mount with it.
in_root umount /mnt/pkgtest-ro
for _ in $(seq 1 100); do
  grep -q " $root/run/blobdrive" /proc/self/mountinfo || break
  sleep 0.1
done
if grep -q " $root/run/blobdrive" /proc/self/mountinfo; then
  fail "the daemon did not detach the drive after umount"
fi
AZURE_STORAGE_CONNECTION_STRING=$BLOBDRIVE_TEST_CONNECTION_STRING target/release/blobdrive delete "$drive" >/dev/null ||
  say "could not delete $drive (left on the test account)"
say "passed: install $((installed - started)) s, all $(($(date +%s) - started)) s"
