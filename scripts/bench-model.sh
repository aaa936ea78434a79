# shellcheck shell=bash disable=SC2154 # the variables and helpers of bench.sh, which sources it
# Sourced by scripts/bench.sh for `--model standard|p10|p30`, once it has
# built, started its Azurite and defined its helpers: the workloads through
# the service model (service-model/: a proxy in front of that Azurite with
# the service's latency and per-blob caps), each as a ratio to the model's
# own limit and to a raw pass of the project's REST client
# (examples/ceiling.rs) through the same model in the same run, with the
# share of requests the model answered 503 ServerBusy in each step. The
# default run's steps do not run; its JSON goes to $out as usual.
#
# Steps (sizes from bench.sh: $seq_mib, $fio_seconds):
#   raw passes   4 MiB Put Pages and Gets, $model_raw_p in flight; 4 KiB Gets
#                at 32 in flight; 4 KiB Put Pages at 1 and 8 in flight
#   seq write    dd bs=4M conv=fsync into ext4 on an attached drive (vs the
#                byte cap)
#   cold read    that file, cold, in $model_read_pairs alternating pairs with
#                a raw Get pass over the same blob (vs the lower of the byte
#                cap and the pair's pass, pooled over the pairs)
#   rand read    fio 4 KiB randread qd32 on a drive file of a namespace mount,
#                cold (vs the request cap)
#   fdatasync    fio 4 KiB random overwrites of that file in ext4,
#                fdatasync after each, qd1 (vs one round trip each)
#   fsync loop   fio 4 KiB randwrite, O_DIRECT, fsync after each, qd1, on
#                the same drive file (vs one round trip each)
#   drain        a burst of random 4 KiB writes with --flush-delay 1h, then
#                its flush at close (vs the request cap)
#
# Environment: BENCH_MODEL_PORT (default Azurite's port + 1),
# BENCH_MODEL_RAW_P (4 MiB requests in flight in the raw passes, default
# 8: as many as the engine keeps in flight, enough to keep a cap busy
# through the round trip and each body's time on its link, and 32 MiB, which
# standard's 60 MiB/s queues for about 0.5 s, inside the queue bound),
# BENCH_READ_PAIRS (pairs of raw pass and cold read; default 3 with
# --quick, else 5).
#
# What it judges (scripts/bench-model-report.py, scripts/bench_stats.py):
# the cold read on its pairs (mean of the per-pair ratios +- standard
# error: met, MISSED, or unsettled while the 95% interval (mean +- t s.e.) straddles the
# target), in --quick as in a full run; every other row is one measurement,
# met or MISSED in a full run and "not judged (quick)" in --quick, as is the
# share of 503s. Each row shows its ratio to the lower of the model's limit
# and its raw pass, naming the bound used (model or raw).

model_bin=$CARGO_TARGET_DIR/release/service-model
model_port=${BENCH_MODEL_PORT:-$((port + 1))}
model_raw_p=${BENCH_MODEL_RAW_P:-8}
if [ "$quick" = 1 ]; then
  model_read_pairs=${BENCH_READ_PAIRS:-3} burst_mib=8
else
  model_read_pairs=${BENCH_READ_PAIRS:-5} burst_mib=32
fi
model_url=http://127.0.0.1:$model_port

say "service model '$model' on 127.0.0.1:$model_port in front of Azurite on $port"
trace=$work/model-trace.tsv
"$model_bin" --profile "$model" --upstream "127.0.0.1:$port" --listen "127.0.0.1:$model_port" \
  --trace "$trace" >"$work/model.out" 2>"$work/model.log" &
model_pid=$!
for _ in $(seq 1 100); do
  [ -s "$work/model.out" ] && break
  kill -0 "$model_pid" 2>/dev/null || { say "the model did not start: $(cat "$work/model.log")"; exit 1; }
  sleep 0.1
done
[ -s "$work/model.out" ] || { say "the model did not start within 10 s"; exit 1; }
# Every client of the run (blobdrive, the ceiling's raw passes) goes through it.
export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=$model_url/devstoreaccount1;"
curl -sf "$model_url/.model/profile" >"$work/model-profile.json"
# The model's limits: byte cap in MiB/s, request cap per second, round trip in ms.
read -r cap_mibps cap_rps rtt_ms < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
print(p["blob"]["bytes_per_s"] / 2**20, p["blob"]["requests_per_s"], p["rtt_ms"])' "$work/model-profile.json")
put model_cap_mibps "$cap_mibps"
put model_cap_rps "$cap_rps"
put model_rtt_ms "$rtt_ms"

