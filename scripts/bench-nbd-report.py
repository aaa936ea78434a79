#!/usr/bin/env python3
"""The NBD step's report (scripts/bench.sh): `blobdrive serve` through fio's
nbd engine against the same fio through a loop device on the drive's FUSE
file, in alternating pairs of rounds.

Each figure is judged on its pairs: the mean of the per-pair ratios (NBD /
loop on FUSE) with its standard error, and the verdict of
scripts/bench_stats.py (met, MISSED or unsettled), as for bench.sh's other
pooled rows.

Usage: bench-nbd-report.py RESULTS JSON_OUT, RESULTS being bench.sh's
"key value" lines (nbd_seq_write_mibps_1, fuse_seq_write_mibps_1, ...).
"""

import json
import sys

from bench_stats import at_least, at_most, json_se, load, mean_se, met, num, pm, pooled_verdict, print_table, rounds

r = load(sys.argv[1])
pairs_n = rounds(r, "nbd_seq_write_mibps_")

# figure, key, unit, target (None: shown, not judged)
FIGURES = [
    ("NBD seq write 1M + fsync (vs loop on FUSE)", "seq_write_mibps", "MiB/s", at_least(0.95)),
    ("NBD cold seq read 1M (vs loop on FUSE)", "seq_read_mibps", "MiB/s", at_least(0.95)),
    ("NBD rand 4k read, qd32 (vs loop on FUSE)", "rand_read_iops", "IOPS", at_least(0.95)),
    ("NBD rand 4k write, qd32 (vs loop on FUSE)", "rand_write_iops", "IOPS", at_least(0.95)),
    ("NBD server CPU, seq write (vs FUSE daemon)", "cpu_seq_write", "s/GiB", at_most(1.0)),
    ("NBD server CPU, cold seq read (vs FUSE daemon)", "cpu_seq_read", "s/GiB", at_most(1.0)),
    # Everything on the host (fio, kernel, server, Azurite): what the FUSE
    # and loop copies cost shows here, not in the daemon's own figure.
    ("NBD host CPU, seq write (vs loop on FUSE)", "host_cpu_seq_write", "s/GiB", None),
    ("NBD host CPU, cold seq read (vs loop on FUSE)", "host_cpu_seq_read", "s/GiB", None),
]

rows, table = [], []
for name, key, unit, target in FIGURES:
    nbd = [r[f"nbd_{key}_{i}"] for i in range(1, pairs_n + 1)]
    fuse = [r[f"fuse_{key}_{i}"] for i in range(1, pairs_n + 1)]
    ratios = [a / b for a, b in zip(nbd, fuse) if b]
    n = len(ratios)
    if n == 0:
        continue
    m, se = mean_se(ratios)
    verdict = pooled_verdict(m, se, len(ratios), target)
    target_text = str(target) if target else "(all processes)"
    mean = lambda v: sum(v) / len(v)
    rows.append({"figure": name, "unit": unit, "nbd_mean": round(mean(nbd), 2),
                 "fuse_mean": round(mean(fuse), 2), "ratio": round(m, 3),
                 "standard_error": json_se(se), "pairs": n, "target": target_text,
                 "met": met(verdict)})
    table.append((f"{name} ({n} pairs)", f"{num(mean(nbd))} {unit}", num(mean(fuse)),
                  pm(m, se), target_text, verdict))

print_table(("figure", "NBD (mean)", "loop on FUSE", "ratio", "target", ""), table)
print()
for key in ("seq_write_mibps", "seq_read_mibps", "rand_read_iops", "rand_write_iops"):
    print(f"{key}, pair by pair (NBD / loop on FUSE): " + ", ".join(
        f"{r[f'nbd_{key}_{i}']:g} / {r[f'fuse_{key}_{i}']:g}" for i in range(1, pairs_n + 1)))
print(f"region {r.get('nbd_mib', 0):g} MiB; load average (1 min) at the start "
      f"{r.get('nbd_load_avg_start', 0):g}, at the end {r.get('nbd_load_avg', 0):g}")
json.dump({"pairs": pairs_n, "rows": rows,
           "raw": {k: v for k, v in r.items() if k.startswith(("nbd_", "fuse_"))}},
          open(sys.argv[2], "w"), indent=2)
print(f"JSON: {sys.argv[2]}")
