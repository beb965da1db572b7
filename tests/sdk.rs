//! The official OpenAI and Anthropic Python SDKs work against Loopgate with
//! only their base URL and key changed (`sdk/clients.py`). `.ci/run`
//! installs the SDKs; without them this test fails rather than skip.

use loopgate_tests::*;

#[test]
fn official_python_sdks_work_through_the_gateway() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let gw_url = format!("http://{}", gw.addr);
    run_sdk_script("clients.py", &[&gw_url, AGENT_KEY], "sdk ok");
    // The SDKs' requests reached the provider with the gateway's key only.
    let reqs = mock.requests();
    assert!(reqs.len() >= 6, "{}", reqs.len());
    for r in &reqs {
        assert!(!r["headers"].to_string().contains(AGENT_KEY), "{r}");
    }
}

/// Issue 41: the SDKs retry 409 and 429 by themselves after `Retry-After`
/// unless told `x-should-retry: false`, so a loop refusal they retried
/// let one repeat per cool-down reach the provider. Driven at default
/// settings, a looping task reaches the provider only for its two allowed
/// calls, under both SDKs; the repeat after the cool-down stops the task.
#[test]
fn a_looping_task_under_the_sdks_default_retries_reaches_the_provider_only_twice() {
    let mock = Mock::start();
    let gw = Gateway::start(&format!(
        "{}agents:\n  tester:\n    key_sha256: \"{}\"\n    models: [gpt-4o-mini, \"claude-3-5-haiku*\"]\n    loop_guard: {{ cooldown_ms: 1500 }}\n",
        config_head_with_anthropic(&mock, ""),
        sha256_hex(AGENT_KEY.as_bytes()),
    ));
    run_sdk_script(
        "loops.py",
        &[&format!("http://{}", gw.addr), AGENT_KEY, "1.5"],
        "loops ok",
    );
    let posts = |path: &str| {
        mock.requests()
            .iter()
            .filter(|r| r["method"] == "POST" && r["path"] == path)
            .count()
    };
    assert_eq!(posts("/v1/chat/completions"), 2, "openai SDK");
    assert_eq!(posts("/v1/messages"), 2, "anthropic SDK");
    // Each refusal was sent once: no SDK retried one.
    let denied = |code: &str| gw.metric(&format!(r#"loopgate_denials_total{{code="{code}"}}"#));
    assert_eq!(denied("loop_detected"), 2.0);
    assert_eq!(denied("task_stopped"), 4.0);
    assert_eq!(
        gw.metric(r#"loopgate_loop_trips_total{agent="tester"}"#),
        4.0
    );
}
