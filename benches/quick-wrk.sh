#!/usr/bin/env bash
# Quick wrk comparison on loopback: the mock provider directly vs through
# Loopgate (conf/demo.yaml), with the same request body, interleaved A B A B.
# Usage: benches/quick-wrk.sh [seconds-per-run] [connections]
# Needs wrk (apt-get install wrk); builds the release binary if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
conns=${2:-32}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install -y wrk)" >&2; exit 1; }
cargo build --release --bin loopgate >/dev/null
bin=target/release/loopgate

$bin demo >/tmp/loopgate-quick-wrk.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8080/ && break; sleep 0.1; done

lua=$(mktemp)
cat >"$lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer demo-agent-key"
LUA

run() { # name url
  wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$lua" "$2" 2>&1 |
    awk -v name="$1" '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} /Non-2xx/ {bad=$NF}
      END {printf "%-8s rps=%-10s p50=%-8s p99=%-8s non2xx=%s\n", name, rps, p50, p99, (bad==""?0:bad)}'
}
for round in 1 2; do
  run direct  http://127.0.0.1:18081/v1/chat/completions
  run loopgate http://127.0.0.1:8080/v1/chat/completions
done
