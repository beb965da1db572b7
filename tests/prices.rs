//! What each answer cost: the built-in price catalog and the config's
//! prices, applied to the usage the mock reports (cached tokens included),
//! in the access log, `loopgate_cost_usd_total` and a non-streamed
//! answer's `x-loopgate-cost-usd`, checked to the cent against a table
//! computed by hand.

use loopgate_tests::*;
use serde_json::Value;

fn config(mock: &Mock, dir: &std::path::Path) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
access_log: {{ path: "{log}" }}
threads: 2
cost_header: true
providers:
  oa:
    kind: openai_compatible
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
  an:
    kind: anthropic
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
  local:
    kind: openai_compatible
    base_url: {mock}
    price: {{ input: 0, output: 0 }}
routes:
  - models: [gpt-4o]
    targets: [ {{ provider: oa }} ]
  - models: ["claude-sonnet-4-5*"]
    targets: [ {{ provider: an }} ]
  - models: [llama3]
    targets: [ {{ provider: local }} ]
  - models: ["mystery*"]
    targets: [ {{ provider: oa }} ]
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
"#,
        mock = mock.url(),
        log = dir.join("access.log").display(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

/// One priced call: the model, streamed or not, the usage the mock
/// reports (prompt tokens, of them cached and written to the cache,
/// completion tokens) and the cost by hand.
struct Case {
    name: &'static str,
    model: &'static str,
    stream: bool,
    prompt: u64,
    cached: u64,
    written: u64,
    completion: u64,
    usd: Option<f64>,
    /// `x-loopgate-cost-usd` exactly as sent (non-streamed, priced).
    header: Option<&'static str>,
}

/// USD per million tokens from `gateway/data/prices.yaml`:
/// gpt-4o* 2.50 in, 1.25 cached, 10.00 out;
/// claude-sonnet-4-5* 3.00 in, 0.30 cache read, 3.75 cache write, 15.00 out.
const CASES: &[Case] = &[
    // 200k uncached * 2.50 + 200k cached * 1.25 + 2k * 10 = 0.50 + 0.25 + 0.02
    Case {
        name: "openai-cached",
        model: "gpt-4o",
        stream: false,
        prompt: 400_000,
        cached: 200_000,
        written: 0,
        completion: 2_000,
        usd: Some(0.77),
        header: Some("0.77"),
    },
    // Anthropic reports input_tokens = 500k - 300k - 100k = 100k:
    // 100k * 3.00 + 300k * 0.30 + 100k * 3.75 + 1k * 15 = 0.30 + 0.09 + 0.375 + 0.015
    Case {
        name: "anthropic-cache",
        model: "claude-sonnet-4-5-20250929",
        stream: false,
        prompt: 500_000,
        cached: 300_000,
        written: 100_000,
        completion: 1_000,
        usd: Some(0.78),
        header: Some("0.78"),
    },
    // 80k * 2.50 + 40k * 1.25 + 1k * 10 = 0.20 + 0.05 + 0.01
    Case {
        name: "openai-stream",
        model: "gpt-4o",
        stream: true,
        prompt: 120_000,
        cached: 40_000,
        written: 0,
        completion: 1_000,
        usd: Some(0.26),
        header: None,
    },
    // 100k * 3.00 + 100k * 0.30 + 2k * 15 = 0.30 + 0.03 + 0.03
    Case {
        name: "anthropic-stream",
        model: "claude-sonnet-4-5-20250929",
        stream: true,
        prompt: 200_000,
        cached: 100_000,
        written: 0,
        completion: 2_000,
        usd: Some(0.36),
        header: None,
    },
    // The local provider's own price: nothing.
    Case {
        name: "local",
        model: "llama3",
        stream: false,
        prompt: 300_000,
        cached: 0,
        written: 0,
        completion: 500,
        usd: Some(0.0),
        header: Some("0"),
    },
    // Routed, but no price anywhere: no cost.
    Case {
        name: "unknown",
        model: "mystery-1",
        stream: false,
        prompt: 300_000,
        cached: 0,
        written: 0,
        completion: 500,
        usd: None,
        header: None,
    },
];

fn call(gw: &Gateway, c: &Case) -> Resp {
    let anthropic = c.model.starts_with("claude");
    let (path, key) = if anthropic {
        ("/v1/messages", format!("x-api-key: {AGENT_KEY}"))
    } else {
        ("/v1/chat/completions", auth(AGENT_KEY))
    };
    let body = format!(
        r#"{{"model":"{}","max_tokens":4000,"stream":{},"messages":[{{"role":"user","content":"hi"}}]}}"#,
        c.model, c.stream
    );
    let url = gw.url(path);
    let h = |name: &str, v: u64| format!("{name}: {v}");
    let headers = [
        h("x-mock-prompt-tokens", c.prompt),
        h("x-mock-cached-tokens", c.cached),
        h("x-mock-cache-write-tokens", c.written),
        h("x-mock-chunks", c.completion),
        format!("x-agent-call-id: {}", c.name),
    ];
    let mut args = vec![url.as_str(), "-N", "-H", key.as_str()];
    for x in &headers {
        args.extend(["-H", x.as_str()]);
    }
    args.extend(["-d", body.as_str()]);
    curl(&args)
}

fn cents(usd: f64) -> i64 {
    (usd * 100.0).round() as i64
}

#[test]
fn every_answer_costs_what_the_hand_computed_table_says() {
    let mock = Mock::start();
    let dir = scratch_dir("prices");
    let gw = Gateway::start(&config(&mock, &dir));
    for c in CASES {
        let r = call(&gw, c);
        assert_eq!(r.status, 200, "{}: {}", c.name, r.text());
        // A non-streamed priced answer is held until its usage is read and
        // says its exact cost; a stream's usage comes after its header
        // left, and an unpriced model has no cost (README: Prices).
        assert_eq!(r.header("x-loopgate-cost-usd"), c.header, "{}", c.name);
        if c.header.is_some() {
            let usage = &r.json()["usage"];
            assert!(usage.is_object(), "{}: {}", c.name, r.text());
        }
    }
    let path = dir.join("access.log");
    assert!(eventually(5, || std::fs::read_to_string(&path)
        .is_ok_and(|t| t.lines().count() >= CASES.len())));
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    for c in CASES {
        let line = lines
            .iter()
            .find(|l| l["call_id"] == c.name)
            .unwrap_or_else(|| panic!("no log line for {}", c.name));
        let cost = line["cost_usd"].as_f64();
        assert_eq!(cost.map(cents), c.usd.map(cents), "{}: {line}", c.name);
        if let (Some(got), Some(want)) = (cost, c.usd) {
            assert!((got - want).abs() < 1e-9, "{}: {got} != {want}", c.name);
        }
    }

    // The metric, by the catalog's name (or the route's, for a model only
    // its provider prices); the unknown model made no label.
    let metric = |model: &str| {
        gw.metric_or_absent(&format!(
            r#"loopgate_cost_usd_total{{agent="tester",model="{model}"}}"#
        ))
    };
    assert_eq!(metric("gpt-4o*").map(cents), Some(cents(0.77 + 0.26)));
    assert_eq!(
        metric("claude-sonnet-4-5*").map(cents),
        Some(cents(0.78 + 0.36))
    );
    assert_eq!(metric("llama3"), Some(0.0));
    let page = curl(&[&gw.admin_url("/metrics")]).text();
    let cost_lines: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("loopgate_cost_usd_total{"))
        .collect();
    assert_eq!(cost_lines.len(), 3, "{cost_lines:?}");
    assert!(
        !cost_lines.iter().any(|l| l.contains("mystery")),
        "{cost_lines:?}"
    );
}

