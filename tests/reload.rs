//! Hot reload: a new agent takes effect without a restart; a broken file
//! changes nothing; SIGHUP reloads; limit counters survive a reload.

use loopgate_tests::*;
use std::process::Command;

const NEW_KEY: &str = "new-agent-key-0009";

fn config(mock: &Mock, extra_agent: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}" }}
threads: 1
{providers}
agents:
  tester:
    key_sha256: "{tester}"
    models: [gpt-4o-mini]
    requests_per_minute: 3
{extra_agent}"#,
        providers = oa_provider(mock, "gpt-4o-mini", ""),
        tester = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

/// Rewrites the running config (same ports) and returns the new text.
fn rewrite(gw: &Gateway, f: impl Fn(&str) -> String) {
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(&gw.config_path, f(&text)).unwrap();
}

fn chat(gw: &Gateway, key: &str) -> u16 {
    let body = r#"{"model":"gpt-4o-mini","messages":[]}"#;
    post_json(gw, key, "/v1/chat/completions", &[], body).status
}

#[test]
fn reload_adds_an_agent_and_a_broken_file_keeps_the_old_config() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    assert_eq!(chat(&gw, AGENT_KEY), 200);
    assert_eq!(chat(&gw, NEW_KEY), 401);

    let new_agent = format!(
        "  newbie:\n    key_sha256: \"{}\"\n    models: [gpt-4o-mini]\n",
        sha256_hex(NEW_KEY.as_bytes())
    );
    rewrite(&gw, |t| format!("{t}{new_agent}"));
    assert!(
        eventually(10, || chat(&gw, NEW_KEY) == 200),
        "the file watch did not pick up the new agent"
    );
    // Counters survived: tester used 1 of 3 before the reload.
    assert_eq!(chat(&gw, AGENT_KEY), 200);
    assert_eq!(chat(&gw, AGENT_KEY), 200);
    assert_eq!(
        chat(&gw, AGENT_KEY),
        429,
        "the rate-limit window was reset by the reload"
    );

    let ok_before = gw.metric(r#"loopgate_config_reloads_total{result="ok"}"#);
    rewrite(&gw, |t| {
        t.replace(
            "models: [gpt-4o-mini]\n    requests",
            "modelz: [gpt-4o-mini]\n    requests",
        )
    });
    // The first failed reload is what creates the sample.
    assert!(eventually(10, || gw
        .metric_or_absent(r#"loopgate_config_reloads_total{result="error"}"#)
        .is_some_and(|n| n >= 1.0)));
    // Both agents still work exactly as before.
    assert_eq!(chat(&gw, NEW_KEY), 200);
    assert_eq!(chat(&gw, AGENT_KEY), 429);
    assert_eq!(
        gw.metric(r#"loopgate_config_reloads_total{result="ok"}"#),
        ok_before
    );
}

#[test]
fn sighup_reloads() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    // No reload yet: the sample appears with the first.
    let before = gw.metric_or_absent(r#"loopgate_config_reloads_total{result="ok"}"#);
    assert_eq!(before, None, "a reload before any was asked for");
    let status = Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(eventually(10, || gw.metric_or_absent(
        r#"loopgate_config_reloads_total{result="ok"}"#
    ) == Some(1.0)));
    assert_eq!(chat(&gw, AGENT_KEY), 200, "still serving after SIGHUP");
}
