#!/usr/bin/env python3
"""The default run's report (scripts/bench.sh): the table of every figure
against its ceiling and target, the figures behind it, and the JSON.

Rows are of three kinds, each judged by scripts/bench_stats.py:
- pooled pairs (the cold sequential read against its raw pass, the disk tier
  on/off, encrypted/plain, the `cat` reader against `dd bs=1M`, the write
  log on/off, and the daemon's CPU over those reads): the mean of the
  per-pair ratios (or of the per-round figures) +- its standard error,
  met / MISSED / unsettled, in a --quick run as in a full one;
- single measurements against a ceiling measured in the same run: met or
  MISSED in a full run, "not judged (quick)" in a --quick run, whose sizes
  and seconds are smaller;
- absolute single figures: judged in a --quick run only when their workload
  is the same there as in the full run (mount times, the 32 MiB burst, the
  512-byte burst's RSS, mkfs's stored bytes, the kills' stalls and errors,
  the Gets of a read from the tier).

A row whose figures are not in the results (BENCH_ONLY runs one part) is
left out.

Usage: bench-report.py CEILING_JSON RESULTS JSON_OUT QUICK(0|1)
"""

import json
import sys

from bench_stats import (
    NOT_JUDGED_QUICK, at_least, at_most, json_se, load, mean_se, met, num, pm,
    pooled_verdict, print_table, ratio, rounds, single_verdict, Target,
)

ceiling = json.load(open(sys.argv[1]))
r = load(sys.argv[2])
quick = sys.argv[4] == "1"
put, get, small = ceiling["put_4m"], ceiling["get_4m"], ceiling["get_4k"]
# Raw 4 KiB Put Pages at the flush's concurrency (8 requests in flight).
put_small = ceiling["put_4k"]["by_parallelism"]["8"]


def opt(f):
    """f(), or None when a figure it needs is not in the results."""
    try:
        return f()
    except KeyError:
        return None


def series(key):
    """KEY_1 .. KEY_n from the results."""
    return [r[f"{key}_{i}"] for i in range(1, rounds(r, f"{key}_") + 1)]


def pair_ratios(a, b):
    """Per-pair ratios A_i / B_i of two series of the same length."""
    xs, ys = series(a), series(b)
    if not xs or len(xs) != len(ys):
        raise KeyError(a)
    return [x / y for x, y in zip(xs, ys) if y]


def mean(v):
    return sum(v) / len(v) if v else None


n_pairs = rounds(r, "seq_read_mibps_")
pinned = r.get("read_pinned") == 1
where = "Azurite on a core of its own" if pinned else "Azurite sharing the cores"

# Single measurements against a ceiling: figure, value, unit, ceiling,
# target (None: shown only), what the ceiling is.
singles = [
    lambda: ("seq write 1 file + fsync (ext4)", r["seq_write_mibps"], "MiB/s", r["seq_write_pass_mibps"],
             at_least(0.85, "(vs raw Puts just before)")),
    lambda: ("seq write 1 file + fsync (ext4)", r["seq_write_mibps"], "MiB/s", put["best"],
             "(vs the fresh scratch blob's best)"),
    # Bytes over the pairs' summed time, against the ceiling measured on a
    # fresh Azurite sharing the cores at the start: information only.
    lambda: (f"cold seq read (ext4), {n_pairs} reads", len(series("seq_read_mibps")) / sum(1 / x for x in series("seq_read_mibps")),
             "MiB/s", get["best"], "(vs the fresh scratch blob's best)"),
    lambda: ("upload dense raw image", r["upload_mibps"], "MiB/s", r["upload_pass_mibps"],
             at_least(0.85, "(vs raw Puts just before)")),
    lambda: ("upload dense raw image", r["upload_mibps"], "MiB/s", put["best"], "(vs the fresh scratch blob's best)"),
    lambda: ("cold rand 4k read, qd32", r["rand_read_iops"], "IOPS", small["at_32"], at_least(0.8)),
    lambda: ("rand 4k write, qd32", r["rand_write_iops"], "IOPS", r["tmpfs_write_iops"], "(vs tmpfs)"),
    lambda: ("drain: fsync after the burst", r["drain_put_per_s"], "Put Page/s", put_small,
             at_least(0.8, "(vs raw 4k Put Page, p8)")),
    lambda: ("sustained rand 4k write past budget", r["sustained_write_iops"], "IOPS", put_small,
             at_least(0.9, "(vs raw 4k Put Page, p8)")),
    lambda: ("warm rand 4k re-read, qd32", r["warm_read_iops"], "IOPS", r["tmpfs_read_iops"], at_least(0.25, "(vs tmpfs)")),
    lambda: ("seq read after remount from tier", r["tier_warm_mibps"], "MiB/s", r["local_read_mibps"],
             at_least(0.5, "(vs local file)")),
    lambda: ("seq write + fsync, write log on", r["log_on_write_mibps"], "MiB/s", r["log_on_pass_mibps"], "(vs raw Puts just before)"),
    lambda: ("seq write + fsync, write log off", r["log_off_write_mibps"], "MiB/s", r["log_off_pass_mibps"], "(vs raw Puts just before)"),
]