/// The official SDKs (`sdk/prices.py`) read the cost of a non-streamed
/// answer from its header, to the cent of the table; a streamed answer's
/// cost is in the access log, checked here.
#[test]
fn the_official_sdks_read_what_each_answer_cost() {
    let mock = Mock::start();
    let dir = scratch_dir("prices-sdk");
    let gw = Gateway::start(&config(&mock, &dir));
    let gw_url = format!("http://{}", gw.addr);
    run_sdk_script("prices.py", &[&gw_url, AGENT_KEY], "sdk prices ok");
    // 80k * 2.50 + 40k * 1.25 + 1k * 10 = 0.26; 100k * 3 + 100k * 0.30
    // + 2k * 15 = 0.36 (per million).
    let path = dir.join("access.log");
    let logged = |call: &str| {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["call_id"] == call)
            .and_then(|l| l["cost_usd"].as_f64())
    };
    assert!(eventually(5, || logged("sdk-anthropic-stream").is_some()));
    for (call, usd) in [
        ("sdk-openai", 0.77),
        ("sdk-openai-stream", 0.26),
        ("sdk-anthropic", 0.78),
        ("sdk-anthropic-stream", 0.36),
    ] {
        assert_eq!(logged(call).map(cents), Some(cents(usd)), "{call}");
    }
}