# The model's counters around a step: model_begin, the step, model_end KEY
# puts KEY_requests, KEY_busy (503s), KEY_queued (requests that waited for
# a cap) and KEY_queue_wait_s (their waits summed) for the step, and from
# the model's trace (the step's lines): KEY_upstream_ms (the mean time
# Azurite took per request), KEY_mean_kib (body KiB per request) and
# KEY_in_flight (requests in the model at once, on average over the step:
# each one's round trip, wait, upstream time and bodies' link time, summed,
# over the step's span).
model_snapshot() { curl -sf "$model_url/.model/stats"; }
model_begin() { model_snapshot >"$work/model-0.json"; trace_l0=$(wc -l <"$trace"); }
model_end() { # KEY
  model_snapshot >"$work/model-1.json"
  python3 - "$work/model-0.json" "$work/model-1.json" "$1" "$trace" "$trace_l0" "$work/model-profile.json" >>"$res" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
key = sys.argv[3]
for k in ("requests", "busy", "queued", "refused_connections"):
    print(f"{key}_{k} {b[k] - a[k]}")
print(f"{key}_queue_wait_s {b['queue_wait_s'] - a['queue_wait_s']:.3f}")
profile = json.load(open(sys.argv[6]))
rtt, link = profile["rtt_ms"], profile["link_bytes_per_s"]
lines = open(sys.argv[4]).read().splitlines()[int(sys.argv[5]):]
rows = [l.split("\t") for l in lines if l and not l.startswith("t_ms")]
if rows:
    busy_time = 0.0
    start, end = float("inf"), 0.0
    ups = []
    kib = []
    for t, method, blob, up, down, wait, upstream, status in rows:
        t, up, down, wait, upstream = float(t), int(up), int(down), float(wait), float(upstream)
        body_ms = (up + down) / link * 1000 if link else 0.0
        busy_time += rtt + wait + upstream + body_ms
        start = min(start, t - rtt / 2)
        end = max(end, t + wait + upstream + body_ms + rtt / 2)
        if status != "503":
            ups.append(upstream)
            kib.append((up + down) / 1024)
    print(f"{key}_upstream_ms {sum(ups) / len(ups) if ups else 0:.2f}")
    print(f"{key}_mean_kib {sum(kib) / len(kib) if kib else 0:.1f}")
    print(f"{key}_in_flight {busy_time / (end - start) if end > start else 0:.2f}")
PY
}

# fio's error (errno; 0: none) of job NAME run by fio_run: a failed job
# shows 0 IOPS, and this says why.
fio_error() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["jobs"][0]["error"])' "$work/fio-$1.json" 2>/dev/null || echo -1; }

# A raw pass through the model, printing its rate: raw_small MODE C/B P MIB
# (MODE small-read or small-write: 4 KiB requests, IOPS).
raw_small() {
  "$ceiling" "--$1" "$2" --parallelism "$3" --seconds "$fio_seconds" --blob-mib "$4" >"$work/raw.json"
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["iops"])' "$work/raw.json"
}
# 4 MiB Put Pages writing $seq_mib MiB to a new blob C/B, $model_raw_p in
# flight; prints MiB/s.
raw_put_pass() {
  "$ceiling" --put-pass "$1" --parallelism "$model_raw_p" --blob-mib "$seq_mib" >"$work/put-pass.json"
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["mibps"])' "$work/put-pass.json"
}

# --- sequential write and cold read through ext4 ---------------------------------

c=bench
"$bin" create "$c/seq.vhd" --size "$((seq_mib * 2 + 512))M" --mkfs ext4 >/dev/null
mount_drive "$c/seq.vhd" "$work/seq"
say "raw 4 MiB Put Pages through the model, $model_raw_p in flight"
model_begin
put model_put_pass_mibps "$(raw_put_pass "$c/put-pass.bin")"
model_end model_put_pass
say "sequential write: $seq_mib MiB into ext4 on an attached drive, then fsync"
model_begin
t0=$(now)
dd if="$shm/random" of="$work/seq/file" bs=4M conv=fsync status=none
t1=$(now)
model_end model_seq_write
put model_seq_write_mibps "$(mibps "$seq_mib" "$(elapsed "$t0" "$t1")")"
unmount "$work/seq"

# The cold read and its raw Get pass, in alternating pairs (the pass first
# in odd pairs, the read first in even ones): judged on the pairs' ratios.
model_pass() { # N
  local mib secs
  drop_caches
  model_begin
  "$ceiling" --pass "$c/seq.vhd" --parallelism "$model_raw_p" >"$work/pass.json"
  model_end "model_get_pass_$1"
  read -r mib secs < <(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["mib"], j["seconds"])' "$work/pass.json")
  put "model_get_pass_mibps_$1" "$(mibps "$mib" "$secs")"
  echo "$mib $secs" >>"$work/model-passes"
}
model_read() { # N
  local t0 t1 secs
  drop_caches
  "$bin" mount "$c/seq.vhd" "$work/seq" >/dev/null
  model_begin
  t0=$(now)
  dd if="$work/seq/file" of=/dev/null bs=4M status=none
  t1=$(now)
  model_end "model_seq_read_$1"
  unmount "$work/seq"
  secs=$(elapsed "$t0" "$t1")
  put "model_seq_read_mibps_$1" "$(mibps "$seq_mib" "$secs")"
  echo "$secs" >>"$work/model-reads"
}
say "cold sequential read: $model_read_pairs alternating pairs of (raw Get pass, $model_raw_p in flight; read)"
: >"$work/model-passes"
: >"$work/model-reads"
pairs "$model_read_pairs" model_pass model_read
# Bytes over summed time, for the table's blobdrive and raw pass columns.
put model_seq_read_mibps "$(awk -v mib="$seq_mib" '{s += $1} END {printf "%.1f", mib * NR / s}' "$work/model-reads")"
put model_get_pass_mibps "$(awk '{m += $1; s += $2} END {printf "%.1f", m / s}' "$work/model-passes")"

