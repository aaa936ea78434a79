#!/usr/bin/env python3
"""The NBD step's report (scripts/bench.sh): `blobdrive serve` through fio's
nbd engine against the same fio through a loop device on the drive's FUSE
file, in alternating pairs of rounds.

Each figure is judged on its pairs: the mean of the per-pair ratios (NBD /
loop on FUSE) with its standard error. Met only when mean +- 2 standard
errors is inside the target, missed only when it is wholly outside;
otherwise the run cannot tell ("unsettled": more rounds, not more tuning),
as for the write log's rows in bench.sh.

Usage: bench-nbd-report.py RESULTS JSON_OUT, RESULTS being bench.sh's
"key value" lines (nbd_seq_write_mibps_1, fuse_seq_write_mibps_1, ...).
"""

import json
import sys

r = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    r[k] = float(v)
pairs_n = sum(1 for k in r if k.startswith("nbd_seq_write_mibps_"))

# figure, key, unit, target, the test on a ratio
FIGURES = [
    ("NBD seq write 1M + fsync (vs loop on FUSE)", "seq_write_mibps", "MiB/s", ">= 0.95", lambda x: x >= 0.95),
    ("NBD cold seq read 1M (vs loop on FUSE)", "seq_read_mibps", "MiB/s", ">= 0.95", lambda x: x >= 0.95),
    ("NBD rand 4k read, qd32 (vs loop on FUSE)", "rand_read_iops", "IOPS", ">= 0.95", lambda x: x >= 0.95),
    ("NBD rand 4k write, qd32 (vs loop on FUSE)", "rand_write_iops", "IOPS", ">= 0.95", lambda x: x >= 0.95),
    ("NBD server CPU, seq write (vs FUSE daemon)", "cpu_seq_write", "s/GiB", "<= 1.0", lambda x: x <= 1.0),
    ("NBD server CPU, cold seq read (vs FUSE daemon)", "cpu_seq_read", "s/GiB", "<= 1.0", lambda x: x <= 1.0),
    # Everything on the host (fio, kernel, server, Azurite): what the FUSE
    # and loop copies cost shows here, not in the daemon's own figure.
    ("NBD host CPU, seq write (vs loop on FUSE)", "host_cpu_seq_write", "s/GiB", "(all processes)", None),
    ("NBD host CPU, cold seq read (vs loop on FUSE)", "host_cpu_seq_read", "s/GiB", "(all processes)", None),
]

rows, table = [], []
for name, key, unit, target, ok in FIGURES:
    nbd = [r[f"nbd_{key}_{i}"] for i in range(1, pairs_n + 1)]
    fuse = [r[f"fuse_{key}_{i}"] for i in range(1, pairs_n + 1)]
    ratios = [a / b for a, b in zip(nbd, fuse) if b]
    n = len(ratios)
    if n == 0:
        continue
    m = sum(ratios) / n
    se = (sum((x - m) ** 2 for x in ratios) / (n - 1) / n) ** 0.5 if n > 1 else float("inf")
    if ok is None:
        verdict = "-"
    else:
        lo, hi = ok(m - 2 * se), ok(m + 2 * se)
        verdict = "met" if lo and hi else ("MISSED" if not lo and not hi else "unsettled")
    mean = lambda v: sum(v) / len(v)
    rows.append({"figure": name, "unit": unit, "nbd_mean": round(mean(nbd), 2),
                 "fuse_mean": round(mean(fuse), 2), "ratio": round(m, 3),
                 "standard_error": round(se, 3), "pairs": n, "target": target,
                 "met": {"met": True, "MISSED": False}.get(verdict)})
    table.append((f"{name} ({n} pairs)", f"{mean(nbd):.4g} {unit}", f"{mean(fuse):.4g}",
                  f"{m:.3f} +- {se:.3f}", target, verdict))

head = ("figure", "NBD (mean)", "loop on FUSE", "ratio", "target", "")
widths = [max(len(str(x[i])) for x in table + [head]) for i in range(len(head))]
for line in [head] + table:
    print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())
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