def log_pairs(key):
    n = rounds(r, "log_on_write_mibps_")
    if not n:
        raise KeyError("log_on_write_mibps_1")
    return [key(m="on", i=i) / key(m="off", i=i) for i in range(1, n + 1)]


def time_per_gib(key):
    """Seconds per GiB of each round of KEY_mibps_N."""
    return [1024 / x for x in series(f"{key}_mibps")]


# Pooled pairs: figure, per-pair ratios, the two sides' means (shown in the
# blobdrive and ceiling columns), unit, target.
pooled = [
    lambda: (f"cold seq read (ext4), {where}", pair_ratios("seq_read_mibps", "seq_read_pass_mibps"),
             mean(series("seq_read_mibps")), mean(series("seq_read_pass_mibps")), "MiB/s",
             at_least(0.9, "(vs raw Gets of its blob, alternating)")),
    lambda: ("cold seq read, tier on (vs off)", pair_ratios("tier_on_mibps", "tier_off_mibps"),
             mean(series("tier_on_mibps")), mean(series("tier_off_mibps")), "MiB/s", at_least(0.95)),
    lambda: ("encrypted seq write + fsync (vs plain)", pair_ratios("crypt_write_mibps", "plain_write_mibps"),
             mean(series("crypt_write_mibps")), mean(series("plain_write_mibps")), "MiB/s", at_least(0.95)),
    lambda: ("encrypted cold seq read (vs plain)", pair_ratios("crypt_read_mibps", "plain_read_mibps"),
             mean(series("crypt_read_mibps")), mean(series("plain_read_mibps")), "MiB/s", at_least(0.95)),
    # Time: the dd reader's rate over the cat reader's is cat's time over dd's.
    lambda: ("cold read with cat (vs dd bs=1M): time", pair_ratios("reader_dd_mibps", "reader_cat_mibps"),
             mean(time_per_gib("reader_cat")), mean(time_per_gib("reader_dd")), "s/GiB", at_most(1.25)),
    lambda: ("cold read with cat (vs dd bs=1M): daemon CPU", pair_ratios("daemon_cpu_reader_cat", "daemon_cpu_reader_dd"),
             mean(series("daemon_cpu_reader_cat")), mean(series("daemon_cpu_reader_dd")), "s/GiB", at_most(1.25)),
    lambda: ("write log cost: seq write ratio, on/off",
             log_pairs(lambda m, i: r[f"log_{m}_write_mibps_{i}"] / r[f"log_{m}_pass_mibps_{i}"]),
             r["log_on_write_mibps"], r["log_off_write_mibps"], "MiB/s", at_least(0.95)),
    lambda: ("write log cost: daemon CPU, on/off", log_pairs(lambda m, i: r[f"daemon_cpu_log_{m}_{i}"]),
             r["daemon_cpu_log_on"], r["daemon_cpu_log_off"], "s/GiB", at_most(1.05)),
]

