//! Several gateway instances sharing one Redis: limits, budgets and
//! in-flight slots are exact across replicas, an open breaker is shared,
//! a task's loop ring, watchdog count and tool failure streaks are
//! fleet-wide, and losing Redis never lets a request through by accident.

use loopgate_tests::*;
use std::process::Command;
use std::thread;

const RPM_KEY: &str = "scale-rpm-key-0001";
const BUDGET_KEY: &str = "scale-budget-key-0002";
const SLOTS_KEY: &str = "scale-slots-key-0003";
const WATCHED_KEY: &str = "scale-watched-key-0004";
const STREAKY_KEY: &str = "scale-streaky-key-0005";
const CHAT: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

/// A gateway config sharing state through `redis`; `state_extra` adds
/// fields to the `state:` map.
fn config(mock: &Mock, redis: &Redis, state_extra: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}" }}
threads: 2
access_log: {{ path: "off" }}
state:
  backend: redis
  url: "{url}"
  key_prefix: "lg:"
  timeout_ms: 200
  slot_lease_ms: 1500
  breaker_sync_ms: 200
{state_extra}
providers:
  mock:
    kind: openai_compatible
    base_url: "{mock}"
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
    timeouts: {{ connect_ms: 1000, read_ms: 30000 }}
    breaker: {{ consecutive_failures: 2, open_ms: 10000 }}
routes:
  - models: [gpt-4o-mini]
    targets: [ {{ provider: mock }} ]
tools:
  lenient:
    base_url: "{mock}/echo/lenient"
    fail_mode: open
    idempotency: {{ mode: required }}
  strict:
    base_url: "{mock}/echo/strict"
    idempotency: {{ mode: required }}
  flaky:
    base_url: "{mock}/echo/flaky"
    isolate_after: 3
    isolate_ms: 60000
    breaker: {{ consecutive_failures: 100, open_ms: 1000 }}
mcp_servers:
  files-open:
    url: "{mock}/mcp"
    fail_mode: open
  files-closed:
    url: "{mock}/mcp"
agents:
  rpm:
    key_sha256: "{rpm}"
    models: [gpt-4o-mini]
    requests_per_minute: 10
    tool_access:
      lenient: {{ methods: [GET, POST], paths: ["/*"] }}
      strict: {{ methods: [GET, POST], paths: ["/*"] }}
    mcp_access:
      files-open: {{ tools: [read_file] }}
      files-closed: {{ tools: [read_file] }}
  budget:
    key_sha256: "{budget}"
    models: [gpt-4o-mini]
    budgets: {{ daily_tokens: 1000 }}
    loop_guard: {{ window: 10, repeats: 3, cooldown_ms: 30000 }}
  slots:
    key_sha256: "{slots}"
    models: [gpt-4o-mini]
    max_in_flight: 4
  watched:
    key_sha256: "{watched}"
    models: [gpt-4o-mini]
    loop_guard: {{ enabled: false }}
    watchdog: {{ yellow: {{ steps: 2 }}, red: {{ steps: 4 }}, action: stop }}
  streaky:
    key_sha256: "{streaky}"
    models: [gpt-4o-mini]
    loop_guard: {{ enabled: false }}
    tool_access:
      flaky: {{ methods: [GET], paths: ["/*"] }}
"#,
        url = redis.url(),
        mock = mock.url(),
        rpm = sha256_hex(RPM_KEY.as_bytes()),
        budget = sha256_hex(BUDGET_KEY.as_bytes()),
        slots = sha256_hex(SLOTS_KEY.as_bytes()),
        watched = sha256_hex(WATCHED_KEY.as_bytes()),
        streaky = sha256_hex(STREAKY_KEY.as_bytes()),
    )
}

fn chat(gw: &Gateway, key: &str, extra: &[&str]) -> Resp {
    // -m: a hang guard, never a timing judgement.
    let args = [&["-m", "20"], extra].concat();
    post_json(gw, key, "/v1/chat/completions", &args, CHAT.as_bytes())
}

