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
#     (mount(8) finds /sbin/mount.blobdrive), write a file, and a namespace
#     mount of its container; then an upgrade to a newer package (the same
#     one repacked with a higher version and a binary whose version tag
#     says 0.1.0+pkgtest, as a later build would), by dpkg with root's PATH
#     and an old /usr/local/bin/blobdrive in it: postinst warns of that file,
#     hands the attached drive over to /usr/bin/blobdrive (the drive stays
#     mounted and keeps its file) and names the namespace mount as left on
#     the old binary; the same package again (a reinstall) leaves the drive on
#     its daemon; unmount, mount again read-only and read the file back;
#     purge the package with that mount attached and a blobdrive@ unit
#     enabled (the mount stays, the removal names it and the unit), then a
#     plain umount detaches it. Each step prints its time.
# Every mount under the root is undone when the test ends, failed or not.
#
#   scripts/package-test.sh
#
# Environment: BLOBDRIVE_TEST_CONNECTION_STRING (the account; scripts/test.sh
# sets it for its Azurite; it reaches the root's commands through a 0600 file,
# never a command line). The clean root is kept as a tarball in
# BLOBDRIVE_TEST_CACHE (default /var/cache/blobdrive-test, outside the clone,
# so CI's fresh clones on one machine share it) as debian-SUITE-minbase.tar:
# made when missing (about 100 s and 40 MB of downloads), else reused. Network
# steps (mmdebstrap, apt-get in the root) are tried up to 3 times. Without root or /dev/fuse only the
# contents are checked and the rest prints SKIPPED (fails with
# BLOBDRIVE_REQUIRE_FUSE=1, as in CI).
set -euo pipefail

root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"
say() { echo "package-test.sh: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

: "${BLOBDRIVE_TEST_CONNECTION_STRING:?set BLOBDRIVE_TEST_CONNECTION_STRING to the test account}"
deb=$(ls target/debian/blobdrive_*.deb 2>/dev/null | head -n1 || true)
[ -n "$deb" ] || fail "no target/debian/blobdrive_*.deb: run scripts/package.sh first"
started=$(date +%s)
step_started=$started
# Ends a step: its name and the seconds it took.
step_done() {
  local now
  now=$(date +%s)
  say "step: $1: $((now - step_started)) s"
  step_started=$now
}
# A network step, tried up to 3 times, 10 s apart.
retry() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    [ "$attempt" = 3 ] && return 1
    say "failed (attempt $attempt of 3), again in 10 s: $*"
    sleep 10
  done
}

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
    for dir in /mnt/pkgtest /mnt/pkgtest-ro /mnt/pkgtest-ns; do
      if mountpoint -q "$root$dir"; then
        chroot "$root" /usr/bin/blobdrive unmount "$dir" >&2 || true
      fi
    done
    # mountinfo writes space, tab and backslash as \040, \011, \134.
    local m
    awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
      sed 's/\\040/ /g; s/\\011/\t/g; s/\\134/\\/g' |
      while IFS= read -r m; do
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
cache=${BLOBDRIVE_TEST_CACHE:-/var/cache/blobdrive-test}
cached=$cache/debian-$suite-minbase.tar
if [ -s "$cached" ]; then
  say "the clean $suite root from $cached"
else
  say "making a clean $suite root (mmdebstrap --variant=minbase) into $cached"
  mkdir -p "$cache"
  make_root() {
    rm -f "$cached.part.$$"
    mmdebstrap --quiet --variant=minbase --mode=root --format=tar "$suite" "$cached.part.$$" "$mirror"
  }
  retry make_root || fail "mmdebstrap could not make the clean root"
  mv "$cached.part.$$" "$cached"
fi
root=$(mktemp -d "$root_dir/target/package-test-root.XXXXXX")
tar -xf "$cached" -C "$root"
# Slaves: an unmount inside the root never reaches the host's /dev or /sys.
for fs in dev dev/pts proc sys; do
  mount --bind "/$fs" "$root/$fs"
  mount --make-rslave "$root/$fs"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