# Absolute figures over rounds (mean +- standard error, judged as pooled):
# figure, per-round values, unit, target.
pooled_absolute = [
    lambda: (f"daemon CPU, cold seq read, {where}", series("daemon_cpu_seq_read"), "s/GiB", at_most(2.0)),
    lambda: ("daemon CPU, cold read with cat", series("daemon_cpu_reader_cat"), "s/GiB", at_most(1.5)),
    lambda: ("daemon CPU, cold read with dd bs=1M", series("daemon_cpu_reader_dd"), "s/GiB", at_most(1.5)),
]

n_kills = rounds(r, "stall_s_")
# Absolute single figures: figure, value, unit, target, same workload in
# --quick as in the full run (then judged there too).
absolute = [
    lambda: ("mount+open empty 8 TiB", r["mount_empty_8t_s"], "s", Target("<", 0.5), True),
    lambda: ("mount+open 8 TiB, 10k extents", r["mount_10k_extents_s"], "s", Target("<", 2), True),
    lambda: ("rand 4k write burst, 32 MiB, qd32", r["burst_iops"], "IOPS", at_least(20000), True),
    lambda: ("daemon CPU, seq write", r["daemon_cpu_seq_write"], "s/GiB", at_most(2.0), False),
    lambda: ("peak RSS, 512-byte burst, 128 MiB cache", r["tiny_peak_rss_mib"], "MiB", at_most(192), True),
    lambda: ("Put Page per GiB written", r["put_page_per_gib"], "requests", at_most(300), False),
    lambda: ("Gets of the read from the tier", r["tier_warm_gets"], "requests", Target("==", 0), True),
    lambda: ("disk tier size after the reads", r["tier_bytes"] / 2**20, "MiB", None, True),
    lambda: ("bytes up per GiB written", r["bytes_up_per_gib"] / 2**30, "GiB", None, True),
    lambda: ("stored after mkfs.ext4 1 TiB", r["mkfs_1t_stored_bytes"] / 2**20, "MiB",
             Target("<", 0.01 * 2**40 / 2**20, "(1% of it)"), True),
    lambda: ("peak RSS, 256 MiB cache, less the write log", r["rss_peak_mib"] - r.get("rss_log_mib", 0), "MiB",
             at_most(320), False),
    lambda: ("the write log's shared memory in that RSS", r["rss_log_mib"], "MiB", None, False),
    lambda: (f"I/O stall per kill -9, p50 of {n_kills}", r["stall_p50_s"], "s", Target("<", 2), True),
    lambda: (f"I/O stall per kill -9, max of {n_kills}", r["stall_max_s"], "s", Target("<", 2), True),
    lambda: (f"write errors under {n_kills} kills -9", r["stall_write_errors"], "errors", Target("==", 0), True),
]

table, out_rows = [], []
for row in filter(None, map(opt, singles)):
    name, v, unit, ceil, target = row
    q = ratio(v, ceil)
    judged = isinstance(target, Target)
    verdict = single_verdict(q, target if judged else None, quick)
    target_text = str(target)
    out_rows.append({"figure": name, "value": round(v, 3), "unit": unit, "ceiling": ceil,
                     "ratio": q, "target": target_text, "met": met(verdict)})
    table.append((name, f"{num(v)} {unit}", num(ceil), f"{q}", target_text, verdict))
for row in filter(None, map(opt, pooled)):
    name, pairs, a, b, unit, target = row
    m, se = mean_se(pairs)
    verdict = pooled_verdict(m, se, len(pairs), target)
    out_rows.append({"figure": name, "value": round(a, 3), "unit": unit, "ceiling": round(b, 3),
                     "ratio": round(m, 3), "standard_error": json_se(se), "pairs": len(pairs),
                     "target": str(target), "met": met(verdict)})
    table.append((f"{name} ({len(pairs)} pairs)", f"{num(a)} {unit}", num(b), pm(m, se), str(target), verdict))
