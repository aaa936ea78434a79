#!/usr/bin/env bash
# The main job, end to end on one machine: build blobdrive, start a persistent
# Azurite (data kept in .azurite/data across runs), create a demo drive with an
# ext4 filesystem (once: it is kept across runs), attach it at a directory and
# use it like any disk.
#
#   sudo scripts/demo.sh          (mounting needs root: FUSE, loop devices)
#
# Drive: BLOBDRIVE_DEMO_DRIVE (default demo/data.vhd, 1G, ext4).
# Directory: BLOBDRIVE_DEMO_DIR (default /mnt/blobdrive-demo).
# Port: BLOBDRIVE_AZURITE_PORT (default 10000). An account configured in the
# environment (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT) is used
# instead of Azurite; Azurite is still started so the demo has a fallback.
# The drive stays mounted when the demo ends; it prints how to unmount it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
port=${BLOBDRIVE_AZURITE_PORT:-10000}
drive=${BLOBDRIVE_DEMO_DRIVE:-demo/data.vhd}
dir=${BLOBDRIVE_DEMO_DIR:-/mnt/blobdrive-demo}

say() { echo "demo: $*" >&2; }

scripts/setup.sh --run

say "building blobdrive"
cargo build --quiet
bin="${CARGO_TARGET_DIR:-$root/target}/debug/blobdrive"

scripts/azurite.sh start

if [ -z "${AZURE_STORAGE_CONNECTION_STRING:-}${AZURE_STORAGE_ACCOUNT:-}" ] && [ "$port" != 10000 ]; then
  # Development storage on another port: the well-known (public) dev account.
  export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;"
fi

if [ "$(id -u)" != 0 ]; then
  say "mounting needs root (FUSE, loop devices, mount): run $0 as root"
  exit 1
fi

if "$bin" info "$drive" >/dev/null 2>&1; then
  say "drive $drive exists (kept from an earlier run)"
else
  say "blobdrive create $drive --size 1G --mkfs ext4"
  "$bin" create "$drive" --size 1G --mkfs ext4
fi

mkdir -p "$dir"
if mountpoint -q "$dir"; then
  say "$dir is already mounted (from an earlier run)"
else
  say "blobdrive mount $drive $dir"
  "$bin" mount "$drive" "$dir"
fi

say "writing and reading a file on $dir"
date -u "+written by scripts/demo.sh at %Y-%m-%dT%H:%M:%SZ" >> "$dir/demo.log"
sync "$dir/demo.log"
tail -n 3 "$dir/demo.log"
df -h "$dir"

say "blobdrive list --mounted"
"$bin" list --mounted

say "blobdrive stats $dir (requests the drive engine sent to the blob)"
"$bin" stats "$dir" | head -n 20

cat >&2 <<MSG
demo: $drive is mounted at $dir and stays mounted: use it like any disk.
demo:   snapshot it:  $bin snapshot $drive
demo:   unmount it:   $bin unmount $dir
MSG
