#!/usr/bin/env python3
"""The service model's report (scripts/bench-model.sh, `scripts/bench.sh
--model standard|p10|p30`): each workload against the model's limit and a
raw pass through the model in the same run, and against the lower of the
two ("vs lower", naming the bound it used: "model" or "raw").

Judging (scripts/bench_stats.py): the cold sequential read, measured in
alternating pairs with its raw pass, is judged on the pairs: the mean of the
per-pair ratios of the read to the lower of the model's byte cap and that
pair's raw pass, +- its standard error (met / MISSED / unsettled), in a
--quick run as in a full one. Every other row is one measurement: met or
MISSED in a full run, not judged in a --quick run (its size settles none of
them), and so the share of requests answered 503.

Usage: bench-model-report.py RESULTS JSON_OUT QUICK(0|1) MODEL PROFILE_JSON FINAL_STATS_JSON
"""

import json
import sys

from bench_stats import at_least, json_se, load, mean_se, met, pm, pooled_verdict, print_table, rounds, single_verdict

r = load(sys.argv[1])
quick, model = sys.argv[3] == "1", sys.argv[4]
profile = json.load(open(sys.argv[5]))
final = json.load(open(sys.argv[6]))

def sums(prefix):
    """requests and 503s of every step whose key starts with prefix"""
    req = sum(v for k, v in r.items() if k.startswith(prefix) and k.endswith("_requests"))
    busy = sum(v for k, v in r.items() if k.startswith(prefix) and k.endswith("_busy"))
    return req, busy

def share(prefix):
    req, busy = sums(prefix)
    return round(busy / req, 4) if req else None

def ratio(a, b):
    return round(a / b, 3) if b else None


def mean_of(prefix, what):
    """the request-weighted mean of KEY_what over the steps under prefix"""
    steps = [k[:-len("_requests")] for k in r if k.startswith(prefix) and k.endswith("_requests")]
    n = sum(r[s + "_requests"] for s in steps if s + "_" + what in r)
    if not n:
        return None
    return round(sum(r[s + "_" + what] * r[s + "_requests"] for s in steps if s + "_" + what in r) / n, 1)

def mean_wait_ms(prefix):
    """the mean wait for a cap of the requests of the steps under prefix"""
    req = sum(v for k, v in r.items() if k.startswith(prefix) and k.endswith("_requests"))
    wait = sum(v for k, v in r.items() if k.startswith(prefix) and k.endswith("_queue_wait_s"))
    return round(wait / req * 1000, 1) if req else None

cap_mib, cap_rps, rtt = r["model_cap_mibps"], r["model_cap_rps"], r["model_rtt_ms"]
n_reads = rounds(r, "model_seq_read_mibps_")
rows = [
    # figure, value, unit, model limit, raw pass (same model, same run), raw's description, 503 key prefix
    ("seq write 1 file + fsync (ext4)", r["model_seq_write_mibps"], "MiB/s", cap_mib,
     r["model_put_pass_mibps"], "raw 4 MiB Puts", "model_seq_write"),
    (f"cold seq read (ext4), {n_reads} pairs", r["model_seq_read_mibps"], "MiB/s", cap_mib,
     r["model_get_pass_mibps"], "raw 4 MiB Gets, alternating", "model_seq_read_"),
    ("cold rand 4k read, qd32", r["model_rand_read_iops"], "IOPS", cap_rps,
     r["model_raw_get_4k_iops"], "raw 4 KiB Gets, p32", "model_rand_read"),
    ("4k O_DIRECT write + fsync, qd1", r["model_fsync_iops"], "IOPS", 1000.0 / rtt,
     r["model_raw_put_4k_p1_iops"], "raw 4 KiB Puts, p1", "model_fsync"),
    ("4k overwrite + fdatasync (ext4), qd1", r["model_fdatasync_iops"], "IOPS", 1000.0 / rtt,
     r["model_raw_put_4k_p1_iops"], "raw 4 KiB Puts, p1", "model_fdatasync"),
    ("drain: fsync after the burst", r["model_drain_put_per_s"], "Put Page/s", cap_rps,
     r["model_raw_put_4k_p8_iops"], "raw 4 KiB Puts, p8", "model_drain"),
]
# Issue 30's targets, by profile and row: (least ratio, against what):
# "lower" is the lower of the model's limit and the raw pass, "limit" the
# model's limit. The write + fsync loop's limit is one request per round
# trip, which the model adds on top of Azurite's own time per request, so
# the raw client's 4 KiB Put at one in flight stays below it (about 0.75 of
# it here): like every row, it is judged against the lower of the two.
targets = {
    "standard": {"model_seq_write": (0.9, "lower"), "model_seq_read_": (0.9, "lower"),
                 "model_rand_read": (0.9, "lower"), "model_fsync": (0.8, "lower"),
                 "model_drain": (0.9, "lower")},
    "p30": {"model_seq_read_": (0.9, "lower"), "model_rand_read": (0.8, "lower")},
}.get(model, {})
raws = [
    ("raw 4 MiB Put Pages", r["model_put_pass_mibps"], "MiB/s", cap_mib, "model_put_pass"),
    ("raw 4 MiB Gets", r["model_get_pass_mibps"], "MiB/s", cap_mib, "model_get_pass_"),
    ("raw 4 KiB Gets, p32", r["model_raw_get_4k_iops"], "IOPS", cap_rps, "model_raw_get_4k"),
    ("raw 4 KiB Puts, p1", r["model_raw_put_4k_p1_iops"], "IOPS", 1000.0 / rtt, "model_raw_put_4k_p1"),
    ("raw 4 KiB Puts, p8", r["model_raw_put_4k_p8_iops"], "IOPS", cap_rps, "model_raw_put_4k_p8"),
]
table, out_rows = [], []
for name, v, unit, limit, raw, raw_what, key in rows:
    q_limit, q_raw = ratio(v, limit), ratio(v, raw)
    bound = "raw" if raw < limit else "model"
    out_rows.append({"figure": name, "value": v, "unit": unit, "model_limit": limit,
                     "ratio_to_limit": q_limit, "raw": raw, "raw_what": raw_what,
                     "ratio_to_raw": q_raw, "bound": bound, "busy_share": share(key),
                     "mean_wait_ms": mean_wait_ms(key), "upstream_ms": mean_of(key, "upstream_ms"),
                     "in_flight": mean_of(key, "in_flight"), "mean_kib": mean_of(key, "mean_kib")})
    target, verdict = None, "-"
    vs_lower = f"{ratio(v, min(limit, raw))} ({bound})"
    if key in targets:
        least, basis = targets[key]
        target = at_least(least, f"of {basis}")
    if key == "model_seq_read_":
        # Pooled pairs: each read against the lower of the cap and its own pair's pass.
        reads = [r[f"model_seq_read_mibps_{i}"] for i in range(1, n_reads + 1)]
        passes = [r[f"model_get_pass_mibps_{i}"] for i in range(1, n_reads + 1)]
        bounds = {"raw" if p < limit else "model" for p in passes}
        bound = bounds.pop() if len(bounds) == 1 else "raw or model"
        basis = targets[key][1] if key in targets else "lower"
        per_pair = [x / (min(limit, p) if basis == "lower" else limit) for x, p in zip(reads, passes)]
        m, se = mean_se(per_pair)
        verdict = pooled_verdict(m, se, len(per_pair), target)
        vs_lower = f"{pm(m, se)} ({bound})"
        out_rows[-1].update({"bound": bound, "ratio_to_lower": round(m, 3), "standard_error": json_se(se),
                             "pairs": n_reads})
    elif target is not None:
        got = ratio(v, min(limit, raw)) if targets[key][1] == "lower" else q_limit
        verdict = single_verdict(got, target, quick)
    target_text = str(target) if target else "-"
    out_rows[-1].update({"target": target_text, "met": met(verdict)})
    table.append((name, f"{v:g} {unit}", f"{limit:.4g}", f"{q_limit}", f"{raw:g}", f"{q_raw}",
                  vs_lower, f"{share(key)}", f"{mean_wait_ms(key)}",
                  f"{mean_of(key, 'upstream_ms')}", f"{mean_of(key, 'in_flight')}", f"{mean_of(key, 'mean_kib')}",
                  target_text, verdict))
