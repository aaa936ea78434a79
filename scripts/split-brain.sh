#!/usr/bin/env bash
# A long search for split brain: runs the two-host fault-schedule test
# (tests/split_brain.rs) over N random schedules, going on past a schedule
# that finds a violation, and prints at the end how many schedules ran, the
# faults injected, the violations found and how long it took. Each failing
# schedule's seed, its operations and the check that failed are in the
# output above the summary, and in the log file it names.
#
#   scripts/split-brain.sh --schedules N [--seed S]
#
# --seed S replays a run: schedule i uses S plus i times a fixed constant,
# so `--schedules 1 --seed <a failing schedule's seed>` replays that one.
# Needs what the many-hosts tests need: root, /dev/fuse, loop devices,
# ip(8), nsenter, the Python azure-storage-blob SDK, and an Azurite to start
# in the storage namespace (scripts/azurite.sh install, or
# BLOBDRIVE_AZURITE_BIN). Exits non-zero when a violation was found.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

usage() {
  echo "usage: scripts/split-brain.sh --schedules N [--seed S]" >&2
  exit 2
}

schedules=
seed=
while [ $# -gt 0 ]; do
  case "$1" in
    --schedules) [ $# -ge 2 ] || usage; schedules=$2; shift 2 ;;
    --seed) [ $# -ge 2 ] || usage; seed=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "split-brain.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$schedules" =~ ^[0-9]+$ && "$schedules" -gt 0 ]] || usage
if [ -n "$seed" ] && ! [[ "$seed" =~ ^[0-9]+$ ]]; then
  echo "split-brain.sh: --seed takes a number (a schedule's BLOBDRIVE_SPLIT_BRAIN_SEED)" >&2
  exit 2
fi

export BLOBDRIVE_SPLIT_BRAIN_SCHEDULES=$schedules
export BLOBDRIVE_SPLIT_BRAIN_KEEP_GOING=1
export BLOBDRIVE_REQUIRE_FUSE=1
if [ -n "$seed" ]; then
  export BLOBDRIVE_SPLIT_BRAIN_SEED=$seed
fi

log=$(mktemp /tmp/split-brain.XXXXXX.log)
start=$(date +%s)
set +e
# The soak profile (.config/nextest.toml) never ends the test for its time.
cargo nextest run --profile split-brain-soak --test split_brain --no-capture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
end=$(date +%s)

summary=$(grep -E '^split-brain summary:' "$log" | tail -1 || true)
echo
echo "=== split-brain search ($(( end - start )) s in all, log: $log)"
if [ -n "$summary" ]; then
  # "split-brain summary: R schedules run, F faults injected, V violations found, D s"
  echo "$summary" | sed -E 's/^split-brain summary: //' |
    awk -F', ' '{ for (i = 1; i <= NF; i++) print "  " $i }'
else
  echo "  the test ended before its summary (see the log): exit status $status"
fi
# Each violation is printed when found and again in the test's failure.
grep -E '^split brain in schedule' "$log" | sed -E 's/: .*//; s/^/  found: /' | awk '!seen[$0]++' || true
exit "$status"