/// `n` requests at once, spread round-robin over `gws`.
fn burst(
    gws: &[Gateway],
    n: usize,
    key: &'static str,
    extra: &'static [&'static str],
) -> Vec<Resp> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let gw = &gws[i % gws.len()];
                s.spawn(move || chat(gw, key, extra))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count(resps: &[Resp], status: u16) -> usize {
    resps.iter().filter(|r| r.status == status).count()
}

fn three(mock: &Mock, redis: &Redis, state_extra: &str) -> Vec<Gateway> {
    let yaml = config(mock, redis, state_extra);
    (0..3).map(|_| Gateway::start(&yaml)).collect()
}

#[test]
fn three_instances_admit_exactly_the_shared_limits() {
    let mock = Mock::start();
    let redis = Redis::start();
    let gws = three(&mock, &redis, "");
    for gw in &gws {
        let ready = curl(&[&gw.admin_url("/ready")]);
        assert_eq!(ready.status, 200, "{}", ready.text());
        assert_eq!(ready.json()["store"]["backend"], "redis");
        assert_eq!(ready.json()["store"]["available"], true);
    }

    // 10 requests per minute; 40 at once over three instances.
    let before = mock.received();
    let r = burst(&gws, 40, RPM_KEY, &[]);
    assert_eq!(count(&r, 200), 10, "admitted vs limit 10");
    assert_eq!(count(&r, 429), 30);
    for denied in r.iter().filter(|r| r.status == 429) {
        denied.assert_gateway_error(429, "rate_limited");
    }
    assert_eq!(
        mock.received() - before,
        10,
        "the provider saw exactly the limit"
    );

    // A daily budget of 1000 tokens; each request reserves ~101 (its prompt
    // plus max_tokens 100), so 9 fit. The mock answers slowly, so no
    // reservation is settled (refunded) while the burst is admitted.
    let before = mock.received();
    let r = burst(&gws, 36, BUDGET_KEY, &["-H", "x-mock-latency-ms: 3000"]);
    assert_eq!(count(&r, 200), 9, "admitted reservations within the budget");
    for denied in r.iter().filter(|r| r.status != 200) {
        denied.assert_gateway_error(402, "budget_exceeded");
    }
    assert_eq!(mock.received() - before, 9);

    // 4 in flight at most, 16 slow requests at once.
    let before = mock.received();
    let r = burst(&gws, 16, SLOTS_KEY, &["-H", "x-mock-latency-ms: 3000"]);
    assert_eq!(count(&r, 200), 4, "in flight vs limit 4");
    for denied in r.iter().filter(|r| r.status != 200) {
        denied.assert_gateway_error(429, "too_many_in_flight");
    }
    assert_eq!(mock.received() - before, 4);
    // Released: the next ones get in.
    assert_eq!(count(&burst(&gws, 3, SLOTS_KEY, &[]), 200), 3);
}

#[test]
fn a_breaker_opened_on_one_instance_is_open_on_all() {
    let mock = Mock::start();
    let redis = Redis::start();
    let gws = three(&mock, &redis, "");
    for _ in 0..2 {
        assert_eq!(
            chat(&gws[0], RPM_KEY, &["-H", "x-mock-status: 500"]).status,
            500
        );
    }
    chat(&gws[0], RPM_KEY, &[]).assert_gateway_error(503, "circuit_open");
    // B and C learn it through Redis (watched on their admin port, so the
    // watching sends nothing upstream)...
    let before = mock.received();
    for gw in &gws[1..] {
        assert!(
            // The gauge appears when the instance first learns of it.
            eventually(2, || gw
                .metric_or_absent("loopgate_breaker_state{key=\"mock\"}")
                == Some(1.0)),
            "the other instances open within a second"
        );
    }
    // ...and refuse at once, with Retry-After; the upstream sees nothing.
    for gw in &gws {
        for _ in 0..3 {
            let r = chat(gw, SLOTS_KEY, &[]);
            r.assert_gateway_error(503, "circuit_open");
            assert!(r.header("retry-after").is_some());
        }
    }
    assert_eq!(
        mock.received(),
        before,
        "the upstream sees nothing while open"
    );
}

