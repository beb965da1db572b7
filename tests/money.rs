//! Money budgets (USD) over the mock: reserved before the call at the
//! model's price, in the same atomic store call as every other limit,
//! settled on the reported usage's cost; a call that cannot fit is 402
//! `budget_exceeded` naming the level, with `Retry-After` when a window
//! will free room. Exact under concurrency; streams cut when their money
//! runs out; `on_unknown_price`; `/admin/spend` and the used-ratio gauge.

use loopgate_tests::*;
use serde_json::Value;
use std::thread;

const MATE_KEY: &str = "money-mate-key-0002";
const TASKY_KEY: &str = "money-tasky-key-0003";
const SOLO_KEY: &str = "money-solo-key-0004";

/// Prices are written so a micro-dollar is easy to count: `priced` costs
/// $1 per million prompt tokens (1 micro-dollar a token) and $10 per
/// million output tokens (10 a token).
fn config(mock: &Mock, extra: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}
threads: 2
access_log: {{ path: "off" }}
providers:
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
routes:
  - models: [priced, embed-priced, mystery, "llama*"]
    targets: [ {{ provider: oa }} ]
  - models: [claude-priced]
    targets: [ {{ provider: an }} ]
models:
  priced: {{ price: {{ input: 1, output: 10 }} }}
  embed-priced: {{ price: {{ input: 1, output: 0 }} }}
  claude-priced: {{ price: {{ input: 1, output: 10 }} }}
teams:
  ops: {{ daily_usd: 0.005 }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [priced, embed-priced, claude-priced]
    loop_guard: {{ enabled: false }}
    team: ops
    budgets: {{ daily_usd: 0.01, default_max_tokens: 100 }}
  mate:
    key_sha256: "{mate}"
    models: [priced]
    loop_guard: {{ enabled: false }}
    team: ops
  tasky:
    key_sha256: "{tasky}"
    models: [priced, embed-priced, claude-priced]
    loop_guard: {{ enabled: false }}
    budgets: {{ task_usd: 0.0015, default_max_tokens: 100 }}
  solo:
    key_sha256: "{solo}"
    models: [priced]
    loop_guard: {{ enabled: false }}
    budgets: {{ monthly_usd: 0.01 }}
{extra}
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        mate = sha256_hex(MATE_KEY.as_bytes()),
        tasky = sha256_hex(TASKY_KEY.as_bytes()),
        solo = sha256_hex(SOLO_KEY.as_bytes()),
    )
}

fn start(mock: &Mock, extra: &str) -> Gateway {
    Gateway::start_with_env(
        &config(mock, extra),
        &[("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)],
    )
}

/// `user` + `hi`: 6 bytes of text, an estimate of 2 prompt tokens; with
/// `max_tokens` 100 a call reserves 2 x 1 + 100 x 10 = 1002 micro-dollars.
const CALL: &str =
    r#"{"model":"priced","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

/// A call as `key`, the mock reporting `prompt` prompt tokens and
/// `completion` output tokens.
fn spend(gw: &Gateway, key: &str, prompt: u64, completion: u64, extra: &[&str]) -> Resp {
    let p = format!("x-mock-prompt-tokens: {prompt}");
    let c = format!("x-mock-chunks: {completion}");
    let args = [&["-H", p.as_str(), "-H", c.as_str()], extra].concat();
    post_json(gw, key, "/v1/chat/completions", &args, CALL)
}

fn budget(r: &Resp) -> Value {
    r.json()["error"]["budget"].clone()
}

#[test]
fn a_call_the_money_left_cannot_pay_for_is_refused_naming_the_level() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    // The agent's day is $0.01 = 10,000 micro-dollars; its team's $0.005
    // applies too. Reserved 1002, cost 1000 + 100 x 10 = 2000 (settled up).
    assert_eq!(spend(&gw, AGENT_KEY, 1000, 100, &[]).status, 200);
    // Reserved 1002, cost 100 + 10 x 10 = 200 (settled down): 2200 spent.
    assert_eq!(spend(&gw, AGENT_KEY, 100, 10, &[]).status, 200);
    // 2200 + 2 x 1002 fits the team's 5000 ...
    assert_eq!(spend(&gw, AGENT_KEY, 992, 1, &[]).status, 200);
    assert_eq!(spend(&gw, AGENT_KEY, 992, 1, &[]).status, 200);
    // ... 4204 + 1002 does not: the team's day refuses, before upstream.
    let before = mock.received();
    let r = spend(&gw, AGENT_KEY, 1, 1, &[]);
    println!("402 answer: {r:?}");
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(mock.received(), before, "nothing went upstream");
    let b = budget(&r);
    assert_eq!(b["level"], "team_day", "{b}");
    assert_eq!(b["limit_usd"], 0.005, "{b}");
    assert_eq!(b["reserved_usd"], 0.001002, "{b}");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("$0.001002") && msg.contains("team's daily budget of $0.005"),
        "{msg}"
    );
    assert_eq!(r.json()["error"]["retryable"], true);
    // Room comes back when the first call's slice leaves the day: a day
    // plus at most one slice (144 s) after it was admitted.
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(after <= 86_400 + 144, "{after}");
    // Another agent of the team is refused by the same shared window.
    let r = spend(&gw, MATE_KEY, 1, 1, &[]);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["level"], "team_day");
}

