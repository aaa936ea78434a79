#!/usr/bin/env bash
# blobdrive's performance, as ratios to the backend's own ceiling measured in
# the same run: builds release, starts its own in-memory Azurite, measures the
# raw REST client (examples/ceiling.rs), then the same kinds of I/O through
# blobdrive (attach + ext4, namespace mount + fio), and prints a table; the
# JSON goes to $CARGO_TARGET_DIR/bench/bench.json (or BENCH_OUT).
#
#   sudo scripts/bench.sh            full run (1 GiB sequential, 4 GiB RSS run)
#   sudo scripts/bench.sh --quick    smoke run (256 MiB, 512 MiB RSS run)
#   sudo scripts/bench.sh --model standard|p10|p30 [--quick]
#                                    the workloads through the service model
#                                    (service-model/, scripts/bench-model.sh)
#                                    instead of the default run
#
# Environment:
#   BENCH_GIB               sequential write/read size in GiB (default 1)
#   BENCH_RSS_GIB           data written for the peak-RSS figure (default 4)
#   BENCH_SECONDS           seconds per fio job (default 10)
#   BENCH_CEILING_SECONDS   seconds per ceiling level (default 3)
#   BENCH_READ_PAIRS        pairs of (raw pass, cold read), and of tier off/on and of
#                           plain/encrypted, alternating (default 10, 3 with --quick;
#                           with --model: pairs of raw pass and cold read, 5, 3 with --quick)
#   BENCH_READER_PAIRS      pairs of cold reads with cat and with dd bs=1M (default 4, 2 with --quick)
#   BENCH_LOG_ROUNDS        sequential writes with the write log on, and off, alternating (default 10 each, 4 with --quick)
#   BENCH_NBD_ROUNDS        NBD / loop-on-FUSE pairs of fio jobs, alternating (default 4, 2 with --quick)
#   BENCH_NBD_MIB           region the NBD step's fio jobs use, MiB (default: BENCH_GIB's, at most 1024)
#   BENCH_ONLY=nbd          run only the NBD step and its report (no ceiling, no other step)
#   BENCH_ONLY=read         run only the ceiling, the sequential write and the reads (cold
#                           read, disk tier, readers, encryption), and their report
#   BENCH_KILLS             kill -9s of an attach's serving process for the stall figure (default 10)
#   BENCH_STALL_RW          fio's --rw for the writes under those kills (default write)
#   BENCH_STALL_IOPS        their rate, writes/s (default 1000; 0: unthrottled)
#   BLOBDRIVE_AZURITE_PORT  port of the Azurite this script starts (default 10090)
#   BLOBDRIVE_AZURITE_NODE_FLAGS  flags for Azurite's node (default --heap-growing-percent=300)
#   BENCH_MODEL_PORT        port of the service model (--model; default Azurite's + 1)
#   BENCH_OUT               where the JSON goes
#
# Not a test: numbers on a shared machine are noisy, which is why every
# blobdrive figure is divided by a ceiling measured in the same run, and the
# reads, whose spread from one to the next is as large as their gaps to the
# targets, are measured in alternating pairs with Azurite on a core of its
# own and judged on the pairs (scripts/bench_stats.py).
#
# What a run judges (scripts/bench-report.py prints the verdicts):
# - pooled pairs: the mean of the per-pair ratios +- its standard error;
#   met when its 95% interval (mean +- t s.e., Student's t for the
#   pairs' count) is inside the target, MISSED when wholly
#   outside, else "unsettled" (more pairs, not more tuning), in --quick as
#   in a full run;
# - single measurements against a ceiling, and absolute figures of a
#   workload that --quick shortens or shrinks: met or MISSED in a full run,
#   "not judged (quick)" in --quick;
# - absolute figures of a workload that --quick leaves as it is (mount
#   times, the 32 MiB burst, the 512-byte burst's RSS, mkfs's stored bytes,
#   the stall and errors of the kills, the Gets of a read from the tier):
#   met or MISSED in both.
# A --quick run never prints MISSED for a row only because it is short.
#
# Everything it mounts, attaches or starts is torn down on exit, even on failure.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=0 model=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --model)
      model=${2:-}
      case $model in
        standard | p10 | p30) ;;
        *) echo "bench: --model wants standard, p10 or p30" >&2; exit 2 ;;
      esac
      shift
      ;;
    *) echo "bench: unknown argument $1 (--quick, --model standard|p10|p30)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then
  seq_mib=256 rss_mib=512 fio_seconds=${BENCH_SECONDS:-4} ceil_seconds=${BENCH_CEILING_SECONDS:-1}
  ceil_mib=256
else
  seq_mib=$((${BENCH_GIB:-1} * 1024)) rss_mib=$((${BENCH_RSS_GIB:-4} * 1024))
  fio_seconds=${BENCH_SECONDS:-10} ceil_seconds=${BENCH_CEILING_SECONDS:-3} ceil_mib=1024
fi
n_read_pairs=${BENCH_READ_PAIRS:-$((quick ? 3 : 10))}
n_reader_pairs=${BENCH_READER_PAIRS:-$((quick ? 2 : 4))}
only=${BENCH_ONLY:-}
case $only in
  '' | nbd | read) ;;
  *) echo "bench: BENCH_ONLY wants nbd or read" >&2; exit 2 ;;
esac
fio_mib=$((seq_mib < 1024 ? seq_mib : 1024)) # region fio reads and writes
warm_mib=128                                  # region re-read from the cache
extents=10000

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# The reports import scripts/bench_stats.py: no root-owned __pycache__ in the checkout.
export PYTHONDONTWRITEBYTECODE=1
export BLOBDRIVE_AZURITE_PORT=${BLOBDRIVE_AZURITE_PORT:-10090}
port=$BLOBDRIVE_AZURITE_PORT
export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;"
out=${BENCH_OUT:-$CARGO_TARGET_DIR/bench/bench.json}
bin=$CARGO_TARGET_DIR/release/blobdrive
ceiling=$CARGO_TARGET_DIR/release/examples/ceiling