head = ("figure", "blobdrive", "model limit", "ratio", "raw pass", "ratio", "vs lower", "503 share", "wait ms",
        "azurite ms", "in flight", "KiB/req", "target", "")
print(f"service model '{model}': RTT {rtt:g} ms ± {profile['jitter_ms']:g}, per blob {cap_mib:.4g} MiB/s "
      f"and {cap_rps:g} requests/s, burst {profile['burst_ms']:g} ms, queue bound {profile['queue_bound_ms']:g} ms, "
      f"each connection its own link at {profile['link_bytes_per_s'] / 2**20:.4g} MiB/s")
print_table(head, table)
print()
print("raw passes through the model (vs its limit; 503 share; mean wait for a cap, ms; Azurite's ms per request; in flight): "
      + "; ".join(f"{n} {v:g} {u} ({ratio(v, l)}; {share(k)}; {mean_wait_ms(k)}; {mean_of(k, 'upstream_ms')}; {mean_of(k, 'in_flight')})"
                  for n, v, u, l, k in raws))
print("cold reads pair by pair (MiB/s, read / raw pass; the pass first in odd pairs): " + ", ".join(
    f"{r[f'model_seq_read_mibps_{i}']:g} / {r[f'model_get_pass_mibps_{i}']:g}" for i in range(1, n_reads + 1)))
errors = {k: v for k, v in r.items() if k.endswith("_fio_error") and v}
if errors:
    print("fio failed (errno): " + ", ".join(f"{k[len('model_'):-len('_fio_error')]} {v:g}" for k, v in errors.items()))
req, busy = final["requests"], final["busy"]
if quick and targets:
    print("--quick: the cold read is judged on its pairs (unsettled while the 95% interval (mean +- t s.e.) straddles the target); "
          "the other rows are shown, not judged (one short run settles none of them)")
print(f"the whole run through the model: {req} requests, {busy} answered 503 ({busy / req if req else 0:.4f}), "
      f"{final['queued']} waited for a cap (longest {final['max_queue_wait_s']:.3f} s), "
      f"{final['refused_connections']} connections refused, {final['upstream_errors']} upstream errors"
      + ("" if model != "standard" else
         f"; target under 1% answered 503: {'not judged (--quick)' if quick else ('met' if busy < 0.01 * req else 'MISSED')}"))
json.dump({"quick": quick, "model": model, "profile": profile, "raw": r, "rows": out_rows,
           "model_stats": final}, open(sys.argv[2], "w"), indent=2)
print(f"JSON: {sys.argv[2]}")