#[test]
fn the_agents_own_day_and_a_task_budget_name_their_level() {
    let mock = Mock::start();
    // Without the team: the agent's $0.01 day is what refuses.
    let yaml = config(&mock, "").replace("    team: ops\n", "");
    let gw = Gateway::start_with_env(&yaml, &[("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)]);
    // 9000 spent (reserved 1002 each time, settled up).
    for _ in 0..3 {
        assert_eq!(spend(&gw, AGENT_KEY, 1000, 200, &[]).status, 200);
    }
    // 9000 + 1002 > 10000.
    let r = spend(&gw, AGENT_KEY, 1, 1, &[]);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["level"], "agent_day");
    assert_eq!(budget(&r)["limit_usd"], 0.01);
    assert!(r.header("retry-after").is_some());
    // A task budget ($0.0015) is the task's in all: no Retry-After.
    let task = ["-H", "x-agent-task-id: t-1"];
    assert_eq!(spend(&gw, TASKY_KEY, 2, 10, &task).status, 200); // 102
    let r = spend(&gw, TASKY_KEY, 2, 10, &task); // 102 + 1002 fits
    assert_eq!(r.status, 200, "{r:?}");
    let r = spend(&gw, TASKY_KEY, 2, 10, &task); // 204 + 1002 fits
    assert_eq!(r.status, 200, "{r:?}");
    let r = spend(&gw, TASKY_KEY, 2, 10, &task); // 306 + 1002 fits
    assert_eq!(r.status, 200, "{r:?}");
    let r = spend(&gw, TASKY_KEY, 2, 10, &task); // 408 + 1002 fits
    assert_eq!(r.status, 200, "{r:?}");
    let r = spend(&gw, TASKY_KEY, 2, 10, &task); // 510 + 1002 > 1500
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["level"], "task");
    assert_eq!(r.json()["error"]["retryable"], false);
    assert_eq!(r.header("retry-after"), None);
    // Another task has its own.
    let other = ["-H", "x-agent-task-id: t-2"];
    assert_eq!(spend(&gw, TASKY_KEY, 2, 10, &other).status, 200);
}

/// Every endpoint that costs money reserves from the budget: with a task
/// budget of $0.0015, two calls reserving 1002 each do not both fit, on
/// chat completions, completions, responses and messages, streamed or
/// not; embeddings reserve their prompt only.
#[test]
fn every_paid_endpoint_reserves_streamed_or_not() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let cases: [(&str, &str); 8] = [
        (
            "/v1/chat/completions",
            r#"{"model":"priced","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"priced","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/completions",
            r#"{"model":"priced","max_tokens":100,"prompt":"userhi"}"#,
        ),
        (
            "/v1/responses",
            r#"{"model":"priced","max_output_tokens":100,"input":"userhi"}"#,
        ),
        (
            "/v1/responses",
            r#"{"model":"priced","stream":true,"max_output_tokens":100,"input":"userhi"}"#,
        ),
        (
            "/v1/messages",
            r#"{"model":"claude-priced","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/messages",
            r#"{"model":"claude-priced","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        ("/v1/embeddings", r#"{"model":"embed-priced","input":"hi"}"#),
    ];
    for (i, (path, body)) in cases.iter().enumerate() {
        let task = format!("x-agent-task-id: e-{i}");
        // The provider reports what was reserved (2 + 100 out), so the
        // first call's cost stays 1002 (embeddings: the prompt only).
        let args = [
            "-N",
            "-H",
            task.as_str(),
            "-H",
            "x-mock-prompt-tokens: 2",
            "-H",
            "x-mock-chunks: 100",
        ];
        let first = post_json(&gw, TASKY_KEY, path, &args, body);
        assert_eq!(first.status, 200, "{path} {body}: {first:?}");
        let before = mock.received();
        let second = post_json(&gw, TASKY_KEY, path, &args, body);
        if path.ends_with("embeddings") {
            // 2 micro-dollars a call: the 1500 fit hundreds.
            assert_eq!(second.status, 200, "{second:?}");
            continue;
        }
        second.assert_gateway_error(402, "budget_exceeded");
        assert_eq!(budget(&second)["level"], "task", "{path}");
        assert_eq!(mock.received(), before, "{path}: refused before upstream");
    }
}

/// `n` calls at once as `keys` in turn, spread round-robin over `gws`.
/// Each reserves 1002 micro-dollars and is reported to cost exactly that
/// (2 prompt tokens + 100 x 10), so no refund frees room while the burst
/// is admitted, however the calls interleave.
fn burst(gws: &[Gateway], n: usize, keys: &[&'static str]) -> Vec<Resp> {
    thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let gw = &gws[i % gws.len()];
                let key = keys[i % keys.len()];
                s.spawn(move || spend(gw, key, 2, 100, &["-m", "20"]))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Exactly `fit` of `resps` were admitted, the rest refused by `level`.
fn exactly(resps: &[Resp], fit: usize, level: &str) {
    let ok = resps.iter().filter(|r| r.status == 200).count();
    assert_eq!(ok, fit, "admitted within the {level} budget");
    for r in resps.iter().filter(|r| r.status != 200) {
        r.assert_gateway_error(402, "budget_exceeded");
        assert_eq!(budget(r)["level"], level, "{r:?}");
    }
}

#[test]
fn one_instance_admits_exactly_what_the_money_pays_for() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let gws = std::slice::from_ref(&gw);
    // The team's $0.005 = 5000 micro-dollars: 4 calls of 1002, whichever
    // of its two agents sends them.
    let before = mock.received();
    exactly(&burst(gws, 24, &[AGENT_KEY, MATE_KEY]), 4, "team_day");
    assert_eq!(mock.received() - before, 4, "the provider saw exactly 4");
    // An agent's month of $0.01: 9 of 40.
    let before = mock.received();
    exactly(&burst(gws, 40, &[SOLO_KEY]), 9, "agent_month");
    assert_eq!(mock.received() - before, 9);
}

#[test]
fn three_instances_on_one_redis_admit_exactly_what_the_money_pays_for() {
    let mock = Mock::start();
    let redis = Redis::start();
    let state = format!(
        "state: {{ backend: redis, url: \"{}\", key_prefix: \"lgm:\", timeout_ms: 500 }}",
        redis.url()
    );
    let gws: Vec<Gateway> = (0..3).map(|_| start(&mock, &state)).collect();
    let before = mock.received();
    exactly(&burst(&gws, 36, &[SOLO_KEY]), 9, "agent_month");
    assert_eq!(mock.received() - before, 9, "the provider saw exactly 9");
    // The team's day, shared by two agents on three instances.
    let before = mock.received();
    exactly(&burst(&gws, 30, &[AGENT_KEY, MATE_KEY]), 4, "team_day");
    assert_eq!(mock.received() - before, 4);
    // The spend is the fleet's (9 x 1002 of the month, nothing
    // refunded): every instance's gauge says so at its scrape, whichever
    // admitted the last calls, a tenth call is refused on every instance,
    // and each instance's /admin/spend reads the same numbers from Redis.
    for gw in &gws {
        let ratio = |scope: &str| {
            gw.metric(&format!(
                r#"loopgate_budget_used_ratio{{agent="solo",scope="{scope}"}}"#
            ))
        };
        assert_eq!(ratio("month"), 9018.0 / 10_000.0);
    }
    for gw in &gws {
        let r = spend(gw, SOLO_KEY, 1, 1, &[]);
        r.assert_gateway_error(402, "budget_exceeded");
        let v = admin_spend(gw).json();
        let solo = entry(&v, "agents", "agent", "solo");
        assert_eq!(solo["month"]["spent_usd"], 0.009018, "{v}");
        assert_eq!(
            entry(&v, "teams", "team", "ops")["day"]["spent_usd"],
            0.004008
        );
    }
}

/// A stream that outgrows the money its budgets have left is cut with an
/// error event: room in output tokens is the money left (plus its own
/// reservation, less the prompt) at the output price.
#[test]
fn a_stream_outgrowing_its_money_is_cut_with_an_error_event() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    // Task budget 1500; the call reserves 2 + 100 x 10 = 1002 (no
    // max_tokens: the default 100), so it may write (1500 - 2) / 10 = 149
    // output tokens.
    let body = r#"{"model":"priced","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let args = [
        "-N",
        "-H",
        "x-agent-task-id: long",
        "-H",
        "x-mock-chunks: 2000",
        "-H",
        "x-mock-chunk-delay-ms: 1",
    ];
    let r = post_json(&gw, TASKY_KEY, "/v1/chat/completions", &args, body);
    assert_eq!(r.status, 200);
    let text = r.text();
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let err: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(err["error"]["code"], "budget_exceeded", "{last}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(msg.contains("the money budget had room for 149"), "{msg}");
    let delivered = text.matches("\"content\":").count();
    assert!(
        (100..400).contains(&delivered),
        "delivered {delivered} of 2000: the cut is bounded"
    );
    assert!(!text.contains("[DONE]"));
    assert_eq!(
        gw.metric(r#"loopgate_budget_cuts_total{agent="tasky"}"#),
        1.0
    );
    // Settled at what it wrote (and its prompt): the task has no room left.
    let r = post_json(&gw, TASKY_KEY, "/v1/chat/completions", &args[1..3], CALL);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["level"], "task");
}

/// An agent under a money budget allowed models without a price.
const LOOSE: &str = r#"  loose:
    key_sha256: "LOOSE"
    models: [priced, mystery, "llama*"]
    loop_guard: { enabled: false }
    budgets: { daily_usd: 0.01 }
"#;
const LOOSE_KEY: &str = "money-loose-key-0005";

fn loose() -> String {
    LOOSE.replace("LOOSE", &sha256_hex(LOOSE_KEY.as_bytes()))
}

#[test]
fn on_unknown_price_deny_is_refused_by_check_and_zero_counts_free() {
    let mock = Mock::start();
    let dir = scratch_dir("money-check");
    let path = dir.join("unpriced.yaml");
    let check = |yaml: &str| {
        let yaml = yaml.replace("{PORT}", "0").replace("{ADMIN_PORT}", "0");
        std::fs::write(&path, yaml).unwrap();
        let (code, err) = check_config(&path);
        (code == Some(0), err)
    };
    // deny (the default): the config is refused, naming the agent, what
    // it may call and the field; a wildcard route needs every name under
    // it priced.
    let (ok, err) = check(&config(&mock, &loose()));
    assert!(!ok, "{err}");
    for want in [
        "unpriced.yaml: agents.loose.budgets: agent `loose` spends under a money budget and may call `mystery` (route `mystery`), but `mystery` has no price and on_unknown_price is deny",
        "agents.loose.budgets: agent `loose` spends under a money budget and may call `llama*` (route `llama*`), but `llama*` has no price",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let (ok, err) = check(&config(&mock, ""));
    assert!(ok, "{err}");
    // zero: accepted, and calls to a model without a price cost nothing.
    let zero = format!("{}on_unknown_price: zero\n", loose());
    let (ok, err) = check(&config(&mock, &zero));
    assert!(ok, "{err}");
    let gw = start(&mock, &zero);
    let mystery = CALL.replace("priced", "mystery");
    for _ in 0..3 {
        let args = [
            "-H",
            "x-mock-prompt-tokens: 1000000",
            "-H",
            "x-mock-chunks: 500",
        ];
        let r = post_json(&gw, LOOSE_KEY, "/v1/chat/completions", &args, &mystery);
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Nothing was counted: the whole $0.01 is still there for 9 priced
    // calls of 1002.
    for _ in 0..9 {
        assert_eq!(spend(&gw, LOOSE_KEY, 2, 100, &[]).status, 200);
    }
    let r = spend(&gw, LOOSE_KEY, 2, 100, &[]);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["level"], "agent_day");
}

fn admin_spend(gw: &Gateway) -> Resp {
    let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
    curl(&[&gw.admin_url("/admin/spend"), "-H", &auth])
}

/// The spend entry of `name` in `/admin/spend`'s list `list`.
fn entry(spend: &Value, list: &str, field: &str, name: &str) -> Value {
    spend[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e[field] == name)
        .unwrap_or_else(|| panic!("no {field} {name} in {spend}"))
        .clone()
}

#[test]
fn admin_spend_and_the_used_ratio_gauge_show_spend_and_room() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    assert_eq!(curl(&[&gw.admin_url("/admin/spend")]).status, 401);
    // tester: 2000 + 200 of its $0.01 day and of team ops' $0.005.
    assert_eq!(spend(&gw, AGENT_KEY, 1000, 100, &[]).status, 200);
    assert_eq!(spend(&gw, AGENT_KEY, 100, 10, &[]).status, 200);
    // A scrape reads the store: 2000 + 200 spent, the reservations
    // settled.
    assert_eq!(
        gw.metric(r#"loopgate_budget_used_ratio{agent="tester",scope="team_day"}"#),
        2200.0 / 5000.0
    );
    // tasky: 102 in task t-1, 204 in t-2.
    for task in ["t-1", "t-2", "t-2"] {
        let h = format!("x-agent-task-id: {task}");
        assert_eq!(spend(&gw, TASKY_KEY, 2, 10, &["-H", &h]).status, 200);
    }
    let r = admin_spend(&gw);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    println!("GET /admin/spend: {v}");
    let tester = entry(&v, "agents", "agent", "tester");
    assert_eq!(tester["team"], "ops");
    assert_eq!(
        tester["day"],
        serde_json::json!({"limit_usd": 0.01, "spent_usd": 0.0022, "left_usd": 0.0078, "used_ratio": 0.22})
    );
    assert_eq!(tester["month"], Value::Null);
    let ops = entry(&v, "teams", "team", "ops");
    assert_eq!(ops["day"]["spent_usd"], 0.0022);
    assert_eq!(ops["day"]["left_usd"], 0.0028);
    let tasky = entry(&v, "agents", "agent", "tasky");
    assert_eq!(tasky["task_limit_usd"], 0.0015);
    let t2 = entry(&tasky, "tasks", "task", "t-2");
    assert_eq!(
        (t2["spent_usd"].as_f64(), t2["left_usd"].as_f64()),
        (Some(0.000204), Some(0.001296))
    );
    assert_eq!(entry(&tasky, "tasks", "task", "t-1")["spent_usd"], 0.000102);
    // An agent without a money budget is not listed; no key, digest or
    // prompt text is.
    assert!(v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["agent"] != "solo" || !a["month"].is_null()));
    let text = r.text();
    for secret in [
        AGENT_KEY,
        UPSTREAM_KEY,
        ADMIN_TOKEN,
        &sha256_hex(AGENT_KEY.as_bytes()),
    ] {
        assert!(!text.contains(secret), "{text}");
    }
    assert!(!text.contains("\"hi\""), "{text}");
    // The read set the gauge to what was spent (reservations settled).
    for (agent, scope, want) in [
        ("tester", "day", 0.22),
        ("tester", "team_day", 0.44),
        ("tasky", "task", 204.0 / 1500.0),
    ] {
        let sample = format!(r#"loopgate_budget_used_ratio{{agent="{agent}",scope="{scope}"}}"#);
        assert_eq!(gw.metric(&sample), want, "{sample}");
    }
}

/// The official OpenAI and Anthropic Python SDKs (`sdk/money.py`) see a
/// money refusal as their 402 status error, with Loopgate's code and the
/// budget's level. `.ci/run` installs the SDKs.
#[test]
fn the_official_sdks_see_the_402_with_its_level() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let gw_url = format!("http://{}", gw.addr);
    run_sdk_script("money.py", &[&gw_url, TASKY_KEY], "sdk money ok");
}

/// A body past 64 KiB goes upstream through a subrequest: it reserves on
/// its estimate and settles on what its subrequest read of the answer.
#[test]
fn a_large_body_reserves_on_its_estimate_and_settles_on_its_cost() {
    let mock = Mock::start();
    const BIG_KEY: &str = "money-big-key-0006";
    let big = format!(
        "  big:\n    key_sha256: \"{}\"\n    models: [priced]\n    loop_guard: {{ enabled: false }}\n    budgets: {{ daily_usd: 0.05 }}\n",
        sha256_hex(BIG_KEY.as_bytes())
    );
    let gw = start(&mock, &big);
    // 80,004 bytes of text (`user` too): an estimate of 20,001 prompt
    // tokens, reserved 20,001 + 100 x 10 = 21,001 micro-dollars of the
    // day's 50,000.
    let text = "a".repeat(80_000);
    let body = format!(
        r#"{{"model":"priced","max_tokens":100,"messages":[{{"role":"user","content":"{text}"}}]}}"#
    );
    let args = ["-H", "x-mock-prompt-tokens: 5", "-H", "x-mock-chunks: 10"];
    let r = post_json(&gw, BIG_KEY, "/v1/chat/completions", &args, &body);
    assert_eq!(r.status, 200, "{r:?}");
    // Settled at 5 + 10 x 10 = 105.
    let v = admin_spend(&gw).json();
    assert_eq!(
        entry(&v, "agents", "agent", "big")["day"]["spent_usd"],
        0.000105,
        "{v}"
    );
    // A reservation past the whole day (50,001 + 1,000) never fits: refused
    // before the body goes anywhere, not retryable, no Retry-After.
    let before = mock.received();
    let three = format!(
        r#"{{"model":"priced","max_tokens":100,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(200_000)
    );
    let r = post_json(&gw, BIG_KEY, "/v1/chat/completions", &args, &three);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(budget(&r)["reserved_usd"], 0.051001, "{r:?}");
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(mock.received(), before);
}

/// A money budget in dry-run reports what it would refuse and cuts no
/// stream.
#[test]
fn a_money_budget_in_dry_run_reports_and_cuts_nothing() {
    let mock = Mock::start();
    const DRY_KEY: &str = "money-dry-key-0007";
    let dry = format!(
        "  dry:\n    key_sha256: \"{}\"\n    models: [priced]\n    loop_guard: {{ enabled: false }}\n    dry_run: [budget_exceeded]\n    budgets: {{ task_usd: 0.0005 }}\n",
        sha256_hex(DRY_KEY.as_bytes())
    );
    let gw = start(&mock, &dry);
    // Reserves 1002 of a task budget of 500: refused in enforce mode.
    let body = r#"{"model":"priced","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let args = ["-N", "-H", "x-agent-task-id: d", "-H", "x-mock-chunks: 300"];
    let r = post_json(&gw, DRY_KEY, "/v1/chat/completions", &args, body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-loopgate-would-deny"), Some("budget_exceeded"));
    assert!(r.text().ends_with("data: [DONE]\n\n"), "not cut");
    assert_eq!(
        gw.metric_or_absent(r#"loopgate_budget_cuts_total{agent="dry"}"#),
        None
    );
}