#[test]
fn losing_redis_denies_without_touching_the_upstream_and_recovers() {
    let mock = Mock::start();
    let mut redis = Redis::start();
    let port = redis.port;
    let gw = Gateway::start(&config(&mock, &redis, ""));
    assert_eq!(chat(&gw, RPM_KEY, &[]).status, 200);
    let before = mock.received();
    redis.stop();
    for _ in 0..5 {
        let r = chat(&gw, RPM_KEY, &[]);
        r.assert_gateway_error(503, "state_unavailable");
        assert_eq!(r.json()["error"]["retryable"], true);
    }
    assert_eq!(mock.received(), before, "nothing went upstream");
    // Health and metrics keep serving; readiness says why not.
    assert_eq!(curl(&[&gw.admin_url("/health")]).status, 200);
    assert!(eventually(5, || {
        let r = curl(&[&gw.admin_url("/ready")]);
        r.status == 503 && r.json()["store"]["available"] == false
    }));
    assert!(eventually(5, || gw.metric("loopgate_state_available") == 0.0));
    assert!(gw.metric("loopgate_denials_total{code=\"state_unavailable\"}") >= 5.0);

    // Back on the same port: service resumes without a restart.
    let _redis = Redis::start_on(port);
    assert!(
        eventually(15, || chat(&gw, RPM_KEY, &[]).status == 200),
        "recovers on its own"
    );
    assert_eq!(curl(&[&gw.admin_url("/ready")]).status, 200);
}

#[test]
fn with_on_unavailable_local_traffic_continues_within_local_limits() {
    let mock = Mock::start();
    let mut redis = Redis::start();
    let gw = Gateway::start(&config(
        &mock,
        &redis,
        "  on_unavailable: local\n  replicas: 2\n",
    ));
    let r = chat(&gw, RPM_KEY, &[]);
    assert_eq!((r.status, r.header("x-loopgate-degraded")), (200, None));
    redis.stop();
    // 10 per minute shared by 2 replicas: 5 here, counted from zero locally.
    let r: Vec<Resp> = (0..8).map(|_| chat(&gw, RPM_KEY, &[])).collect();
    assert_eq!(count(&r, 200), 5, "the local share of the limit");
    for ok in r.iter().filter(|r| r.status == 200) {
        assert_eq!(ok.header("x-loopgate-degraded"), Some("state"));
    }
    for denied in r.iter().filter(|r| r.status != 200) {
        denied.assert_gateway_error(429, "rate_limited");
    }
    assert_eq!(gw.metric("loopgate_state_degraded_total"), 5.0);
    let ready = curl(&[&gw.admin_url("/ready")]);
    assert_eq!(ready.status, 200, "degraded but serving");
    assert_eq!(ready.json()["store"]["degraded"], true);
}

