//! A real Prometheus scrapes a running gateway: `promtool check metrics`
//! accepts the exposition, the target is up and `loopgate_` series are
//! queryable. `.ci/run` installs Debian's `prometheus` package.

use loopgate_tests::*;
use std::io::Write;
use std::process::{Command, Stdio};

const EMPTY_CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[]}"#;

#[test]
fn promtool_accepts_the_metrics() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let _ = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], EMPTY_CHAT);
    let _ = curl(&[&gw.url("/v1/chat/completions"), "-d", "{}"]);
    let page = curl(&[&gw.admin_url("/metrics")]).body;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    child.stdin.take().unwrap().write_all(&page).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_real_prometheus_scrapes_the_gateway() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let _ = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], EMPTY_CHAT);
    let dir = scratch_dir("prom");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: loopgate\n    static_configs:\n      - targets: ['{}']\n",
            gw.admin
        ),
    )
    .unwrap();
    let (_prom, port) = serve_on_a_free_port("prometheus", |port| {
        Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (apt-get install prometheus)")
    });
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let up = eventually(60, || {
        try_curl(&[&format!("{api}/targets")]).is_some_and(|r| {
            r.status == 200 && r.json()["data"]["activeTargets"][0]["health"] == "up"
        })
    });
    assert!(up, "the gateway target never came up in Prometheus");
    let found = eventually(60, || {
        let r = curl(&[&format!("{api}/query?query=loopgate_requests_total")]);
        r.status == 200
            && r.json()["data"]["result"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
    });
    assert!(found, "no loopgate_requests_total series in Prometheus");
}

#[test]
fn the_shipped_prometheus_config_and_dashboard_are_valid() {
    let conf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("conf");
    let out = Command::new("promtool")
        .args(["check", "config"])
        .arg(conf.join("prometheus.yml"))
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let dash: serde_json::Value = serde_json::from_slice(
        &std::fs::read(conf.join("grafana/dashboards/loopgate.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string())
        })
        .collect();
    // Every metric the dashboard charts is one the gateway defines (some
    // only appear once their first event happened, so read the definitions).
    let defs =
        std::fs::read_to_string(conf.parent().unwrap().join("gateway/src/metrics.rs")).unwrap();
    for e in &exprs {
        let name = e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| w.starts_with("loopgate_"))
            .unwrap_or_else(|| panic!("no loopgate_ metric in {e}"));
        let base = name.trim_end_matches("_bucket");
        assert!(
            defs.contains(&format!("\"{base}\"")),
            "the dashboard charts {base}, which the gateway does not define"
        );
    }
}