say() { echo "bench: $(date -u +%T) $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "needs root (FUSE, loop devices, mount, drop_caches): run 'sudo $0'"
  exit 1
fi
if ! command -v fio >/dev/null; then
  say "installing fio"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fio >/dev/null
fi

work=$(mktemp -d /tmp/blobdrive-bench.XXXXXX)
shm=$(mktemp -d /dev/shm/blobdrive-bench.XXXXXX)
mounted=()   # directories to unmount, in order
fio_pid=     # a fio running in the background (the takeover step)
model_pid=   # the service model (--model), stopped after the unmounts
serve_pid=   # a `blobdrive serve` (the NBD step)
loop_dev=    # a loop device on a FUSE file (the NBD step's comparison)
azurite_started=0
res=$work/results   # "key value" lines, turned into JSON at the end
: >"$res"

cleanup() {
  local rc=$?
  set +e
  # fio of the takeover step, if a failure left it writing into a mount.
  if [ -n "$fio_pid" ] && kill -0 "$fio_pid" 2>/dev/null; then
    kill "$fio_pid"
    wait "$fio_pid" 2>/dev/null
  fi
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid"
    wait "$serve_pid" 2>/dev/null
  fi
  [ -n "$loop_dev" ] && losetup -d "$loop_dev" 2>/dev/null
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    local d=${mounted[i]}
    if mountpoint -q "$d" 2>/dev/null; then
      "$bin" unmount "$d" >/dev/null 2>&1 || umount -l "$d" 2>/dev/null
    fi
  done
  # The model goes after the unmounts: their last flushes pass through it.
  if [ -n "$model_pid" ] && kill -0 "$model_pid" 2>/dev/null; then
    kill "$model_pid"
    wait "$model_pid" 2>/dev/null
  fi
  [ "$azurite_started" = 1 ] && scripts/azurite.sh stop >/dev/null 2>&1
  # What was measured before a failure stays readable.
  mkdir -p "$(dirname "$out")" && cp "$res" "$(dirname "$out")/results.txt" 2>/dev/null
  rm -rf "$shm"
  rm -rf "$work" 2>/dev/null
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

put() { echo "$1 $2" >>"$res"; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }
mibps() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.1f}')" "$1" "$2"; }

# A counter of `blobdrive stats DIR --json`, summed over every object that has
# it (a namespace mount reports per drive).
stat() {
  "$bin" stats "$1" --json | python3 -c '
import json, sys
key = sys.argv[1]
def walk(v):
    if isinstance(v, dict):
        return sum(walk(x) for k, x in v.items() if k != key) + (v.get(key, 0) if isinstance(v.get(key), int) else 0)
    if isinstance(v, list):
        return sum(walk(x) for x in v)
    return 0
print(walk(json.load(sys.stdin)))' "$2"
}

# The command in the array `pin` (`taskset -c ...` during the reads, below;
# empty elsewhere) runs the mounts, and so the daemons they start.
pin=()
mount_drive() { # C/B DIR [args]
  mkdir -p "$2"
  "${pin[@]}" "$bin" mount "$@" >/dev/null
  mounted+=("$2")
}
unmount() {
  "$bin" unmount "$1" >/dev/null
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# fio job on FILE; prints IOPS. fio_run NAME FILE RW SIZE_MIB [extra...]
fio_run() {
  local name=$1 file=$2 rw=$3 size=$4
  shift 4
  fio --name="$name" --filename="$file" --rw="$rw" --bs=4k --direct=1 \
    --ioengine=libaio --iodepth=32 --size="${size}M" --runtime="$fio_seconds" \
    --time_based --group_reporting --output-format=json "$@" >"$work/fio-$name.json"
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(round(j["read"]["iops"] + j["write"]["iops"]))' "$work/fio-$name.json"
}

# pairs N A B: the measurements judged on pairs (scripts/bench_stats.py) are
# taken as N alternating pairs, `A i; B i` in odd pairs, `B i; A i` in
# even ones.
pairs() {
  local i
  for ((i = 1; i <= $1; i++)); do
    if ((i % 2)); then
      "$2" "$i"
      "$3" "$i"
    else
      "$3" "$i"
      "$2" "$i"
    fi
  done
}

# --- build and start ---------------------------------------------------------

say "building release"
cargo build --release --quiet --bin blobdrive --example ceiling
[ -n "$model" ] && cargo build --release --quiet -p service-model
scripts/azurite.sh install
if scripts/azurite.sh status 2>/dev/null; then
  say "something already listens on $port; set BLOBDRIVE_AZURITE_PORT to a free port"
  exit 1
fi
# The run writes about 15 GB, and Azurite frees what was overwritten or
# deleted only every 10 minutes: more than its default in-memory limit of
# half of a 24 GiB machine. Past its limit every Put Page fails (409
# MemoryExtentStoreAtSizeLimit) and the drive's writes with it, so the
# peak-RSS step, which writes 4 GiB, gets an Azurite of its own (below).
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.7)}' /proc/meminfo)
# Azurite's heap grows by a factor of four between full collections, not
# V8's own choice. V8 sets the next collection's limit from the live heap
# (about 53 MB here) times a factor it adapts, which sank to about 1.1 in
# some reads and not in others: each 4 MB that Azurite keeps from its
# requests then started a full collection, 30-47 per GiB read, whose
# concurrent marking took its core from the requests. Those reads, raw
# passes and drive reads alike, ran at 150-200 MiB/s against 300-370
# without (node --trace-gc, Azurite on a core of its own, 3 alternating
# rounds of each). With the factor fixed: at most one per GiB, and every
# round at 290-377. BLOBDRIVE_AZURITE_NODE_FLAGS set by the caller wins.
export BLOBDRIVE_AZURITE_NODE_FLAGS=${BLOBDRIVE_AZURITE_NODE_FLAGS---heap-growing-percent=300}
start_azurite() {
  BLOBDRIVE_AZURITE_MEMORY_MB=${BLOBDRIVE_AZURITE_MEMORY_MB:-$mem_mb} scripts/azurite.sh start --memory
  azurite_started=1
  azurite_pid=$(cat ".azurite/azurite-$port.pid")
}
# No Azurite here lives ten minutes under writes. Every ten minutes of its
# life Azurite sweeps the data that was overwritten or deleted, and the
# sweep first lists its whole table of extents (one per Put Page) without
# once letting a request in: with the table of 60 s of random 4 KiB Put
# Pages (34,000 extents) it took 267 s, and nothing was answered meanwhile
# (its debug log, a request timed beside it). A drive then rightly fails its
# writes after its retry budget, and a step's figures are the sweep's. So
# each step that writes much, and each pair of the NBD step, starts on a
# fresh one (its blobs made anew), and nothing before needs more than the
# first Azurite's ten minutes. fresh_azurite: stop the one running, start
# another (nothing may be mounted) with the run's container, $c, which the
# raw passes expect (`create` makes it; the drive is not kept).
fresh_azurite() {
  scripts/azurite.sh stop >/dev/null
  start_azurite
  "$bin" create "$c/container.vhd" --size 16M >/dev/null
  "$bin" delete "$c/container.vhd" >/dev/null
}
start_azurite