#[test]
fn bad_prices_and_on_unknown_price_are_checked() {
    let dir = scratch_dir("prices-check");
    let path = dir.join("bad.yaml");
    let yaml = r#"
listen: 127.0.0.1:0
on_unknown_price: maybe
providers:
  oa: { kind: openai_compatible, base_url: "http://127.0.0.1:9", price: { input: -1, output: 0 } }
models:
  m: { price: { input: 1, output: 2, cache_read: -0.5 }, context_window: 0 }
"#;
    std::fs::write(&path, yaml).unwrap();
    let (code, err) = check_config(&path);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("on_unknown_price"), "{err}");

    std::fs::write(&path, yaml.replace("on_unknown_price: maybe\n", "")).unwrap();
    let (code, err) = check_config(&path);
    assert_eq!(code, Some(1), "{err}");
    for want in [
        "bad.yaml: providers.oa.price.input: must be a price",
        "bad.yaml: models.m.price.cache_read: must be a price",
        "bad.yaml: models.m.context_window: must be at least 1",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }

    std::fs::write(
        &path,
        yaml.replace("maybe", "zero")
            .replace("-1", "0")
            .replace("-0.5", "0.5")
            .replace("context_window: 0", "context_window: 8"),
    )
    .unwrap();
    let (code, err) = check_config(&path);
    assert_eq!(code, Some(0), "{err}");
}

fn guarded_config(mock: &Mock) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
providers:
  oa:
    kind: openai_compatible
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
  an:
    kind: anthropic
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
routes:
  - models: [gpt-4o, llama3]
    targets: [ {{ provider: oa }} ]
  - models: ["claude-sonnet-4-5*"]
    targets: [ {{ provider: an }} ]
models:
  gpt-4o: {{ context_window: 500 }}
  "claude-sonnet-4-5*": {{ context_window: 300 }}
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

fn guarded_call(gw: &Gateway, model: &str, text: &str, max_tokens: u64) -> Resp {
    let anthropic = model.starts_with("claude");
    let (path, key) = if anthropic {
        ("/v1/messages", format!("x-api-key: {AGENT_KEY}"))
    } else {
        ("/v1/chat/completions", auth(AGENT_KEY))
    };
    let body = serde_json::json!({
        "model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string();
    curl(&[&gw.url(path), "-H", &key, "-d", &body])
}

#[test]
fn a_prompt_past_the_context_window_is_refused_before_it_goes_upstream() {
    let mock = Mock::start();
    let gw = Gateway::start(&guarded_config(&mock));
    // 600 words of "lorem " are 600 tokens in o200k_base: past 500 alone.
    let long = "lorem ".repeat(600);
    let r = guarded_call(&gw, "gpt-4o", &long, 10);
    r.assert_gateway_error(400, "context_window_exceeded");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("tokens, counted)"), "{msg}");
    assert!(msg.contains("window of 500 tokens"), "{msg}");
    // A short prompt whose output limit does not fit: refused as well.
    let short = "lorem ".repeat(50);
    guarded_call(&gw, "gpt-4o", &short, 460).assert_gateway_error(400, "context_window_exceeded");
    // Anthropic is estimated (4 bytes a token): 2,000 bytes of text are
    // about 500 tokens, past 300.
    let r = guarded_call(&gw, "claude-sonnet-4-5-20250929", &"abcd".repeat(500), 10);
    r.assert_gateway_error(400, "context_window_exceeded");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("tokens, estimated)"), "{msg}");
    assert!(mock.requests().is_empty(), "{:?}", mock.requests());

    // What fits goes: the same short prompt with room for its output, and
    // a model without a window in the catalog (not counted at all).
    assert_eq!(guarded_call(&gw, "gpt-4o", &short, 100).status, 200);
    assert_eq!(guarded_call(&gw, "llama3", &long, 10).status, 200);
    assert_eq!(
        guarded_call(&gw, "claude-sonnet-4-5", "hello", 100).status,
        200
    );
    assert_eq!(mock.requests().len(), 3);
}

