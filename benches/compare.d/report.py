"""Averages the interleaved rounds and prints the table and the ratios
against the targets of the performance issue."""
import sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    kind, target, reqs, rps, p50, p99, cpu, rss, errors = line.rstrip("\n").split("\t")
    rows[(kind, target)].append((float(rps), float(p50), float(p99), float(cpu), int(rss), int(errors)))


def mean(xs):
    return sum(xs) / len(xs)


targets = ["direct", "nginx", "bare-pingora", "loopgate"]
for kind in ["plain", "stream"]:
    print(f"\n== {kind} ({'SSE, 20 chunks' if kind == 'stream' else 'JSON'}) ==")
    print(f"{'target':<14}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU s/10k':>12}{'peak RSS MB':>13}{'errors':>8}")
    agg = {}
    for t in targets:
        r = rows.get((kind, t))
        if not r:
            continue
        a = (mean([x[0] for x in r]), mean([x[1] for x in r]), mean([x[2] for x in r]),
             mean([x[3] for x in r]), max(x[4] for x in r) / 1024, sum(x[5] for x in r))
        agg[t] = a
        cpu = "-" if t == "direct" else f"{a[3]:.3f}"
        print(f"{t:<14}{a[0]:>10.0f}{a[1]:>10.3f}{a[2]:>10.3f}{cpu:>12}{a[4]:>13.1f}{a[5]:>8}")
    if all(t in agg for t in targets):
        lg, ng, bp, d = agg["loopgate"], agg["nginx"], agg["bare-pingora"], agg["direct"]
        added_lg, added_ng = lg[2] - d[2], ng[2] - d[2]
        print(f"CPU/request  loopgate / nginx        = {lg[3] / ng[3]:.2f}x   (target <= 1.00x)")
        print(f"CPU/request  loopgate / bare Pingora = {lg[3] / bp[3]:.2f}x   (target <= 1.15x)")
        if added_ng > 0:
            print(f"added p99    loopgate / nginx        = {added_lg / added_ng:.2f}x   (target <= 1.20x; "
                  f"+{added_lg:.3f} ms vs +{added_ng:.3f} ms over direct)")
        else:
            print(f"added p99    loopgate +{added_lg:.3f} ms, nginx +{added_ng:.3f} ms over direct")
