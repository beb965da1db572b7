//! Spend prediction: a task whose steps cost more each time (its context
//! grows) is warned, with its predicted spend, several steps before its
//! money budget stops it; a task whose steps cost the same and that fits
//! its budget is never warned. The mock reports the prompt tokens it is
//! told to (`x-mock-prompt-tokens`), so each step's cost is exact.

use loopgate_tests::*;

/// gpt-4o-mini at $1 per million input tokens and free output: a step
/// of `k` thousand prompt tokens costs $0.001 k. Each task may spend $0.02.
fn config(mock: &Mock, predict: &str) -> String {
    format!(
        r#"
{head}
models:
  gpt-4o-mini: {{ price: {{ input: 1, output: 0 }} }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    budgets: {{ task_usd: 0.02 }}
    loop_guard: {{ enabled: false }}
    watchdog: {{ action: stop, predict: {predict} }}
"#,
        head = config_head(mock, "gpt-4o-mini", ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

fn step(gw: &Gateway, task: &str, prompt_tokens: u64) -> Resp {
    let task = format!("x-agent-task-id: {task}");
    let tokens = format!("x-mock-prompt-tokens: {prompt_tokens}");
    let body =
        r#"{"model":"gpt-4o-mini","max_tokens":1,"messages":[{"role":"user","content":"go on"}]}"#;
    post_json(
        gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &["-H", &task, "-H", &tokens],
        body,
    )
}

#[test]
fn a_growing_task_is_warned_steps_before_its_budget_stops_it() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, "{ lookahead_steps: 5 }"));
    let mut warned = None;
    let mut stopped = None;
    for k in 1..=20u64 {
        // Step k sends k thousand prompt tokens: $0.001 k.
        let r = step(&gw, "grows", 1000 * k);
        if r.status == 402 {
            r.assert_gateway_error(402, "budget_exceeded");
            stopped = Some(k);
            break;
        }
        assert_eq!(r.status, 200, "step {k}: {}", r.text());
        let predicted = r.header("x-loopgate-predicted-usd");
        if k <= 3 {
            // Three steps make the first fit.
            assert_eq!(predicted, None, "step {k}");
        }
        if warned.is_none() && r.header("x-loopgate-guard") == Some("warn") {
            let usd: f64 = predicted
                .expect("a warned step says its prediction")
                .parse()
                .unwrap();
            assert!(usd > 0.02, "step {k}: predicted {usd}");
            warned = Some(k);
        }
    }
    let (w, s) = (
        warned.expect("warned"),
        stopped.expect("stopped by the budget"),
    );
    // Spent 0.001+0.002+0.003 after three steps; steps 4-8 would add 0.030:
    // warned at step 4. Steps 1-6 spend 0.021: step 7 is refused.
    assert_eq!((w, s), (4, 7));
    assert_eq!(
        gw.metric(r#"loopgate_predicted_overruns_total{agent="tester"}"#),
        3.0,
        "steps 4, 5 and 6 were predicted to overrun"
    );
}

#[test]
fn a_flat_task_within_its_budget_is_never_warned() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, "{ lookahead_steps: 5 }"));
    // Ten steps of $0.001: at most $0.015 predicted five steps ahead.
    for k in 1..=10 {
        let r = step(&gw, "flat", 1000);
        assert_eq!(
            (r.status, r.header("x-loopgate-guard")),
            (200, None),
            "step {k}"
        );
        if k > 3 {
            let usd: f64 = r
                .header("x-loopgate-predicted-usd")
                .unwrap()
                .parse()
                .unwrap();
            assert!(usd <= 0.015 + 1e-9, "step {k}: {usd}");
        }
    }
    assert_eq!(
        gw.metric_or_absent(r#"loopgate_predicted_overruns_total{agent="tester"}"#),
        None,
        "no overrun was ever predicted"
    );
}

#[test]
fn an_agent_that_acts_on_predictions_stops_the_task_before_the_budget_does() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, "{ lookahead_steps: 5, on_overrun: act }"));
    for k in 1..=3 {
        assert_eq!(step(&gw, "grows", 1000 * k).status, 200);
    }
    let r = step(&gw, "grows", 4000);
    r.assert_gateway_error(429, "task_stopped");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("predicted spend $0.0360 by step 8 > task budget $0.0200"),
        "{msg}"
    );
    assert!(msg.contains("runs out at step 6"), "{msg}");
    assert_eq!(mock.requests().len(), 3, "the stopped step never left");
}

#[test]
fn a_prediction_without_a_task_money_budget_is_a_config_error() {
    let mock = Mock::start();
    let dir = scratch_dir("forecast-check");
    let path = dir.join("predict.yaml");
    let yaml = config(&mock, "{ lookahead_steps: 0 }")
        .replace("    budgets: { task_usd: 0.02 }\n", "")
        .replace("{PORT}", "0");
    std::fs::write(&path, yaml).unwrap();
    let (code, err) = check_config(&path);
    assert_eq!(code, Some(1), "{err}");
    for want in [
        "predict.yaml: agents.tester.watchdog.predict: needs a task money budget",
        "predict.yaml: agents.tester.watchdog.predict.lookahead_steps: must be at least 1",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
}