step_done "clean root"

say "apt-get install ./$(basename "$deb") in the clean root"
retry in_root apt-get update -qq || fail "apt-get update failed in the clean root"
retry in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "./tmp/$(basename "$deb")" >/dev/null || fail "apt-get install failed in the clean root"
installed=$(date +%s)
step_done "install"

# --- 3. the installed binary against Azurite --------------------------------

# The account reaches the root's commands through 0600 files (printf and echo
# are shell builtins: no command line holds the key): mount.blobdrive's
# credentials= file, and the same as shell for with_account.
install -m 0600 /dev/null "$root/root/credentials"
install -m 0600 /dev/null "$root/root/account.sh"
echo "AZURE_STORAGE_CONNECTION_STRING=$BLOBDRIVE_TEST_CONNECTION_STRING" >"$root/root/credentials"
quoted=$(printf '%s' "$BLOBDRIVE_TEST_CONNECTION_STRING" | sed "s/'/'\\\\''/g")
printf "export AZURE_STORAGE_CONNECTION_STRING='%s'\n" "$quoted" >"$root/root/account.sh"
with_account() {
  # shellcheck disable=SC2016 # expanded by the root's shell
  in_root sh -c '. /root/account.sh && exec "$@"' sh "$@"
}
container=pkgtest-$(date +%s)-$$
drive=$container/d.vhd

say "blobdrive doctor"
with_account blobdrive doctor || fail "blobdrive doctor found a check that fails in the clean root"
with_account blobdrive create "$drive" --size 64M --mkfs ext4
mkdir -p "$root/mnt/pkgtest" "$root/mnt/pkgtest-ro" "$root/mnt/pkgtest-ns"
in_root mount -t blobdrive "$drive" /mnt/pkgtest -o credentials=/root/credentials
echo "written through the installed package" >"$root/mnt/pkgtest/hello.txt"
sync -f "$root/mnt/pkgtest/hello.txt"
pid_before=$(in_root blobdrive list --mounted --json | grep -o '"pid": *[0-9]*' | head -n1)
# A namespace mount of the container: no attach, nothing to hand over.
with_account blobdrive mount "$container" /mnt/pkgtest-ns
step_done "doctor, create, mount"

# The newer package: the same files, a higher version, and a binary whose
# version tag (same length, NUL-padded, as src/version.rs reads it) names a
# later build, so the handover is seen to reach it.
old_version=$(dpkg-deb --field "$deb" Version)
new_version=$old_version+pkgtest
tree=$unpacked/newer
dpkg-deb -R "$deb" "$tree"
perl -0777 -pi -e 's/blobdrive-version-tag:([0-9.]+)\0{8}/blobdrive-version-tag:$1+pkgtest/' "$tree/usr/bin/blobdrive"
grep -q 'blobdrive-version-tag:[0-9.]*+pkgtest' "$tree/usr/bin/blobdrive" ||
  fail "could not retag the binary of the newer package"
sed -i "s/^Version: .*/Version: $new_version/" "$tree/DEBIAN/control"
(cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum >DEBIAN/md5sums)
newer=$root/tmp/blobdrive_${new_version}_newer.deb
dpkg-deb --root-owner-group -b "$tree" "$newer" >/dev/null
dpkg --compare-versions "$new_version" gt "$old_version" || fail "$new_version is not newer than $old_version"

say "upgrade $old_version -> $new_version (dpkg -i, root's PATH, an old /usr/local/bin/blobdrive)"
# What scripts/install.sh left on a host: first in root's PATH. A postinst
# that ran it would fail the handover.
install -d "$root/usr/local/bin"
printf '#!/bin/sh\necho "the old /usr/local/bin/blobdrive ran" >&2\nexit 1\n' >"$root/usr/local/bin/blobdrive"
chmod 755 "$root/usr/local/bin/blobdrive"
root_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
upgrade_log=$(chroot "$root" env -i PATH=$root_path HOME=/root DEBIAN_FRONTEND=noninteractive \
  dpkg -i "/tmp/$(basename "$newer")" 2>&1) || fail "dpkg -i (upgrade) failed: $upgrade_log"