#[test]
fn a_task_whose_prompt_fills_its_window_is_warned_then_stopped() {
    let mock = Mock::start();
    // Yellow at the default 80% of the window, red (stop) at 90%.
    let cfg = guarded_config(&mock)
        + "    watchdog: { red: { context_share: 0.9 }, action: stop }\n    loop_guard: { enabled: false }\n";
    let gw = Gateway::start(&cfg);
    let call = |words: usize, task: &str| {
        let body = serde_json::json!({
            "model": "gpt-4o", "max_tokens": 10,
            "messages": [{"role": "user", "content": "lorem ".repeat(words)}],
        })
        .to_string();
        let task = format!("x-agent-task-id: {task}");
        curl(&[
            &gw.url("/v1/chat/completions"),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            &task,
            "-d",
            &body,
        ])
    };
    // gpt-4o's window here is 500 tokens; "lorem " is one token a word,
    // plus 7 for the message and the reply's priming.
    let r = call(300, "t1");
    assert_eq!((r.status, r.header("x-loopgate-guard")), (200, None));
    let r = call(410, "t1");
    assert_eq!(
        (r.status, r.header("x-loopgate-guard")),
        (200, Some("warn"))
    );
    let r = call(460, "t1");
    r.assert_gateway_error(429, "task_stopped");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    // 460 words and the overhead are about 94% of 500.
    assert!(
        msg.contains("context window used 9") && msg.contains("% >= 90%"),
        "{msg}"
    );
    assert_eq!(mock.requests().len(), 2, "the stopped call never left");
    // Without a task id the watchdog does not watch: only the window
    // itself is enforced.
    let r = curl(&[
        &gw.url("/v1/chat/completions"),
        "-H",
        &auth(AGENT_KEY),
        "-d",
        &serde_json::json!({"model": "gpt-4o", "max_tokens": 10,
            "messages": [{"role": "user", "content": "lorem ".repeat(460)}]})
        .to_string(),
    ]);
    assert_eq!((r.status, r.header("x-loopgate-guard")), (200, None));
}

