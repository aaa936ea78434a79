"""How the benchmark reports judge a figure: the one place that computes a
pooled figure's mean and standard error and turns a figure into a verdict,
for scripts/bench-report.py, scripts/bench-nbd-report.py and
scripts/bench-model-report.py.

Pooled pairs: a cost whose run-to-run spread is as large as its gap to the
target is measured as alternating pairs (A then B, B then A, ...) so the
machine's drift hits both sides, and judged on the pairs' ratios: their mean
with its standard error (the sample deviation over the square root of the
count). Met only when the mean's 95% interval (mean +- t standard errors,
t from Student's distribution for the pairs' count: 4.3 for 3 pairs, 2.26
for 10, near 2 for many) is inside the target, MISSED only when it is wholly
outside; otherwise the run cannot tell ("unsettled": more pairs, not more
tuning). With a fixed 2 instead of t, a figure right on its target would
read MISSED in about one 2-pair run of six. One pair has no spread:
unsettled.

Single figures (one measurement) are met or MISSED, except in a --quick run
where the row's workload is smaller or shorter than the full run's: then
they are shown and not judged (a short run must never print MISSED only
because it is short).
"""

import math

NOT_JUDGED_QUICK = "not judged (quick)"


class Target:
    """A bound on a figure: Target(">=", 0.9) or Target("<=", 1.25)."""

    def __init__(self, op, bound, against=""):
        assert op in (">=", "<=", "<", "==")
        self.op, self.bound, self.against = op, bound, against

    def ok(self, x):
        if self.op == ">=":
            return x >= self.bound
        if self.op == "<=":
            return x <= self.bound
        if self.op == "<":
            return x < self.bound
        return x == self.bound

    def __str__(self):
        text = f"{self.op} {self.bound:g}"
        return f"{text} {self.against}" if self.against else text


def at_least(bound, against=""):
    return Target(">=", bound, against)


def at_most(bound, against=""):
    return Target("<=", bound, against)


def load(path):
    """bench.sh's results: "key value" lines, as a dict of floats."""
    r = {}
    for line in open(path):
        if line.strip():
            k, v = line.split()
            r[k] = float(v)
    return r


def rounds(r, prefix):
    """How many KEY_1, KEY_2, ... the results hold for prefix KEY_."""
    n = 0
    while f"{prefix}{n + 1}" in r:
        n += 1
    return n


def ratio(a, b):
    return round(a / b, 3) if b else None


def mean_se(values):
    """(mean, standard error) of values; the error is inf with fewer than 2."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, math.inf
    return m, (sum((x - m) ** 2 for x in values) / (n - 1) / n) ** 0.5


# Student's t, two-sided 95%, by degrees of freedom (pairs - 1); 1.96 beyond.
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(n):
    """The t factor of a 95% interval for the mean of n values."""
    df = n - 1
    if df < 1:
        return math.inf
    known = [d for d in T95 if d <= df]
    return T95[max(known)] if df <= 30 else 1.96


def pooled_verdict(mean, se, n, target):
    """met, MISSED or unsettled for the mean of n pooled values; "-" with no target."""
    if target is None:
        return "-"
    k = t95(n) * se
    lo, hi = target.ok(mean - k), target.ok(mean + k)
    if lo and hi:
        return "met"
    if not lo and not hi:
        return "MISSED"
    return "unsettled"


def single_verdict(value, target, quick=False, same_in_quick=False):
    """met or MISSED for one measurement; not judged in a --quick run unless
    the row's workload is the same there as in the full run."""
    if target is None or value is None:
        return "-"
    if quick and not same_in_quick:
        return NOT_JUDGED_QUICK
    return "met" if target.ok(value) else "MISSED"


def met(verdict):
    """The verdict as JSON's "met": true, false, or null (unsettled, not judged)."""
    return {"met": True, "MISSED": False}.get(verdict)


def pm(mean, se, digits=3):
    """mean +- se as text."""
    return f"{mean:.{digits}f} +- {se:.{digits}f}" if math.isfinite(se) else f"{mean:.{digits}f} +- ?"


def num(v):
    """A figure as text: four significant digits, no exponent."""
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def json_se(se):
    return round(se, 3) if math.isfinite(se) else None


def print_table(head, table):
    widths = [max(len(str(x[i])) for x in table + [head]) for i in range(len(head))]
    for line in [head] + table:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())