echo "$upgrade_log" >&2
grep -q 'warning: /usr/local/bin/blobdrive' <<<"$upgrade_log" || fail "postinst did not warn of /usr/local/bin/blobdrive"
grep -q 'the old /usr/local/bin/blobdrive ran' <<<"$upgrade_log" && fail "postinst ran /usr/local/bin/blobdrive"
grep -q "upgraded /mnt/pkgtest: version [0-9.]* (pid [0-9]*) -> [0-9.]*+pkgtest " <<<"$upgrade_log" ||
  fail "postinst did not hand /mnt/pkgtest over to the new binary"
grep -q '/mnt/pkgtest-ns: left on the old binary' <<<"$upgrade_log" ||
  fail "postinst did not name the namespace mount /mnt/pkgtest-ns as left on the old binary"
rm "$root/usr/local/bin/blobdrive"
mountpoint -q "$root/mnt/pkgtest" || fail "the upgrade unmounted the drive"
pid_after=$(in_root blobdrive list --mounted --json | grep -o '"pid": *[0-9]*' | head -n1)
[ "$pid_before" != "$pid_after" ] || fail "the daemon did not change on upgrade ($pid_after)"
grep -qx "written through the installed package" "$root/mnt/pkgtest/hello.txt" ||
  fail "the file changed across the upgrade"
step_done "upgrade"

say "the same package again (a reinstall): the drive stays on its daemon"
reinstall_log=$(in_root env DEBIAN_FRONTEND=noninteractive dpkg -i "/tmp/$(basename "$newer")" 2>&1) ||
  fail "dpkg -i (reinstall) failed: $reinstall_log"
echo "$reinstall_log" >&2
grep -q '/mnt/pkgtest: its daemon (pid [0-9]*) already runs this build' <<<"$reinstall_log" ||
  fail "the reinstall did not leave /mnt/pkgtest on its daemon"
pid_again=$(in_root blobdrive list --mounted --json | grep -o '"pid": *[0-9]*' | head -n1)
[ "$pid_again" = "$pid_after" ] || fail "the reinstall changed the daemon ($pid_after -> $pid_again)"
step_done "reinstall"
in_root blobdrive unmount /mnt/pkgtest
in_root blobdrive unmount /mnt/pkgtest-ns

say "read back on a second, read-only mount"
in_root mount -t blobdrive "$drive" /mnt/pkgtest-ro -o ro,credentials=/root/credentials
grep -qx "written through the installed package" "$root/mnt/pkgtest-ro/hello.txt" ||
  fail "the file did not reach the blob"

step_done "read back"

say "apt-get purge blobdrive with the drive attached and a unit enabled: both are named"
install -d "$root/etc/systemd/system/multi-user.target.wants"
ln -s /usr/lib/systemd/system/blobdrive@.service "$root/etc/systemd/system/multi-user.target.wants/blobdrive@pkgtest.service"
purge_log=$(in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq blobdrive 2>&1) ||
  fail "apt-get purge failed: $purge_log"
[ ! -e "$root/usr/bin/blobdrive" ] || fail "purge left /usr/bin/blobdrive"
grep -q 'these drives stay attached' <<<"$purge_log" || fail "the removal did not name the attached drive: $purge_log"
grep -q '/mnt/pkgtest-ro' <<<"$purge_log" || fail "the removal did not name /mnt/pkgtest-ro: $purge_log"
grep -q 'blobdrive@pkgtest.service is enabled and will no longer start at boot' <<<"$purge_log" ||
  fail "the removal did not name the enabled blobdrive@pkgtest.service: $purge_log"
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
step_done "purge"
say "passed: install $((installed - started)) s, all $(($(date +%s) - started)) s"
