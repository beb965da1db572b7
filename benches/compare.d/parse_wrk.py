"""Reads wrk --latency output on stdin; prints one TSV row:
kind, target, requests, rps, p50_ms, p99_ms, cpu_s_per_10k, user_s_per_10k,
sys_s_per_10k, peak_rss_kb, errors. CPU is the proxy process's utime and
stime over the run (clock ticks), per 10,000 completed requests."""
import re
import sys

kind, target = sys.argv[1], sys.argv[2]
user, system, rss, hz = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
text = sys.stdin.read()


def ms(v):
    m = re.match(r"([\d.]+)(us|ms|s|m)", v)
    n, u = float(m.group(1)), m.group(2)
    return n / 1000 if u == "us" else n if u == "ms" else n * 1000 if u == "s" else n * 60000


reqs = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p50 = ms(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1))
p99 = ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
errors = 0
m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors += int(m.group(1)) if m else 0
m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
errors += sum(int(x) for x in m.groups()) if m else 0


def per_10k(ticks):
    return ticks / hz / reqs * 10000 if reqs else 0.0


print(f"{kind}\t{target}\t{reqs}\t{rps:.0f}\t{p50:.3f}\t{p99:.3f}\t{per_10k(user + system):.3f}"
      f"\t{per_10k(user):.3f}\t{per_10k(system):.3f}\t{rss}\t{errors}")