#[test]
fn slots_held_by_a_killed_instance_come_back_after_the_lease() {
    let mock = Mock::start();
    let redis = Redis::start();
    let yaml = config(&mock, &redis, "");
    let a = Gateway::start(&yaml);
    let b = Gateway::start(&yaml);
    // A holds all 4 slots with slow requests...
    let url = a.url("/v1/chat/completions");
    let auth_a = auth(SLOTS_KEY);
    let holders: Vec<_> = (0..4)
        .map(|_| {
            Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-m", "60", &url, "-H", &auth_a])
                .args(["-H", "x-mock-latency-ms: 30000", "-d", CHAT])
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(
        eventually(10, || mock.received() >= 4),
        "A forwarded all four"
    );
    chat(&b, SLOTS_KEY, &[]).assert_gateway_error(429, "too_many_in_flight");
    // ...and dies without releasing them.
    let killed = Command::new("kill")
        .args(["-9", &a.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The 1.5 s lease runs out (nobody renews it), and B admits again.
    assert!(
        eventually(10, || chat(&b, SLOTS_KEY, &[]).status == 200),
        "the dead instance's slots came back"
    );
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }
}

#[test]
fn fail_mode_open_forwards_tool_calls_the_gateway_cannot_judge_and_says_so() {
    let mock = Mock::start();
    let mut redis = Redis::start();
    let gw = Gateway::start(&config(&mock, &redis, ""));
    let call = |tool: &str, key: &str| {
        curl(&[
            &gw.url(&format!("/tools/{tool}/orders")),
            "-m",
            "20",
            "-H",
            &auth(RPM_KEY),
            "-H",
            &format!("Idempotency-Key: {key}"),
            "-d",
            r#"{"item":"book"}"#,
        ])
    };
    let r = call("lenient", "k1");
    assert_eq!((r.status, r.header("x-loopgate-fail-open")), (200, None));
    redis.stop();
    let before = mock.received();
    // closed (the default): refused, nothing sent.
    let r = call("strict", "k2");
    r.assert_gateway_error(503, "state_unavailable");
    assert_eq!(r.json()["error"]["upstream_failed"], false);
    assert_eq!(mock.received(), before);
    // open: forwarded, and marked with why the gateway could not decide.
    let r = call("lenient", "k3");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-fail-open"), Some("state_unavailable"));
    assert_eq!(mock.received(), before + 1);
    assert_eq!(
        gw.metric("loopgate_fail_open_total{reason=\"state_unavailable\",tool=\"lenient\"}"),
        1.0
    );
    // A policy denial is never overridden: a path outside the grant.
    let r = curl(&[
        &gw.url("/tools/lenient/../strict/x"),
        "--path-as-is",
        "-H",
        &auth(RPM_KEY),
    ]);
    r.assert_gateway_error(400, "invalid_path");
    let r = curl(&[
        &gw.url("/tools/lenient/orders"),
        "-X",
        "DELETE",
        "-H",
        &auth(RPM_KEY),
    ]);
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(mock.received(), before + 1);
}

#[test]
fn a_task_looping_across_instances_is_caught() {
    let mock = Mock::start();
    let redis = Redis::start();
    let gws = three(&mock, &redis, "");
    // The same request of one task, each time through another instance:
    // each instance sees it once, the shared ring sees it three times.
    let task = ["-H", "x-agent-task-id: task-spread-1"];
    assert_eq!(chat(&gws[0], BUDGET_KEY, &task).status, 200);
    assert_eq!(chat(&gws[1], BUDGET_KEY, &task).status, 200);
    let before = mock.received();
    let r = chat(&gws[2], BUDGET_KEY, &task);
    r.assert_gateway_error(409, "loop_detected");
    assert_eq!(mock.received(), before, "the looping call was not sent");
    // The cool-down holds on every instance.
    chat(&gws[0], BUDGET_KEY, &task).assert_gateway_error(409, "loop_detected");
    // Another task is not affected.
    let other = ["-H", "x-agent-task-id: task-spread-2"];
    assert_eq!(chat(&gws[0], BUDGET_KEY, &other).status, 200);
}

#[test]
fn the_watchdog_counts_a_tasks_steps_across_instances() {
    let mock = Mock::start();
    let redis = Redis::start();
    let gws = three(&mock, &redis, "");
    // One task, each step through another instance: each instance sees at
    // most two steps, the shared record all four.
    let task = ["-H", "x-agent-task-id: task-watched-1"];
    let guard = |r: &Resp| r.header("x-loopgate-guard").map(str::to_string);
    let r = chat(&gws[0], WATCHED_KEY, &task);
    assert_eq!((r.status, guard(&r)), (200, None));
    let r = chat(&gws[1], WATCHED_KEY, &task);
    assert_eq!((r.status, guard(&r).as_deref()), (200, Some("warn")));
    let r = chat(&gws[2], WATCHED_KEY, &task);
    assert_eq!((r.status, guard(&r).as_deref()), (200, Some("warn")));
    let before = mock.received();
    let r = chat(&gws[0], WATCHED_KEY, &task);
    r.assert_gateway_error(429, "task_stopped");
    assert_eq!(mock.received(), before, "the stopped call was not sent");
    chat(&gws[1], WATCHED_KEY, &task).assert_gateway_error(429, "task_stopped");
    // Another task is not affected.
    let other = ["-H", "x-agent-task-id: task-watched-2"];
    assert_eq!(chat(&gws[2], WATCHED_KEY, &other).status, 200);
}

/// Requests of `agent` an instance has logged: it logs a request after
/// its exchange features (the tool streak's write among them) are done.
fn logged(gw: &Gateway, agent: &str) -> u64 {
    let page = curl(&[&gw.admin_url("/metrics")]).text();
    let series = format!("loopgate_requests_total{{agent=\"{agent}\",");
    page.lines()
        .filter(|l| l.starts_with(&series))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn a_tool_failing_a_task_on_every_instance_is_isolated_on_all() {
    let mock = Mock::start();
    let redis = Redis::start();
    let gws = three(&mock, &redis, "");
    let call = |gw: &Gateway, task: &str, extra: &[&str]| {
        let url = gw.url("/tools/flaky/status");
        let (key, task) = (auth(STREAKY_KEY), format!("x-agent-task-id: {task}"));
        let mut args = vec![url.as_str(), "-m", "20", "-H", &key, "-H", &task];
        args.extend_from_slice(extra);
        curl(&args)
    };
    // The same failing answer once through each instance: each instance
    // saw one failure (isolate_after is 3), the shared streak three.
    for gw in &gws {
        let r = call(gw, "task-flaky-1", &["-H", "x-mock-status: 503"]);
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(eventually(10, || logged(gw, "streaky") == 1), "logged");
    }
    let before = mock.received();
    for gw in &gws {
        let r = call(gw, "task-flaky-1", &[]);
        r.assert_gateway_error(409, "tool_isolated");
        assert!(r.header("retry-after").is_some());
    }
    assert_eq!(mock.received(), before, "no isolated call was sent");
    // Another task of the agent still reaches the tool.
    assert_eq!(call(&gws[1], "task-flaky-2", &[]).status, 200);
}

#[test]
fn mcp_servers_follow_their_fail_mode_when_redis_is_lost() {
    let mock = Mock::start();
    let mut redis = Redis::start();
    let gw = Gateway::start(&config(&mock, &redis, ""));
    let post = |server: &str, sid: Option<&str>, body: &str| {
        let sid = sid.map(|s| format!("mcp-session-id: {s}"));
        let mut args = vec!["-m", "20"];
        if let Some(s) = &sid {
            args.extend(["-H", s.as_str()]);
        }
        post_json(&gw, RPM_KEY, &format!("/mcp/{server}"), &args, body)
    };
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/a"}}}"#;
    let open_sid = post("files-open", None, init)
        .header("mcp-session-id")
        .unwrap()
        .to_string();
    let closed_sid = post("files-closed", None, init)
        .header("mcp-session-id")
        .unwrap()
        .to_string();
    redis.stop();
    let before = mock.received();
    let r = post("files-closed", Some(&closed_sid), call);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json()["error"]["data"]["loopgate_code"],
        "state_unavailable"
    );
    assert_eq!(mock.received(), before);
    let r = post("files-open", Some(&open_sid), call);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("result").is_some());
    assert_eq!(r.header("x-loopgate-fail-open"), Some("state_unavailable"));
    // A call outside the grant is still refused: fail_mode never overrides a denial.
    let denied =
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_file"}}"#;
    let r = post("files-open", Some(&open_sid), denied);
    assert_eq!(
        r.json()["error"]["data"]["loopgate_code"],
        "tool_not_allowed"
    );
    assert_eq!(mock.received(), before + 1);
}