for row in filter(None, map(opt, pooled_absolute)):
    name, values, unit, target = row
    if not values:
        continue
    m, se = mean_se(values)
    verdict = pooled_verdict(m, se, len(values), target)
    out_rows.append({"figure": name, "value": round(m, 3), "standard_error": json_se(se), "unit": unit,
                     "rounds": len(values), "target": str(target), "met": met(verdict)})
    table.append((f"{name} ({len(values)} reads)", f"{pm(m, se, 2)} {unit}", "", "", str(target), verdict))
for row in filter(None, map(opt, absolute)):
    name, v, unit, target, same = row
    verdict = single_verdict(v, target, quick, same)
    out_rows.append({"figure": name, "value": v, "unit": unit, "target": str(target) if target else "-",
                     "met": met(verdict)})
    table.append((name, f"{num(v)} {unit}" if unit != "requests" else f"{v:g}", "", "",
                   str(target) if target else "-", verdict))

print_table(("figure", "blobdrive", "ceiling", "ratio", "target", ""), table)
print()
if quick:
    print(f"--quick: pooled rows are judged on their pairs (unsettled while the 95% interval (mean +- t s.e.) straddles "
          f"the target); other rows of a shorter or smaller workload say '{NOT_JUDGED_QUICK}'")
print(f"ceiling: put_4m best {put['best']} MiB/s at p{put['best_parallelism']}, "
      f"get_4m best {get['best']} MiB/s at p{get['best_parallelism']}, "
      f"get_4k {small['at_32']} IOPS at p32 (best {small['best']} at p{small['best_parallelism']})")
# Azurite's share of the cores per step (the mean over a step's rounds).
shares = {}
for k, v in r.items():
    if k.startswith("azurite_cpu_"):
        step = k[len("azurite_cpu_"):]
        step = step.rsplit("_", 1)[0] if step.rsplit("_", 1)[-1].isdigit() else step
        shares.setdefault(step, []).append(v)
print("azurite CPU share (cores, mean over a step's rounds): "
      + ", ".join(f"{k} {mean(v):.2f}" for k, v in shares.items()))
if "drain_put_pages" in r:
    print(f"raw 4k Put Page: {put_small} at p8 (best {ceiling['put_4k']['best']} at p{ceiling['put_4k']['best_parallelism']}); "
          f"the burst's drain sent {r['drain_put_pages']:g} Put Pages; "
          f"512-byte burst {r['tiny_burst_iops']:g} IOPS")


def mean_of(prefix):
    v = [x for k, x in r.items() if k.startswith(prefix)]
    return round(mean(v), 2) if v else None


if "crypt_read_mibps_1" in r:
    print(f"daemon CPU s/GiB, plain vs encrypted: write {mean_of('daemon_cpu_plain_write_')} vs {mean_of('daemon_cpu_crypt_write_')}, "
          f"cold read {mean_of('daemon_cpu_plain_read_')} vs {mean_of('daemon_cpu_crypt_read_')}")
def fuse_summary(key):
    """FUSE read requests per GiB and their mean size over KEY's reads, from
    a build whose `blobdrive stats --json` counts them."""
    reqs, nbytes = series(f"fuse_read_requests_{key}"), series(f"fuse_read_bytes_{key}")
    if not reqs or not sum(reqs):
        return "FUSE read counters: not in this build's stats"
    return (f"FUSE reads per GiB {sum(reqs) / sum(nbytes) * 2**30:.0f}, "
            f"mean size {sum(nbytes) / sum(reqs) / 1024:.0f} KiB")


