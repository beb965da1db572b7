//! Token accounting over the mock, as budgets see it: the prompt estimate
//! counts every token-bearing part of a body (keys of a tool schema, token
//! ids), prompt tokens settle with Anthropic's cache reads and writes
//! (budgets, `loopgate_tokens_total` and the access log alike), and
//! reservations and settlements saturate: an absurd `max_tokens` cannot
//! wrap a reservation, and absurd reported usage is clamped, so recorded
//! spend never goes backwards and `/admin/spend` keeps reading (memory and
//! Redis).

use loopgate_tests::*;
use serde_json::{json, Value};

/// Token budgets: `schema` a task of 5,000 tokens (a call without a task id
/// is its own task, refused with the reservation in the message).
const SCHEMA_KEY: &str = "tokens-schema-key-0001";
/// A day of 30,000 tokens each, on the Anthropic and the OpenAI route.
const CACHE_AN_KEY: &str = "tokens-cache-an-key-0002";
const CACHE_OA_KEY: &str = "tokens-cache-oa-key-0003";
/// A task budget of 1,000 tokens.
const TASK_KEY: &str = "tokens-task-key-0004";
/// A day of $0.01 (10,000 micro-dollars).
const MONEY_KEY: &str = "tokens-money-key-0005";

/// `priced` costs 1 micro-dollar a prompt token and 10 an output token.
fn config(mock: &Mock, dir: &std::path::Path, extra: &str) -> String {
    let agent = |name: &str, key: &str, models: &str, budgets: &str| {
        format!(
            "  {name}:\n    key_sha256: \"{}\"\n    models: [{models}]\n    \
             loop_guard: {{ enabled: false }}\n    budgets: {{ {budgets} }}\n",
            sha256_hex(key.as_bytes())
        )
    };
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}
threads: 2
access_log: {{ path: "{log}" }}
providers:
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
routes:
  - models: [priced, embed-priced]
    targets: [ {{ provider: oa }} ]
  - models: [claude-priced]
    targets: [ {{ provider: an }} ]
models:
  priced: {{ price: {{ input: 1, output: 10 }} }}
  embed-priced: {{ price: {{ input: 1, output: 0 }} }}
  claude-priced: {{ price: {{ input: 1, output: 10 }} }}
agents:
{schema}{cache_an}{cache_oa}{task}{money}{extra}
"#,
        log = dir.join("access.log").display(),
        mock = mock.url(),
        schema = agent(
            "schema",
            SCHEMA_KEY,
            "priced, embed-priced",
            "task_tokens: 5000, default_max_tokens: 10"
        ),
        cache_an = agent(
            "cache-an",
            CACHE_AN_KEY,
            "claude-priced",
            "daily_tokens: 30000"
        ),
        cache_oa = agent("cache-oa", CACHE_OA_KEY, "priced", "daily_tokens: 30000"),
        task = agent("task", TASK_KEY, "priced", "task_tokens: 1000"),
        money = agent(
            "money",
            MONEY_KEY,
            "priced, embed-priced",
            "daily_usd: 0.01, default_max_tokens: 10"
        ),
    )
}

