# The Loopgate config that benches/compare and benches/instructions measure:
# agent key, model and path allowlists, 100 blocked phrases, limits high
# enough never to trigger, the breaker (on by default), metrics on an admin
# port and an access log. One definition, so both benches judge the same work.
# Usage (sourced): loopgate_bench_config LISTEN ADMIN MOCK ACCESS_LOG KEY_SHA256 > file
loopgate_bench_config() {
  local phrases
  phrases=$(for i in $(seq 1 100); do printf '    - "blocked phrase number %d"\n' "$i"; done)
  cat <<YAML
listen: $1
threads: 1
admin: { listen: "$2" }
access_log: { path: "$4" }
providers:
  mock: { kind: openai_compatible, base_url: "http://$3" }
routes:
  - models: [gpt-4o-mini]
    targets: [ { provider: mock } ]
policy:
  requests_per_minute: 100000000
  max_in_flight: 100000
  blocked_phrases:
$phrases
agents:
  bench:
    key_sha256: "$5"
    models: [gpt-4o-mini]
    paths: [/v1/chat/completions]
YAML
}