if n_pairs:
    print(f"cold seq reads, pair by pair ({where}; MiB/s, read / raw pass; the first of a pair alternates, "
          "the pass first in odd pairs): " + ", ".join(
              f"{r[f'seq_read_mibps_{i}']:g} / {r[f'seq_read_pass_mibps_{i}']:g}" for i in range(1, n_pairs + 1))
          + "; daemon CPU s/GiB: " + ", ".join(f"{x:g}" for x in series("daemon_cpu_seq_read"))
          + "; Azurite's helper threads (its garbage collector) s/GiB, pass / read: "
          + ", ".join(f"{r[f'azurite_helpers_seq_read_pass_{i}']:g} / {r[f'azurite_helpers_seq_read_{i}']:g}"
                      for i in range(1, n_pairs + 1))
          + "; " + fuse_summary("seq_read"))
if "tier_on_mibps_1" in r:
    print("disk tier, pair by pair (MiB/s, on / off; off first in odd pairs): " + ", ".join(
        f"{a:g} / {b:g}" for a, b in zip(series("tier_on_mibps"), series("tier_off_mibps")))
          + "; daemon CPU s/GiB on / off: " + ", ".join(
              f"{a:g} / {b:g}" for a, b in zip(series("daemon_cpu_tier_on"), series("daemon_cpu_tier_off")))
          + f"; tier on: {fuse_summary('tier_on')}; off: {fuse_summary('tier_off')}")
# FUSE read requests reaching the daemon (only with a build that counts
# them: `blobdrive stats --json` fuse_read_requests and fuse_read_bytes).
for reader, what in (("cat", "cat"), ("dd", "dd bs=1M")):
    if f"reader_{reader}_mibps_1" not in r:
        continue
    line = (f"cold read with {what}, pair by pair (s/GiB; daemon CPU s/GiB): "
            + ", ".join(f"{t:.2f} ({c:g})" for t, c in zip(time_per_gib(f"reader_{reader}"), series(f"daemon_cpu_reader_{reader}"))))
    line += "; " + fuse_summary(f"reader_{reader}")
    print(line)
if "loop_read_ahead_kb" in r:
    print(f"the attached drive's loop device: read_ahead_kb {r['loop_read_ahead_kb']:g}, "
          f"max_sectors_kb {r['loop_max_sectors_kb']:g}")
n_log = rounds(r, "log_on_write_mibps_")
if n_log:
    print(f"write log on vs off, {n_log} rounds each, one by one (MiB/s after the raw pass's; daemon CPU s/GiB, of it the holder's): "
          + "; ".join(f"{m} " + ", ".join(
              f"{r[f'log_{m}_write_mibps_{i}']:g} after {r[f'log_{m}_pass_mibps_{i}']:g} "
              f"({r[f'daemon_cpu_log_{m}_{i}']:g}, {r[f'holder_cpu_log_{m}_{i}']:g})" for i in range(1, n_log + 1))
              for m in ("on", "off")))
if n_kills:
    print(f"kill -9 under 4 KiB writes (qd1, {r['stall_write_iops']:g} IOPS): {r['takeover_kills']:g} takeovers; "
          "stall per kill (s): " + ", ".join(f"{r[f'stall_s_{i}']:g}" for i in range(1, n_kills + 1))
          + f"; kill to the new pid in stats p50 {r['takeover_p50_s']:g} s; longest gap away from the kills {r['stall_baseline_max_s']:g} s")
if "mkfs_1t_s" in r:
    print(f"GETs: cold seq read {r['seq_read_gets_1']:g}, cold rand read {r['rand_read_gets']:g}; "
          f"tmpfs O_DIRECT: {'yes' if r['tmpfs_direct'] else 'no'}; mkfs 1 TiB took {r['mkfs_1t_s']} s")
json.dump({"quick": quick, "ceiling": ceiling, "raw": r, "rows": out_rows},
          open(sys.argv[3], "w"), indent=2)
print(f"JSON: {sys.argv[3]}")