# Azurite's CPU share over a step: CPU seconds it used / wall seconds.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# CPU-seconds per GiB moved, from ticks T0 to T1 over MIB: per_gib T0 T1 MIB.
per_gib() { python3 -c "import os,sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / os.sysconf(\"SC_CLK_TCK\") * 1024 / float(sys.argv[3]):.2f}')" "$1" "$2" "$3"; }
azurite_cpu_begin() { az_t0=$(now) az_c0=$(cpu_ticks "$azurite_pid"); }
azurite_cpu_end() { # KEY
  local t1 c1
  t1=$(now) c1=$(cpu_ticks "$azurite_pid")
  put "$1" "$(python3 -c "import os,sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / os.sysconf(\"SC_CLK_TCK\") / (float(sys.argv[4]) - float(sys.argv[3])):.2f}')" "$az_c0" "$c1" "$az_t0" "$t1")"
}
# CPU ticks of Azurite's threads other than its main one (which serves the
# requests): V8's helper threads, busy with its garbage collector. Before
# the heap's growing factor was fixed (above), some passes and reads ran
# into a string of full collections (15-49 per GiB) that took those threads
# from about 0.1 to 1.5-5.5 CPU-seconds per GiB and others into none: the
# main source of the spread from round to round. The figure stays in the
# report, so a run where the collector wakes again shows it.
helper_ticks() {
  # A thread may end between the glob and the read: skip it.
  { cat /proc/"$azurite_pid"/task/*/stat 2>/dev/null || true; } |
    awk -v main="$azurite_pid" '$1 != main {s += $14 + $15} END {print s + 0}'
}
# Puts KEY: helper CPU-seconds per GiB between ticks T0 and now, for MIB.
helpers_end() { put "$1" "$(per_gib "$2" "$(helper_ticks)" "$3")"; } # KEY T0 MIB

say "random source: $seq_mib MiB in $shm"
head -c $((seq_mib << 20)) /dev/urandom >"$shm/random"

# The daemon serving mount DIR (attached drive or namespace mount).
daemon_pid() { # DIR
  "$bin" stats "$1" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])'
}
# An attach's holder (the process that forks the serving one and keeps the
# FUSE connection; see ARCHITECTURE.md, "When the serving process dies"),
# or nothing for a namespace mount, which has none.
holder_pid() { # DIR
  "$bin" stats "$1" --json | python3 -c 'import json, sys; print(json.load(sys.stdin).get("daemon", {}).get("holder_pid") or "")'
}
# The daemon's CPU seconds per GiB over a step: daemon_cpu_begin DIR, the
# step, daemon_cpu_end KEY MIB. An attach's daemon is two processes: the
# serving one and its holder (idle: it waits for its child and reads its
# heartbeat), so the figure is their sum; the holder's own ticks are left in
# dm_holder_ticks. Neither process may change during the step.
daemon_cpu_begin() {
  dm_pid=$(daemon_pid "$1") dm_holder=$(holder_pid "$1")
  dm_c0=$(cpu_ticks "$dm_pid") dm_h0=0
  [ -n "$dm_holder" ] && dm_h0=$(cpu_ticks "$dm_holder")
  return 0
}
daemon_cpu_end() { # KEY MIB
  local c1 h1=0
  c1=$(cpu_ticks "$dm_pid")
  [ -n "$dm_holder" ] && h1=$(cpu_ticks "$dm_holder")
  dm_holder_ticks=$((h1 - dm_h0))
  put "$1" "$(per_gib "$dm_c0" "$((c1 + dm_holder_ticks))" "$2")"
}

# --- NBD against the FUSE path (issue 32): the same fio jobs, side by side ------

# fio through `blobdrive serve` (fio's nbd engine) and through a loop device
# (direct I/O) on the same drive's FUSE file in a namespace mount: the path an
# attach's filesystem takes, less the filesystem. Each path is opened afresh
# (a cold cache) before its reads. The CPU figures are the serving process's
# (serve, or the namespace daemon); the kernel's FUSE and loop work is not in
# them. The two paths alternate, BENCH_NBD_ROUNDS pairs (the first path of a
# pair alternates too), so the machine's drift hits both; each figure is
# judged on the pairs' ratios (scripts/bench-nbd-report.py).
nbd_rounds() {
  local n_nbd=${BENCH_NBD_ROUNDS:-$((quick ? 2 : 4))} nbd_mib=${BENCH_NBD_MIB:-$fio_mib} round
  say "NBD vs loop on FUSE: sequential 1 MiB ($nbd_mib MiB) and random 4 KiB fio (${fio_seconds}s), $n_nbd alternating pairs"
  put nbd_load_avg_start "$(cut -d' ' -f1 /proc/loadavg)"
  nbd_sock=$work/nbd.sock
  nbd_uri="nbd+unix:///$c-nbd/nbd.vhd?socket=$nbd_sock"
  for ((round = 1; round <= n_nbd; round++)); do
    # A pair takes about three minutes and writes thousands of extents:
    # each on a fresh Azurite (see fresh_azurite), its drive made anew.
    fresh_azurite
    "$bin" create "$c-nbd/nbd.vhd" --size "$((nbd_mib + 256))M" >/dev/null
    if ((round % 2)); then
      path_round nbd serve_pid_of "$round"
      path_round fuse ns_pid_of "$round"
    else
      path_round fuse ns_pid_of "$round"
      path_round nbd serve_pid_of "$round"
    fi
  done
  put nbd_mib "$nbd_mib"
  put nbd_load_avg "$(cut -d' ' -f1 /proc/loadavg)"
}
serve_start() {
  "$bin" serve "$c-nbd/nbd.vhd" --nbd "unix:$nbd_sock" --foreground >/dev/null 2>>"$work/serve.log" &
  serve_pid=$!
  local i
  for ((i = 0; i < 200; i++)); do
    [ -S "$nbd_sock" ] && return 0
    sleep 0.05
  done
  say "blobdrive serve did not start: $(cat "$work/serve.log")"
  exit 1
}
serve_stop() {
  kill -TERM "$serve_pid"
  wait "$serve_pid"
  serve_pid=
}
loop_start() {
  mount_drive "$c-nbd" "$work/nbdns"
  loop_dev=$(losetup -f --show --direct-io=on "$work/nbdns/nbd.vhd")
}
loop_stop() {
  losetup -d "$loop_dev"
  loop_dev=
  unmount "$work/nbdns"
}
# path_fio PATH NAME RW BS [extra...]: fio on the nbd path or the loop device;
# prints "MiB/s IOPS".
path_fio() {
  local path=$1 name=$2 rw=$3 bs=$4
  shift 4
  local target=(--ioengine=libaio --direct=1 "--filename=$loop_dev")
  [ "$path" = nbd ] && target=(--ioengine=nbd "--uri=$nbd_uri")
  fio --name="$name" "${target[@]}" --rw="$rw" --bs="$bs" --iodepth=32 \
    --size="${nbd_mib}M" --group_reporting --output-format=json "$@" >"$work/fio-$path-$name.json"
  # The nbd engine says "fio: connected to NBD server" before the JSON.
  python3 -c '
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])["jobs"][0]
print(round((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20, 1), round(j["read"]["iops"] + j["write"]["iops"]))' "$work/fio-$path-$name.json"
}
# path_round PATH PID_OF N: the four jobs on one path, round N; PID_OF
# prints the serving process's pid.
path_round() {
  local path=$1 pid_of=$2 n=$3 start stop c0 h0 v
  [ "$path" = nbd ] && start=serve_start stop=serve_stop
  [ "$path" = fuse ] && start=loop_start stop=loop_stop
  $start
  c0=$(cpu_ticks "$($pid_of)") h0=$(host_ticks)
  v=$(path_fio "$path" seqwrite write 1M --end_fsync=1)
  put "${path}_seq_write_mibps_$n" "${v% *}"
  put "${path}_cpu_seq_write_$n" "$(per_gib "$c0" "$(cpu_ticks "$($pid_of)")" "$nbd_mib")"
  put "${path}_host_cpu_seq_write_$n" "$(per_gib "$h0" "$(host_ticks)" "$nbd_mib")"
  $stop
  $start
  c0=$(cpu_ticks "$($pid_of)") h0=$(host_ticks)
  v=$(path_fio "$path" seqread read 1M)
  put "${path}_seq_read_mibps_$n" "${v% *}"
  put "${path}_cpu_seq_read_$n" "$(per_gib "$c0" "$(cpu_ticks "$($pid_of)")" "$nbd_mib")"
  put "${path}_host_cpu_seq_read_$n" "$(per_gib "$h0" "$(host_ticks)" "$nbd_mib")"
  v=$(path_fio "$path" randread randread 4k --runtime="$fio_seconds" --time_based)
  put "${path}_rand_read_iops_$n" "${v#* }"
  v=$(path_fio "$path" randwrite randwrite 4k --runtime="$fio_seconds" --time_based --end_fsync=1)
  put "${path}_rand_write_iops_$n" "${v#* }"
  $stop
}
# The whole host's CPU ticks (user, nice, system, irq, softirq): fio, the
# kernel's FUSE and loop work, the server and Azurite together.
host_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
serve_pid_of() { echo "$serve_pid"; }
ns_pid_of() { daemon_pid "$work/nbdns"; }

# The table of the run (scripts/bench-report.py); the raw figures are kept
# beside the JSON first, so they survive a failed report.
report() {
  mkdir -p "$(dirname "$out")"
  cp "$res" "$(dirname "$out")/results.txt"
  python3 scripts/bench-report.py "$work/ceiling.keep" "$res" "$out" "$quick"
}

# BENCH_ONLY=nbd: this step alone (no ceiling), its report, and the end.
if [ "$only" = nbd ]; then
  c=bench
  nbd_rounds
  mkdir -p "$(dirname "$out")"
  cp "$res" "$(dirname "$out")/results.txt"
  python3 scripts/bench-nbd-report.py "$res" "$(dirname "$out")/bench-nbd.json"
  exit 0
fi

# With --model, the workloads through the service model instead (its own
# steps and report), then the end of the run.
if [ -n "$model" ]; then
  # shellcheck source=scripts/bench-model.sh
  source scripts/bench-model.sh
  exit 0
fi

# --- ceiling -------------------------------------------------------------------

say "ceiling: raw REST client, ${ceil_seconds}s per parallelism level"
azurite_cpu_begin
"$ceiling" --seconds "$ceil_seconds" --blob-mib "$ceil_mib" >"$work/ceiling.json"
azurite_cpu_end azurite_cpu_ceiling
cp "$work/ceiling.json" "$work/ceiling.keep"
# The ceiling's best parallelism for OP (put_4m, get_4m).
best_p() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["best_parallelism"])' "$work/ceiling.keep" "$1"; }
put_p=$(best_p put_4m)

# A raw pass of 4 MiB Put Pages writing SEQ_MIB of random bytes to a new
# blob (examples/ceiling.rs --put-pass, at the ceiling's best parallelism,
# the blob deleted after): the write ceiling timed just before the write it
# is compared with, as the read's is, rather than minutes earlier on a
# fresh backend. pass_mibps C/B prints the MiB/s of such a pass on blob C/B
# (its container must exist); put_pass KEY puts KEY_pass_mibps, on $c.
pass_mibps() {
  "$ceiling" --put-pass "$1" --parallelism "$put_p" --blob-mib "$seq_mib" >"$work/put-pass.json"
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["mibps"])' "$work/put-pass.json"
}
put_pass() { put "${1}_pass_mibps" "$(pass_mibps "$c/put-pass.bin")"; }

# --- sequential write and cold read through ext4 on an attached drive ----------

c=bench
say "sequential write: $seq_mib MiB into ext4 on an attached drive, then fsync"
"$bin" create "$c/seq.vhd" --size "$((seq_mib * 2 + 512))M" --mkfs ext4 >/dev/null
mount_drive "$c/seq.vhd" "$work/seq"
put_pass seq_write
p0=$(stat "$work/seq" put_page) u0=$(stat "$work/seq" bytes_up)
azurite_cpu_begin
daemon_cpu_begin "$work/seq"
t0=$(now)
dd if="$shm/random" of="$work/seq/file" bs=4M conv=fsync status=none
t1=$(now)
daemon_cpu_end daemon_cpu_seq_write "$seq_mib"
azurite_cpu_end azurite_cpu_seq_write
p1=$(stat "$work/seq" put_page) u1=$(stat "$work/seq" bytes_up)
put seq_write_mibps "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
put put_page_per_gib "$(python3 -c "print(round(($p1 - $p0) * 1024 / $seq_mib))")"
put bytes_up_per_gib "$(python3 -c "print(round(($u1 - $u0) * 1024 / $seq_mib))")"

# --- the reads: cold sequential read, disk tier, readers, encryption -------------

# One cold read of the file differs from the next by about ±12% here, with
# Azurite's share of the cores and the machine's other work: more than the
# gaps these rows judge. So each is a
# series of alternating pairs (the first of a pair alternates too, so the
# machine's drift hits both sides), judged on the per-pair ratios
# (scripts/bench_stats.py), with the backend on a core of its own (Azurite
# on the last CPU, everything of the client side on the others), as on the
# real service, where the backend never shares the client's cores: both
# sides slow down, but what is left between them is the client's own cost. Without a second CPU the
# pairs run unpinned (read_pinned 0 in the results, named in the report).
pin_azurite() {
  if [ "$(nproc)" -ge 2 ]; then
    taskset -a -p -c "$(($(nproc) - 1))" "$azurite_pid" >/dev/null
    pin=(taskset -c "0-$(($(nproc) - 2))")
  fi
}
unpin_azurite() {
  if [ "$(nproc)" -ge 2 ]; then
    taskset -a -p -c "0-$(($(nproc) - 1))" "$azurite_pid" >/dev/null
  fi
  pin=()
}

# The FUSE read requests and bytes the daemon serving DIR has answered
# ("requests bytes"), or nothing with a build whose stats lack the counters.
fuse_reads() { # DIR
  "$bin" stats "$1" --json | python3 -c '
import json, sys
keys = ("fuse_read_requests", "fuse_read_bytes")
found = {}
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k in keys and isinstance(x, int):
                found[k] = found.get(k, 0) + x
            else:
                walk(x)
    elif isinstance(v, list):
        for x in v:
            walk(x)
walk(json.load(sys.stdin))
if len(found) == len(keys):
    print(*(found[k] for k in keys))'
}

# The request sizes the kernel sends for a file on the attached drive at DIR
# are bounded by its loop device's queue: puts loop_read_ahead_kb and
# loop_max_sectors_kb, once.
loop_queue() { # DIR
  local q
  grep -q '^loop_read_ahead_kb ' "$res" && return 0
  q=/sys/block/$(basename "$(findmnt -n -o SOURCE "$1")")/queue
  [ -r "$q/read_ahead_kb" ] || return 0
  put loop_read_ahead_kb "$(cat "$q/read_ahead_kb")"
  put loop_max_sectors_kb "$(cat "$q/max_sectors_kb")"
}

# Seconds to read the file cold: drop caches, mount (ARGS...), read the file
# with $reader (dd bs=4M by default; dd1m: dd bs=1M; cat: cat), unmount.
# Leaves the number of Gets the read made in $work/gets. The command in the
# array `pin` runs the mount and the reader; with `meter` set to KEY, the
# daemon's CPU s/GiB, Azurite's share and its helper threads' CPU during
# the read are put as daemon_cpu_KEY, azurite_cpu_KEY and
# azurite_helpers_KEY, and with a build that counts them, the FUSE read
# requests and bytes as fuse_read_requests_KEY and fuse_read_bytes_KEY.
meter='' reader=''
cold_read() {
  drop_caches
  "${pin[@]}" "$bin" mount "$c/seq.vhd" "$work/seq" "$@" >/dev/null
  local g0 t0 t1 f0 f1 h0
  g0=$(stat "$work/seq" get)
  if [ -n "$meter" ]; then
    loop_queue "$work/seq"
    f0=$(fuse_reads "$work/seq")
    azurite_cpu_begin
    daemon_cpu_begin "$work/seq"
    h0=$(helper_ticks)
  fi
  t0=$(now)
  case $reader in
    cat) "${pin[@]}" cat "$work/seq/file" >/dev/null ;;
    dd1m) "${pin[@]}" dd if="$work/seq/file" of=/dev/null bs=1M status=none ;;
    *) "${pin[@]}" dd if="$work/seq/file" of=/dev/null bs=4M status=none ;;
  esac
  t1=$(now)
  if [ -n "$meter" ]; then
    daemon_cpu_end "daemon_cpu_$meter" "$seq_mib"
    azurite_cpu_end "azurite_cpu_$meter"
    helpers_end "azurite_helpers_$meter" "$h0" "$seq_mib"
    f1=$(fuse_reads "$work/seq")
    if [ -n "$f0" ] && [ -n "$f1" ]; then
      put "fuse_read_requests_$meter" "$((${f1% *} - ${f0% *}))"
      put "fuse_read_bytes_$meter" "$((${f1#* } - ${f0#* }))"
    fi
  fi
  echo $(($(stat "$work/seq" get) - g0)) >"$work/gets"
  unmount "$work/seq"
  elapsed "$t0" "$t1"
}
# One metered cold read, pair N of KEY: puts KEY_mibps_N, KEY_gets_N and
# cold_read's figures under KEY_N. read_cold KEY N [mount args...]
read_cold() {
  local key=$1 n=$2 secs
  shift 2
  meter="${key}_$n"
  secs=$(cold_read "$@")
  meter=
  put "${key}_gets_$n" "$(cat "$work/gets")"
  put "${key}_mibps_$n" "$(mibps "$seq_mib" "$secs")"
}
# A raw pass over the drive's blob under a read's conditions (caches
# dropped, the drive mounted), pair N: examples/ceiling.rs --pass, the raw
# client reading every 4 MiB slot of the blob that holds data at the
# ceiling's best Get parallelism. Puts seq_read_pass_mibps_N and
# azurite_helpers_seq_read_pass_N.
read_pass() { # N
  local mib secs h0
  drop_caches
  "${pin[@]}" "$bin" mount "$c/seq.vhd" "$work/seq" >/dev/null
  h0=$(helper_ticks)
  "${pin[@]}" "$ceiling" --pass "$c/seq.vhd" --parallelism "$get_p" >"$work/pass.json"
  read -r mib secs < <(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["mib"], j["seconds"])' "$work/pass.json")
  helpers_end "azurite_helpers_seq_read_pass_$1" "$h0" "$mib"
  unmount "$work/seq"
  put "seq_read_pass_mibps_$1" "$(mibps "$mib" "$secs")"
}
read_seq() { read_cold seq_read "$1"; }

unmount "$work/seq"
get_p=$(best_p get_4m)
pin_azurite
put read_pinned "$((${#pin[@]} > 0))"
where="Azurite sharing the cores"
[ ${#pin[@]} -gt 0 ] && where="Azurite on a core of its own"
say "cold sequential read: $n_read_pairs alternating pairs of (raw pass, read), $where"
pairs "$n_read_pairs" read_pass read_seq
put seq_read_gets "$(awk '$1 == "seq_read_gets_1" {print $2}' "$res")"

# --- the disk tier (issue 10): cold with it on and off, warm after a remount -------

# Each read with the tier on starts from an empty tier directory.
say "disk tier: $n_read_pairs alternating pairs of cold reads without it and with it, then a warm read after remount"
tier=$work/tier
tier_off() { read_cold tier_off "$1"; }
tier_on() {
  rm -rf "$tier"
  read_cold tier_on "$1" --cache-dir "$tier"
}
pairs "$n_read_pairs" tier_off tier_on
# A read with the tier on fills it; then read again after a remount, from
# the tier. (Not the pairs' last read: a mount without the tier between the
# two changes the blob (ext4 writes its superblock at mount), after which the
# tier rightly trusts nothing it holds.)
rm -rf "$tier"
cold_read --cache-dir "$tier" >/dev/null
warm=$(cold_read --cache-dir "$tier")
put tier_warm_mibps "$(mibps "$seq_mib" "$warm")"
put tier_warm_gets "$(cat "$work/gets")"
put tier_bytes "$(du -sb "$tier" | cut -f1)"
rm -rf "$tier"
# The same bytes from a local file on the disk that holds the tier.
cp "$shm/random" "$work/local"
drop_caches
t0=$(now)
"${pin[@]}" dd if="$work/local" of=/dev/null bs=4M status=none
t1=$(now)
put local_read_mibps "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
rm -f "$work/local"

# --- the reads people make: cat (128 KiB reads) against dd bs=1M -----------------

# Most programs (cat, cp, rsync) read 128 KiB at a time; dd bs=1M is the
# large reader. Both read the file cold, in alternating pairs.
say "readers: $n_reader_pairs alternating pairs of cold reads with cat and with dd bs=1M"
reader_cat() {
  reader='cat'
  read_cold reader_cat "$1"
  reader=
}
reader_dd() {
  reader=dd1m
  read_cold reader_dd "$1"
  reader=
}
pairs "$n_reader_pairs" reader_cat reader_dd

# --- encryption (issue 19): encrypted vs plain drives, side by side -------------

# One round of KIND (plain or crypt): a fresh drive with ext4, $seq_mib MiB
# written and fsynced, then read cold after a remount. Puts KIND_write_mibps_N,
# KIND_read_mibps_N and the daemon's CPU per GiB of each. The drive is
# deleted after.
crypt_round() { # KIND N
  local kind=$1 blob="$c/$1$2.vhd" keyargs=() create_args=() t0 t1
  fresh_azurite_for_pair "$2"
  [ "$kind" = crypt ] && keyargs=(--key-file "$work/key") create_args=(--encrypt)
  "$bin" create "$blob" --size "$((seq_mib + 512))M" --mkfs ext4 "${create_args[@]}" "${keyargs[@]}" >/dev/null
  mount_drive "$blob" "$work/enc" "${keyargs[@]}"
  daemon_cpu_begin "$work/enc"
  t0=$(now)
  "${pin[@]}" dd if="$shm/random" of="$work/enc/file" bs=4M conv=fsync status=none
  t1=$(now)
  daemon_cpu_end "daemon_cpu_${kind}_write_$2" "$seq_mib"
  put "${kind}_write_mibps_$2" "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
  unmount "$work/enc"
  drop_caches
  mount_drive "$blob" "$work/enc" "${keyargs[@]}"
  daemon_cpu_begin "$work/enc"
  t0=$(now)
  "${pin[@]}" dd if="$work/enc/file" of=/dev/null bs=4M status=none
  t1=$(now)
  daemon_cpu_end "daemon_cpu_${kind}_read_$2" "$seq_mib"
  put "${kind}_read_mibps_$2" "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
  unmount "$work/enc"
  "$bin" delete "$blob" >/dev/null
}
crypt_plain() { crypt_round plain "$1"; }
crypt_crypt() { crypt_round crypt "$1"; }
# A fresh Azurite for each pair: the pairs write 2 x $n_read_pairs x $seq_mib
# MiB, and Azurite frees deleted blobs only in a sweep every 10 minutes
# (with one Azurite for the whole step, one plain write of ten took 285 s
# instead of 15, at the ninth pair: ten minutes and 16 GiB in, when the
# first sweep runs, close to its memory limit).
# Each round makes its own drive (and `create` its container, $c, which the
# later steps expect to exist), so nothing is lost by the restart.
crypt_pair=
fresh_azurite_for_pair() { # N
  [ "$crypt_pair" = "$1" ] && return 0
  crypt_pair=$1
  unpin_azurite
  fresh_azurite
  pin_azurite
}
say "encryption: $n_read_pairs alternating pairs of plain and encrypted drives (sequential write, then cold read), each pair on a fresh Azurite"
(umask 077 && head -c 32 /dev/urandom >"$work/key")
pairs "$n_read_pairs" crypt_plain crypt_crypt
unpin_azurite

# BENCH_ONLY=read: the reads' report, and the end.
if [ "$only" = read ]; then
  report
  exit 0
fi

# --- random 4 KiB I/O with fio on the drive file of a namespace mount ----------

say "random 4 KiB: fio on a drive file (namespace mount), ${fio_seconds}s per job"
fresh_azurite
"$bin" create "$c-ns/fio.vhd" --size "$((fio_mib + 256))M" >/dev/null
mount_drive "$c-ns" "$work/ns"
dev=$work/ns/fio.vhd
dd if="$shm/random" of="$dev" bs=4M count=$((fio_mib / 4)) oflag=direct conv=notrunc,fsync status=none
unmount "$work/ns"
mount_drive "$c-ns" "$work/ns"
azurite_cpu_begin
put rand_read_iops "$(fio_run randread "$dev" randread "$fio_mib")"
azurite_cpu_end azurite_cpu_rand_read
put rand_read_gets "$(stat "$work/ns" get)"
put rand_write_iops "$(fio_run randwrite "$dev" randwrite "$fio_mib" --end_fsync=1)"
say "warm re-read: $warm_mib MiB read once, then fio from blobdrive's cache"
# A handle held open keeps the drive (and its cache) open between the
# pre-read and fio: a namespace mount closes a drive with its last handle.
exec 9<"$dev"
dd if="$dev" of=/dev/null bs=1M count="$warm_mib" iflag=direct status=none
put warm_read_iops "$(fio_run warmread "$dev" randread "$warm_mib")"
exec 9<&-
unmount "$work/ns"

say "the same fio jobs on tmpfs"
head -c $((fio_mib << 20)) "$shm/random" >"$shm/fio.img"
tmpfs_direct=1
fio --name=probe --filename="$shm/fio.img" --rw=read --bs=4k --direct=1 --size=4k \
  --output=/dev/null 2>/dev/null || tmpfs_direct=0
put tmpfs_direct "$tmpfs_direct"
put tmpfs_read_iops "$(fio_run tmpfsread "$shm/fio.img" randread "$fio_mib" --direct="$tmpfs_direct")"
put tmpfs_write_iops "$(fio_run tmpfswrite "$shm/fio.img" randwrite "$fio_mib" --direct="$tmpfs_direct")"
rm -f "$shm/fio.img"

# --- NBD against the FUSE path (issue 32), alternating pooled pairs ---------------

nbd_rounds

# --- the write-back cache (issue 18): a burst, its drain, sustained writes ------

# fio's write IOPS from its JSON output.
fio_iops() { python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$1"; }
# Seconds the mount at DIR spent in fsyncs and flushes on close so far.
fsync_seconds() {
  "$bin" stats "$1" --prometheus | awk '/^blobdrive_fsync_duration_seconds_sum/ {s += $2} END {print s + 0}'
}
# fio closes the drive file when its job ends, and FUSE makes every close a
# flush: the burst's dirty pages leave then, and that flush is the drain
# (its time from the fsync histogram, its requests from the Put Page count:
# with --flush-delay 1h and a burst below the budget, nothing leaves before).
say "write-back: a 32 MiB burst of random 4 KiB writes (qd32) over 1 GiB, then its drain"
fresh_azurite
"$bin" create "$c-wb/wb.vhd" --size 1024M >/dev/null
mount_drive "$c-wb" "$work/wb" --flush-delay 1h
wb=$work/wb/wb.vhd
exec 8<"$wb" # a read-only handle keeps the drive (and its counters) open
fio --name=burst --filename="$wb" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio \
  --iodepth=32 --size=1024M --io_size=32M --output-format=json >"$work/fio-burst.json"
put burst_iops "$(fio_iops "$work/fio-burst.json")"
drain_puts=$(stat "$work/wb" put_page)
drain_s=$(fsync_seconds "$work/wb")
put drain_put_pages "$drain_puts"
put drain_put_per_s "$(python3 -c "print(round($drain_puts / $drain_s) if $drain_s else 0)")"
exec 8<&-
unmount "$work/wb"

say "write-back: sustained random 4 KiB writes past an 8 MiB budget, ${fio_seconds}s"
mount_drive "$c-wb" "$work/wb" --max-dirty 8M
put sustained_write_iops "$(fio_run sustained "$wb" randwrite 1024)"
unmount "$work/wb"

# 8,192 writes of 512 bytes: more than the budget of a 128 MiB cache holds
# (28 MiB, about 5,600 4 KiB blocks with their bookkeeping). Not more: every
# one becomes a page range of its own in the blob, and Azurite's cost per
# Put Page grows with the number of ranges (at 50,000 it stopped answering).
say "write-back: peak RSS of a burst of scattered 512-byte writes, --cache-size 128M"
mount_drive "$c-wb" "$work/wb" --cache-size 128M --flush-delay 1h
exec 8<"$wb"
fio --name=tiny --filename="$wb" --rw=randwrite --bs=512 --direct=1 --ioengine=libaio \
  --iodepth=32 --size=1024M --io_size=4M --output-format=json >"$work/fio-tiny.json"
put tiny_burst_iops "$(fio_iops "$work/fio-tiny.json")"
put tiny_peak_rss_mib "$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$(daemon_pid "$work/wb")/status")"
exec 8<&-
unmount "$work/wb"

# --- mount time ----------------------------------------------------------------

# Seconds from nothing mounted to the first byte of the drive file: the
# namespace mount plus opening the drive (Get Page Ranges over the whole blob).
open_time() { # CONTAINER DIR FILE
  local t0 t1
  t0=$(now)
  mount_drive "$1" "$2"
  dd if="$2/$3" of=/dev/null bs=4k count=1 iflag=direct status=none
  t1=$(now)
  elapsed "$t0" "$t1"
  unmount "$2"
}

say "mount time: empty 8 TiB drive"
"$bin" create "$c-mt/empty.vhd" --size 8388607M >/dev/null
put mount_empty_8t_s "$(open_time "$c-mt" "$work/mt" empty.vhd)"

say "mount time: 8 TiB drive with $extents written extents"
python3 - "$shm/frag.img" "$extents" <<'PY'
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
size = (8 << 40) - (1 << 20)  # the largest drive: 8 TiB blob with the footer
step = size // n // 4096 * 4096
with open(path, "wb") as f:
    f.truncate(size)
    for i in range(n):
        f.seek(i * step)
        f.write(os.urandom(4096))
PY
"$bin" upload "$shm/frag.img" "$c-mt/frag.vhd" >/dev/null 2>&1
rm -f "$shm/frag.img"
put mount_10k_extents_s "$(open_time "$c-mt" "$work/mt" frag.vhd)"

# --- upload of a dense image (issue 9) ---------------------------------------------

say "upload: $seq_mib MiB dense raw image"
put_pass upload
t0=$(now)
"$bin" upload "$shm/random" "$c/upload.vhd" >/dev/null 2>&1
t1=$(now)
put upload_mibps "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"

# --- bytes stored after mkfs on 1 TiB --------------------------------------------

say "create --size 1T --mkfs ext4: bytes stored"
t0=$(now)
"$bin" create "$c/big.vhd" --size 1T --mkfs ext4 >/dev/null
t1=$(now)
put mkfs_1t_s "$(elapsed "$t0" "$t1")"
put mkfs_1t_stored_bytes "$("$bin" info "$c/big.vhd" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["stored_bytes"])')"

# --- peak RSS while writing with a 256 MiB cache -----------------------------------

say "peak RSS: writing $rss_mib MiB with --cache-size 256M (on a fresh Azurite)"
# An absolute figure, compared with no ceiling: a fresh Azurite holds the
# 4 GiB where the run's leftovers would not fit.
fresh_azurite
"$bin" create "$c/rss.vhd" --size "$((rss_mib + 1024))M" --mkfs ext4 >/dev/null
mount_drive "$c/rss.vhd" "$work/rss" --cache-size 256M
pid=$(daemon_pid "$work/rss")
written=0 i=0
while [ "$written" -lt "$rss_mib" ]; do
  dd if="$shm/random" of="$work/rss/f$i" bs=4M conv=fsync status=none
  written=$((written + seq_mib)) i=$((i + 1))
done
put rss_written_mib "$written"
put rss_cache_mib 256
put rss_peak_mib "$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")"
# The attach's write log is shared memory the serving process maps whole
# (about 88 MiB at this cache size), which VmHWM counts: reported apart, and
# the cache's bound judged on the rest.
put rss_log_mib "$(awk '/RssShmem/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")"
unmount "$work/rss"

# --- the write log (takeover): its cost, and the stall a kill -9 causes --------------

# Each pair of the write log's rounds on a fresh Azurite: a pair writes
# 4 x $seq_mib MiB (a raw pass and the file, with and without the log), and
# Azurite frees deleted blobs only in its sweep (see fresh_azurite): ten
# pairs on one Azurite passed its in-memory limit at the fifth, where every
# Put Page fails.

# One round of the write log's cost, MODE on or off (BLOBDRIVE_WRITE_LOG in
# the environment of `blobdrive mount`, which the daemon inherits): a fresh
# drive with ext4 attached, a raw pass of Put Pages timed just before (as
# for the sequential write above), then $seq_mib MiB written with dd and
# fsynced. Puts log_MODE_pass_mibps_N, log_MODE_write_mibps_N,
# daemon_cpu_log_MODE_N (holder + serving process) and
# holder_cpu_log_MODE_N; the drive is deleted after (Azurite's memory).
log_round() { # MODE ROUND
  local mode=$1 n=$2 blob="$c-log/$1$2.vhd" t0 t1
  "$bin" create "$blob" --size "$((seq_mib + 512))M" --mkfs ext4 >/dev/null
  BLOBDRIVE_WRITE_LOG=$mode mount_drive "$blob" "$work/log"
  # `stats` shows the log's size, or null without one: the mode took.
  if ! "$bin" stats "$work/log" --json | python3 -c '
import json, sys
log = json.load(sys.stdin)["daemon"].get("write_log")
sys.exit(0 if (log is None) == (sys.argv[1] == "off") else 1)' "$mode"; then
    say "write log $mode: stats says otherwise (daemon.write_log)"
    exit 1
  fi
  put "log_${mode}_pass_mibps_$n" "$(pass_mibps "$c-log/put-pass.bin")"
  daemon_cpu_begin "$work/log"
  t0=$(now)
  dd if="$shm/random" of="$work/log/file" bs=4M conv=fsync status=none
  t1=$(now)
  daemon_cpu_end "daemon_cpu_log_${mode}_$n" "$seq_mib"
  put "holder_cpu_log_${mode}_$n" "$(per_gib 0 "$dm_holder_ticks" "$seq_mib")"
  put "log_${mode}_write_mibps_$n" "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
  unmount "$work/log"
  "$bin" delete "$blob" >/dev/null
}
# On and off alternate, BENCH_LOG_ROUNDS times each, so the machine's drift hits
# both. Per mode: the writes' bytes over their summed time against the
# passes' (log_MODE_write_mibps, log_MODE_pass_mibps) and the mean daemon
# CPU (daemon_cpu_log_MODE).
n_log_rounds=${BENCH_LOG_ROUNDS:-$((quick ? 4 : 10))}
say "write log: sequential write with it on and off (BLOBDRIVE_WRITE_LOG=off), alternating, $n_log_rounds rounds each"
for ((round = 1; round <= n_log_rounds; round++)); do
  fresh_azurite
  log_round on "$round"
  log_round off "$round"
done
for mode in on off; do
  awk -v m="$mode" -v mib="$seq_mib" '
    $1 ~ "^log_" m "_write_mibps_[0-9]+$" {w += mib / $2; nw++}
    $1 ~ "^log_" m "_pass_mibps_[0-9]+$" {p += mib / $2; np++}
    $1 ~ "^daemon_cpu_log_" m "_[0-9]+$" {c += $2; nc++}
    END {
      printf "log_%s_write_mibps %.1f\n", m, mib * nw / w
      printf "log_%s_pass_mibps %.1f\n", m, mib * np / p
      printf "daemon_cpu_log_%s %.2f\n", m, c / nc
    }' "$res" >"$work/log-sums"
  cat "$work/log-sums" >>"$res"
done

# The longest I/O stall a kill -9 of the serving process causes: fio writes
# 4 KiB one at a time (O_DIRECT) into a 32 MiB file on ext4 on an attached
# drive, logging every write's completion time (Unix ms); every few seconds
# the serving process (pid from `stats`) is killed, and the next kill waits
# until `stats` shows its successor and that one has served 3 s (the holder
# ends the attach after 3 serving processes in a row that die within 2 s of
# serving). A kill's stall is the longest gap between two completions that
# overlaps the 2 s after it (the write in flight at the kill waits for the
# takeover and the replay); takeover_s_N is the kill to `stats` answering
# with the new pid.
# The writes are sequential (wrapping) at BENCH_STALL_IOPS by default, steady and
# below what the flush sustains: random 4 KiB writes stall 1-4 s with no
# kill at all, every 5-10 s, as ext4's journal commit sends a flush through the
# loop device and the flush waits for every scattered dirty page to be Put
# (measured: 1000 random writes/s, no kills, 30 s: four or five stalls of
# 1.8-3.7 s, fsyncs of about 1 s on average; sequential: none over 0.2 s).
# stall_baseline_max_s, the longest gap away from the kills, shows what the
# workload does by itself. BENCH_STALL_RW=randwrite BENCH_STALL_IOPS=0 gives
# the unthrottled random variant.
n_kills=${BENCH_KILLS:-10}
stall_rw=${BENCH_STALL_RW:-write} stall_iops=${BENCH_STALL_IOPS:-1000}
say "takeover: $n_kills kills of the serving process under 4 KiB writes ($stall_rw, qd1, ${stall_iops} IOPS, 0 = unthrottled) on ext4"
fresh_azurite
"$bin" create "$c-tk/stall.vhd" --size 512M --mkfs ext4 >/dev/null
mount_drive "$c-tk/stall.vhd" "$work/tk"
dd if="$shm/random" of="$work/tk/fio.dat" bs=1M count=32 conv=fsync status=none
mkdir -p "$work/stall"
# Long enough for every kill; fio is stopped (SIGINT) after the last one.
fio --name=stall --filename="$work/tk/fio.dat" --rw="$stall_rw" --bs=4k --direct=1 \
  --ioengine=psync --iodepth=1 --size=32M --time_based --runtime=$((n_kills * 20 + 60)) \
  --rate_iops="$stall_iops" --continue_on_error=write \
  --write_lat_log="$work/stall/stall" --log_avg_msec=0 --log_unix_epoch=1 \
  --output-format=json --output="$work/fio-stall.json" >/dev/null 2>&1 &
fio_pid=$!
sleep 3
: >"$work/kills"
tk0=$(stat "$work/tk" takeovers)
for ((k = 1; k <= n_kills; k++)); do
  old=$(daemon_pid "$work/tk")
  killed=$(now)
  kill -9 "$old"
  # `stats` waits for a successor; poll until it answers with another pid.
  until new=$(daemon_pid "$work/tk" 2>/dev/null) && [ "$new" != "$old" ]; do
    if python3 -c "import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) < 60)" "$killed" "$(now)"; then
      say "takeover: no successor within 60 s of kill $k"
      exit 1
    fi
    sleep 0.05
  done
  ready=$(now)
  echo "$killed" >>"$work/kills"
  put "takeover_s_$k" "$(elapsed "$killed" "$ready")"
  kill -0 "$fio_pid" 2>/dev/null || { say "takeover: fio ended during kill $k"; exit 1; }
  sleep 3
done
put takeover_kills "$(($(stat "$work/tk" takeovers) - tk0))"
kill -INT "$fio_pid"
wait "$fio_pid" || true # 128 after SIGINT; its errors are in the JSON
unmount "$work/tk"
python3 - "$work/fio-stall.json" "$work/stall/stall_lat.1.log" "$work/kills" >>"$res" <<'PY'
import bisect, json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
# The takeover promises none; fio counts them and goes on (continue_on_error).
print(f"stall_write_errors {job.get('total_err', 1 if job['error'] else 0)}")
done = sorted(int(line.split(",")[0]) for line in open(sys.argv[2]))
kills = [float(line) * 1000 for line in open(sys.argv[3])]
gaps = list(zip(done, done[1:]))
stalls, near = [], set()
for i, t in enumerate(kills, 1):
    # Gaps (a, b) overlapping [t, t + 2 s].
    lo = max(bisect.bisect_right(done, t) - 1, 0)
    hi = bisect.bisect_right(done, t + 2000)
    window = range(lo, min(hi, len(gaps)))
    near.update(window)
    s = max((gaps[j][1] - gaps[j][0] for j in window), default=None)
    if s is None or done[-1] <= t:
        sys.exit(f"fio completed no write after kill {i}")
    stalls.append(s / 1000)
    print(f"stall_s_{i} {s / 1000:.3f}")
stalls.sort()
print(f"stall_p50_s {stalls[len(stalls) // 2]:.3f}")
print(f"stall_max_s {stalls[-1]:.3f}")
# The longest gap away from the kills, for comparison (flushes, throttling).
print(f"stall_baseline_max_s {max((b - a for j, (a, b) in enumerate(gaps) if j not in near), default=0) / 1000:.3f}")
print(f"stall_write_iops {round(job['write']['iops'])}")
PY
put takeover_p50_s "$(awk '$1 ~ /^takeover_s_[0-9]+$/ {print $2}' "$res" | sort -g | awk '{v[NR] = $1} END {print v[int(NR / 2) + 1]}')"

# --- report --------------------------------------------------------------------------

report
echo
python3 scripts/bench-nbd-report.py "$res" "$(dirname "$out")/bench-nbd.json"
