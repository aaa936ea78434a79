#!/usr/bin/env bash
# The main job, end to end on one machine: build blobdrive, start a persistent
# Azurite (data kept in .azurite/data across runs), and use it.
#
#   scripts/demo.sh
#
# Today it creates a demo drive (once: it is kept in Azurite's data across runs),
# shows it with 'info' and lists the drives; the mount step lands with attach.
# Drive name: BLOBDRIVE_DEMO_DRIVE (default demo/disk1.vhd), size 1G.
# Port: BLOBDRIVE_AZURITE_PORT (default 10000). An account configured in the
# environment (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT) is used
# instead of Azurite; Azurite is still started so the demo has a fallback.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
port=${BLOBDRIVE_AZURITE_PORT:-10000}

say() { echo "demo: $*" >&2; }

say "building blobdrive"
cargo build --quiet
bin="${CARGO_TARGET_DIR:-$root/target}/debug/blobdrive"

scripts/azurite.sh start

if [ -z "${AZURE_STORAGE_CONNECTION_STRING:-}${AZURE_STORAGE_ACCOUNT:-}" ] && [ "$port" != 10000 ]; then
  # Development storage on another port: the well-known (public) dev account.
  export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;"
fi

drive=${BLOBDRIVE_DEMO_DRIVE:-demo/disk1.vhd}
if "$bin" info "$drive" >/dev/null 2>&1; then
  say "drive $drive exists (kept from an earlier run)"
else
  say "blobdrive create $drive --size 1G"
  "$bin" create "$drive" --size 1G
fi

say "blobdrive info $drive"
"$bin" info "$drive"

say "blobdrive list"
"$bin" list