fn held_config(mock: &Mock, extra: &str, listen: &str) -> String {
    format!(
        r#"
listen: {listen}
threads: 2
{extra}
providers:
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
routes:
  - models: [gpt-4o]
    targets: [ {{ provider: oa }} ]
  - models: [claude-via-oa]
    targets: [ {{ provider: oa, model: gpt-4o }} ]
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

const PLAIN_LISTEN: &str = "127.0.0.1:{PORT}";

fn post_held(gw: &Gateway, path: &str, body: &str, extra: &[&str]) -> Resp {
    let key = if path == "/v1/messages" {
        format!("x-api-key: {AGENT_KEY}")
    } else {
        auth(AGENT_KEY)
    };
    let url = gw.url(path);
    let mut args = vec![url.as_str(), "-H", key.as_str()];
    args.extend(["-H", "x-mock-prompt-tokens: 1000"]);
    for x in extra {
        args.extend(["-H", x]);
    }
    curl_body(&args, body.as_bytes())
}

const SMALL: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;

/// A small gpt-4o call answered with 30 completion tokens: 200, with its
/// usage.
fn small_call(gw: &Gateway) -> Resp {
    let r = post_held(gw, "/v1/chat/completions", SMALL, &["x-mock-chunks: 30"]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 30);
    r
}

#[test]
fn held_answers_carry_their_cost_whatever_their_path() {
    let mock = Mock::start();
    let gw = Gateway::start(&held_config(&mock, "cost_header: true", PLAIN_LISTEN));
    // gpt-4o at 2.50 in / 10.00 out per million, 1,000 prompt tokens:
    // with 30 completion tokens 0.0025 + 0.0003.
    let r = small_call(&gw);
    assert_eq!(r.header("x-loopgate-cost-usd"), Some("0.0028"));

    // A body past Pingora's 64 KiB replay buffer takes the large-body
    // route: its answer is held the same way, and the body arrives whole.
    let big = serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "lorem ipsum ".repeat(20_000)}]})
    .to_string();
    assert!(big.len() > 200 * 1024);
    let r = post_held(&gw, "/v1/chat/completions", &big, &["x-mock-chunks: 7"]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-cost-usd"), Some("0.00257"));
    assert_eq!(mock.last_request()["body_len"], big.len());

    // An Anthropic-SDK call answered by the OpenAI-shaped provider: the
    // translated answer is priced as what answered it (gpt-4o).
    let msg =
        r#"{"model":"claude-via-oa","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_held(&gw, "/v1/messages", msg, &["x-mock-chunks: 12"]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message", "{}", r.text());
    assert_eq!(r.header("x-loopgate-cost-usd"), Some("0.00262"));

    // An upstream error reports no usage: relayed whole, with no cost.
    let r = post_held(&gw, "/v1/chat/completions", SMALL, &["x-mock-status: 500"]);
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.json()["error"].is_object(), "{}", r.text());
    assert_eq!(r.header("x-loopgate-cost-usd"), None);

    // An answer the provider breaks off halfway was never sent: the agent
    // gets the gateway's error whole, not a cut body under a 200.
    let r = post_held(
        &gw,
        "/v1/chat/completions",
        SMALL,
        &["x-mock-reset-after: 1"],
    );
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.json()["error"]["code"].is_string(), "{}", r.text());
    assert_eq!(r.header("x-loopgate-cost-usd"), None);

    // A streamed answer's usage comes last: no header, the stream as it
    // arrives.
    let stream = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_held(&gw, "/v1/chat/completions", stream, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-loopgate-cost-usd"), None);
    assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
}

#[test]
fn an_answer_the_memory_budget_cannot_hold_passes_whole_without_its_cost() {
    let mock = Mock::start();
    // 256 KiB for every body the gateway holds: a ~600 KB answer does not
    // fit, so it is released and relayed as it arrives.
    let listen = "{ address: \"127.0.0.1:{PORT}\", connections: { body_memory_bytes: 262144 } }";
    let gw = Gateway::start(&held_config(&mock, "cost_header: true", listen));
    let r = post_held(
        &gw,
        "/v1/chat/completions",
        SMALL,
        &["x-mock-chunks: 100000"],
    );
    assert_eq!(r.status, 200, "{}", &r.text()[..200.min(r.text().len())]);
    assert!(r.body.len() > 400 * 1024, "{}", r.body.len());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 100_000);
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .is_some_and(|t| t.starts_with("Hello from the")));
    assert_eq!(r.header("x-loopgate-cost-usd"), None);
    // The charge was given back: a small answer is held again.
    assert_eq!(
        small_call(&gw).header("x-loopgate-cost-usd"),
        Some("0.0028")
    );
}

#[test]
fn by_default_answers_are_relayed_as_they_arrive_without_their_cost() {
    let mock = Mock::start();
    let gw = Gateway::start(&held_config(&mock, "", PLAIN_LISTEN));
    assert_eq!(small_call(&gw).header("x-loopgate-cost-usd"), None);
}