# Overwrites of blocks the file already holds, each followed by fdatasync:
# no allocation and no size change, so ext4 has no metadata to commit and
# each fdatasync should cost the drive one flush of one dirty run.
say "fdatasync loop: 4 KiB overwrites of the written file in ext4, fdatasync after each, qd1, ${fio_seconds}s"
"$bin" mount "$c/seq.vhd" "$work/seq" >/dev/null
model_begin
put model_fdatasync_iops "$(fio_run model-fdatasync "$work/seq/file" randwrite "$seq_mib" --direct=0 --ioengine=psync --iodepth=1 --fdatasync=1)"
model_end model_fdatasync
put model_fdatasync_fio_error "$(fio_error model-fdatasync)"
unmount "$work/seq"

# --- random 4 KiB on a drive file of a namespace mount ------------------------------

say "random 4 KiB: a $fio_mib MiB region written, then raw Gets and fio randread qd32 (cold), ${fio_seconds}s each"
"$bin" create "$c-ns/fio.vhd" --size "$((fio_mib + 256))M" >/dev/null
mount_drive "$c-ns" "$work/ns"
dev=$work/ns/fio.vhd
dd if="$shm/random" of="$dev" bs=4M count=$((fio_mib / 4)) oflag=direct conv=notrunc,fsync status=none
unmount "$work/ns"
model_begin
put model_raw_get_4k_iops "$(raw_small small-read "$c-ns/fio.vhd" 32 "$fio_mib")"
model_end model_raw_get_4k
mount_drive "$c-ns" "$work/ns"
model_begin
put model_rand_read_iops "$(fio_run model-randread "$dev" randread "$fio_mib")"
model_end model_rand_read
put model_rand_read_fio_error "$(fio_error model-randread)"

say "write + fsync loop: 4 KiB O_DIRECT writes, fsync after each, qd1, ${fio_seconds}s; raw 4 KiB Put Pages at 1 in flight"
model_begin
put model_fsync_iops "$(fio_run model-fsync "$dev" randwrite "$fio_mib" --ioengine=psync --iodepth=1 --fsync=1)"
model_end model_fsync
put model_fsync_fio_error "$(fio_error model-fsync)"
unmount "$work/ns"
model_begin
put model_raw_put_4k_p1_iops "$(raw_small small-write "$c-ns/raw-small.bin" 1 "$fio_mib")"
model_end model_raw_put_4k_p1

# The burst's drain, as in the default run: with --flush-delay 1h nothing
# leaves before fio closes the file, and that close's flush is the drain
# (its time from the fsync histogram, its requests from the Put Page count).
say "drain: a $burst_mib MiB burst of random 4 KiB writes (qd32) over 1 GiB, then its flush; raw 4 KiB Put Pages at 8 in flight"
"$bin" create "$c-wb/wb.vhd" --size 1024M >/dev/null
mount_drive "$c-wb" "$work/wb" --flush-delay 1h
wb=$work/wb/wb.vhd
exec 8<"$wb"
model_begin
fio --name=burst --filename="$wb" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio \
  --iodepth=32 --size=1024M --io_size="${burst_mib}M" --output-format=json >"$work/fio-burst.json"
model_end model_drain
drain_puts=$(stat "$work/wb" put_page)
drain_s=$("$bin" stats "$work/wb" --prometheus | awk '/^blobdrive_fsync_duration_seconds_sum/ {s += $2} END {print s + 0}')
put model_drain_put_pages "$drain_puts"
put model_drain_put_per_s "$(python3 -c "print(round($drain_puts / $drain_s) if $drain_s else 0)")"
exec 8<&-
unmount "$work/wb"
model_begin
put model_raw_put_4k_p8_iops "$(raw_small small-write "$c-wb/raw-small.bin" 8 1024)"
model_end model_raw_put_4k_p8

model_snapshot >"$work/model-final.json"
mkdir -p "$(dirname "$out")"
cp "$trace" "$(dirname "$out")/model-trace.tsv"

# --- report ------------------------------------------------------------------------

mkdir -p "$(dirname "$out")"
cp "$res" "$(dirname "$out")/results.txt"
python3 scripts/bench-model-report.py "$res" "$out" "$quick" "$model" "$work/model-profile.json" "$work/model-final.json"
