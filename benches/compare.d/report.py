"""Averages the interleaved rounds and prints the table and the ratios
against the targets of the performance issue. CPU is split into user
(the proxy's own code) and sys (the kernel's TCP work on its behalf, which
is about the same for every proxy: same bytes, similar syscalls)."""
import os
import sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    kind, target, _reqs, *nums, rss, errors = line.rstrip("\n").split("\t")
    rps, p50, p99, cpu, user, system = map(float, nums)
    rows[(kind, target)].append((rps, p50, p99, cpu, user, system, int(rss), int(errors)))


def mean(xs):
    return sum(xs) / len(xs)


targets = ["direct", "nginx", "bare-pingora", "loopgate"]
TITLES = {
    "plain": "JSON",
    "stream": "SSE, 20 chunks",
    "plain-paced": f"JSON, paced: {os.environ.get('PACE_MS')} ms between requests per connection",
    "stream-paced": f"SSE, 20 chunks, paced: {os.environ.get('PACE_MS')} ms between requests per connection",
}
for kind in [k for k in TITLES if any(key[0] == k for key in rows)]:
    print(f"\n== {kind} ({TITLES[kind]}) ==")
    print(f"{'target':<14}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU s/10k':>11}"
          f"{'user':>8}{'sys':>8}{'peak RSS MB':>13}{'errors':>8}")
    agg = {}
    for t in targets:
        r = rows.get((kind, t))
        if not r:
            continue
        a = [mean([x[i] for x in r]) for i in range(6)]
        a += [max(x[6] for x in r) / 1024, sum(x[7] for x in r)]
        agg[t] = a
        cpu = ("-", "-", "-") if t == "direct" else tuple(f"{v:.3f}" for v in a[3:6])
        print(f"{t:<14}{a[0]:>9.0f}{a[1]:>9.3f}{a[2]:>9.3f}{cpu[0]:>11}{cpu[1]:>8}{cpu[2]:>8}"
              f"{a[6]:>13.1f}{a[7]:>8}")
    if all(t in agg for t in targets):
        lg, ng, bp, d = agg["loopgate"], agg["nginx"], agg["bare-pingora"], agg["direct"]
        added_lg, added_ng = lg[2] - d[2], ng[2] - d[2]
        print(f"CPU/request  loopgate / nginx        = {lg[3] / ng[3]:.2f}x   (target <= 1.00x)")
        print(f"CPU/request  loopgate / bare Pingora = {lg[3] / bp[3]:.2f}x   (target <= 1.15x)")
        print(f"CPU/request  bare Pingora / nginx    = {bp[3] / ng[3]:.2f}x   (the framework's floor; "
              f"user {bp[4] / ng[4]:.2f}x, sys {bp[5] / ng[5]:.2f}x)")
        if added_ng > 0:
            print(f"added p99    loopgate / nginx        = {added_lg / added_ng:.2f}x   (target <= 1.20x; "
                  f"+{added_lg:.3f} ms vs +{added_ng:.3f} ms over direct)")
        else:
            print(f"added p99    loopgate +{added_lg:.3f} ms, nginx +{added_ng:.3f} ms over direct")