fn start(mock: &Mock, extra: &str) -> (Gateway, std::path::PathBuf) {
    let dir = scratch_dir("tokens");
    let gw = Gateway::start_with_env(
        &config(mock, &dir, extra),
        &[("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    (gw, dir)
}

/// The reservation a token budget's refusal names ("this request reserves
/// N tokens").
fn reserved_tokens(r: &Resp) -> u64 {
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    let n = msg
        .split("reserves ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or_else(|| panic!("no reservation in {msg}"));
    n.parse().unwrap_or_else(|_| panic!("{msg}"))
}

/// A chat call whose one tool's JSON schema has `keys` properties named by
/// SHA-256 digests (64 hex characters each), each `{}`: nearly all of its
/// text is keys.
fn schema_call(keys: usize) -> String {
    let props: serde_json::Map<String, Value> = (0..keys)
        .map(|i| (sha256_hex(format!("property-{i}").as_bytes()), json!({})))
        .collect();
    json!({
        "model": "priced", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "lookup",
            "parameters": {"type": "object", "properties": props}}}],
    })
    .to_string()
}

/// Item 3 of issue 41: a 40 KB tool schema of 560 hashed property keys was
/// estimated at 6 tokens, the keys counting as nothing.
#[test]
fn a_tool_schemas_keys_count_toward_the_prompt_estimate() {
    let mock = Mock::start();
    let (gw, _dir) = start(&mock, "");
    let body = schema_call(560);
    assert!(body.len() > 39_000, "{}", body.len());
    let before = mock.received();
    let r = post_json(&gw, SCHEMA_KEY, "/v1/chat/completions", &[], &body);
    println!("560 keys: {r:?}");
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(mock.received(), before, "nothing went upstream");
    // 560 keys of 64 bytes are 11,947 tokens at 3 bytes a token (hex is
    // about 2 bytes a token), plus the schema's other keys and text and
    // the 10 output tokens; never more than the body's bytes (a token
    // covers at least one).
    let reserved = reserved_tokens(&r);
    assert!(reserved > 11_947 + 10, "{reserved}");
    assert!(reserved < body.len() as u64, "{reserved}");
    // A schema of 100 such keys (~2,150 tokens) fits the 5,000.
    let r = post_json(
        &gw,
        SCHEMA_KEY,
        "/v1/chat/completions",
        &[],
        schema_call(100),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// A body of token ids: `input` as one array of `n` ids, or as `n / 2`
/// ids in each of two arrays.
fn token_ids(model: &str, n: usize, nested: bool) -> String {
    let ids: Vec<u64> = (0..n as u64).map(|i| 1000 + i % 90_000).collect();
    let input = if nested {
        json!([ids[..n / 2], ids[n / 2..]])
    } else {
        json!(ids)
    };
    json!({"model": model, "input": input}).to_string()
}

/// Item 3 of issue 41: an embeddings call of 80,000 token ids was admitted
/// under a one-micro-dollar budget (its ids counting as nothing) and then
/// settled at $0.12.
#[test]
fn token_ids_count_one_token_each_for_money_and_token_budgets() {
    let mock = Mock::start();
    let (gw, _dir) = start(&mock, "");
    let before = mock.received();
    // Money: 80,000 tokens at $1 per million is 80,000 micro-dollars,
    // past the day's 10,000 (embeddings reserve no output).
    let r = post_json(
        &gw,
        MONEY_KEY,
        "/v1/embeddings",
        &[],
        token_ids("embed-priced", 80_000, false),
    );
    println!(
        "80,000 ids: {} {}",
        r.status,
        r.header("content-length").unwrap_or("-")
    );
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(r.json()["error"]["budget"]["reserved_usd"], 0.08, "{r:?}");
    // Tokens: two arrays of 40,000 ids sum, plus the default output of 10.
    let r = post_json(
        &gw,
        SCHEMA_KEY,
        "/v1/embeddings",
        &[],
        token_ids("embed-priced", 80_000, true),
    );
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(reserved_tokens(&r), 80_010, "{r:?}");
    assert_eq!(mock.received(), before, "nothing went upstream");
    // 4,000 ids fit the 5,000 tokens.
    let r = post_json(
        &gw,
        SCHEMA_KEY,
        "/v1/embeddings",
        &[],
        token_ids("embed-priced", 4_000, false),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// Item 5 of issue 41: Anthropic reports cache reads and writes beside
/// `input_tokens`; a token budget settled on `input_tokens` alone let six
/// 10,000-token prompts through a 30,000-token day.
#[test]
fn anthropic_cache_reads_and_writes_count_as_prompt_tokens() {
    let mock = Mock::start();
    let (gw, dir) = start(&mock, "");
    let claude =
        r#"{"model":"claude-priced","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let openai =
        r#"{"model":"priced","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    // The first call writes its 10,000-token prompt to the cache, the
    // others read it; each writes one output token. 10,001 tokens a call:
    // three fit the day's 30,000, and the fourth's reservation does not.
    let six = |key: &str, path: &str, body: &str, cache: &[&str; 2]| -> Vec<u16> {
        let before = mock.received();
        let statuses: Vec<u16> = (0..6)
            .map(|i| {
                let cached = if i == 0 { cache[0] } else { cache[1] };
                let args = [
                    "-H",
                    "x-mock-prompt-tokens: 10000",
                    "-H",
                    cached,
                    "-H",
                    "x-mock-chunks: 1",
                ];
                post_json(&gw, key, path, &args, body).status
            })
            .collect();
        assert_eq!(mock.received() - before, 3, "the provider saw three");
        statuses
    };
    let refused_after_three = vec![200, 200, 200, 402, 402, 402];
    let anthropic = [
        "x-mock-cache-write-tokens: 10000",
        "x-mock-cached-tokens: 10000",
    ];
    let statuses = six(CACHE_AN_KEY, "/v1/messages", claude, &anthropic);
    assert_eq!(statuses, refused_after_three, "anthropic");
    // The same on an OpenAI route, whose `prompt_tokens` hold the cached.
    let oa = ["x-mock-cached-tokens: 0", "x-mock-cached-tokens: 10000"];
    let statuses = six(CACHE_OA_KEY, "/v1/chat/completions", openai, &oa);
    assert_eq!(statuses, refused_after_three, "openai");
    // The metric and the access log count the prompt the same way.
    let prompt = |agent: &str, model: &str| {
        gw.metric(&format!(
            r#"loopgate_tokens_total{{agent="{agent}",kind="prompt",model="{model}"}}"#
        ))
    };
    assert_eq!(prompt("cache-an", "claude-priced"), 30_000.0);
    assert_eq!(prompt("cache-oa", "priced"), 30_000.0);
    let path = dir.join("access.log");
    let logged = || -> Vec<Value> {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["status"] == 200)
            .collect()
    };
    assert!(eventually(5, || logged().len() == 6));
    for line in logged() {
        assert_eq!(line["prompt_tokens"], 10_000, "{line}");
        assert_eq!(line["completion_tokens"], 1, "{line}");
    }
}

const HUGE: &str = "18446744073709551615";

/// Item 6 of issue 41: `max_tokens` 2^64-1 under a 1,000-token task budget
/// wrapped the reservation and was admitted.
#[test]
fn an_absurd_max_tokens_cannot_wrap_a_reservation() {
    let mock = Mock::start();
    let (gw, _dir) = start(&mock, "");
    let body = format!(
        r#"{{"model":"priced","max_tokens":{HUGE},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let before = mock.received();
    for task in [None, Some("x-agent-task-id: t-huge")] {
        let args: Vec<&str> = task.iter().flat_map(|h| ["-H", *h]).collect();
        let r = post_json(&gw, TASK_KEY, "/v1/chat/completions", &args, &body);
        println!("max_tokens 2^64-1 ({task:?}): {r:?}");
        r.assert_gateway_error(402, "budget_exceeded");
        assert_eq!(reserved_tokens(&r), u64::MAX, "{r:?}");
    }
    assert_eq!(mock.received(), before, "nothing went upstream");
}

fn admin_spend(gw: &Gateway) -> Resp {
    let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
    curl(&[&gw.admin_url("/admin/spend"), "-H", &auth])
}

/// `agent`'s spend today, in dollars, as `/admin/spend` reads it.
fn spent_today(gw: &Gateway, agent: &str) -> f64 {
    let r = admin_spend(gw);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == agent)
        .unwrap_or_else(|| panic!("no {agent} in {v}"))["day"]["spent_usd"]
        .as_f64()
        .unwrap()
}

/// A call of the money agent; the mock reports `prompt` prompt tokens and
/// `completion` output tokens.
fn priced_call(gw: &Gateway, prompt: &str, completion: &str) -> Resp {
    let p = format!("x-mock-prompt-tokens: {prompt}");
    let c = format!("x-mock-completion-tokens: {completion}");
    let body = r#"{"model":"priced","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    post_json(
        gw,
        MONEY_KEY,
        "/v1/chat/completions",
        &["-H", &p, "-H", &c],
        body,
    )
}

/// Spend 5,000 micro-dollars, then have the provider report 2^64-1 output
/// tokens: the usage is clamped to 100 million tokens (1,000,000,001
/// micro-dollars with the prompt token), the day's spend goes up by that,
/// never down, and `/admin/spend` still reads.
fn absurd_usage_is_clamped_and_spend_never_goes_back(gw: &Gateway) {
    assert_eq!(priced_call(gw, "1000", "400").status, 200);
    assert_eq!(spent_today(gw, "money"), 0.005);
    let r = priced_call(gw, "1", HUGE);
    assert_eq!(r.status, 200, "{r:?}");
    let spent = spent_today(gw, "money");
    println!("spent after 2^64-1 output tokens: ${spent}");
    assert_eq!(spent, 1000.005001);
    // The day is spent: the next call is refused, and the spend read again
    // is the same.
    priced_call(gw, "1", "1").assert_gateway_error(402, "budget_exceeded");
    assert_eq!(spent_today(gw, "money"), 1000.005001);
}

/// Item 6 of issue 41, the memory store: the recorded spend went down
/// (5,000 to 4,999 micro-dollars).
#[test]
fn absurd_reported_usage_is_clamped_in_memory() {
    let mock = Mock::start();
    let (gw, _dir) = start(&mock, "");
    absurd_usage_is_clamped_and_spend_never_goes_back(&gw);
}

/// Item 6 of issue 41, on Redis: the settle wrote a number Redis cannot
/// add to ("hash value is not an integer"), and `GET /admin/spend` failed
/// for every agent.
#[test]
fn absurd_reported_usage_is_clamped_on_redis() {
    let mock = Mock::start();
    let redis = Redis::start();
    let state = format!(
        "state: {{ backend: redis, url: \"{}\", key_prefix: \"lgt:\", timeout_ms: 500 }}",
        redis.url()
    );
    let (gw, _dir) = start(&mock, &state);
    absurd_usage_is_clamped_and_spend_never_goes_back(&gw);
    // Every window still takes and settles: another agent's day too.
    let r = post_json(
        &gw,
        CACHE_OA_KEY,
        "/v1/chat/completions",
        &["-H", "x-mock-prompt-tokens: 5", "-H", "x-mock-chunks: 1"],
        r#"{"model":"priced","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
}
