//! Operating the binary: the demo from any directory, and a file access
//! log that logrotate can move away (SIGUSR1 or the admin API) without
//! losing a line.

use loopgate_tests::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn chat(gw: &str, key: &str) -> Resp {
    curl(&[
        "-X",
        "POST",
        &format!("{gw}/v1/chat/completions"),
        "-H",
        &auth(key),
        "-H",
        "content-type: application/json",
        "--data-binary",
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#,
    ])
}

/// An installed binary carries its demo: `loopgate demo` works from a
/// directory with no `conf/` in it. (It listens where the demo config
/// says: 127.0.0.1:8080, admin 9091, mock 18081.)
#[test]
fn the_demo_runs_from_any_directory() {
    let cwd = scratch_dir("demo-cwd");
    let child = Command::new(bin())
        .arg("demo")
        .current_dir(&cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start loopgate demo");
    let _demo = Proc::from(child);
    assert!(
        eventually(20, || try_curl(&["http://127.0.0.1:9091/health"])
            .is_some_and(|r| r.status == 200)),
        "the demo's admin listener answers"
    );
    let r = chat("http://127.0.0.1:8080", "demo-agent-key");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("mock-openai"));
    assert!(!cwd.join("conf").exists());
}

/// logrotate moves the file away, then signals: lines before the signal
/// are in the old file, lines after in the new one, none lost.
#[test]
fn the_access_log_is_reopened_on_sigusr1_and_through_the_admin_api() {
    let mock = Mock::start();
    let dir = scratch_dir("log-reopen");
    let log = dir.join("access.log");
    let gw = Gateway::start(&format!(
        "{}\naccess_log: {{ path: \"{}\" }}\nadmin: {{ listen: \"127.0.0.1:{{ADMIN_PORT}}\", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}\n",
        default_config(&mock),
        log.display()
    ));
    let base = gw.url("");
    let lines = |p: &std::path::Path| std::fs::read_to_string(p).map_or(0, |t| t.lines().count());
    for _ in 0..3 {
        assert_eq!(chat(&base, AGENT_KEY).status, 200);
    }
    assert!(eventually(5, || lines(&log) == 3));

    // Rotated by SIGUSR1.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    assert_eq!(chat(&base, AGENT_KEY).status, 200); // still goes to the moved file
    assert!(eventually(5, || lines(&rotated) == 4));
    let killed = Command::new("kill")
        .args(["-USR1", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(eventually(5, || log.exists()), "a new file is opened");
    for _ in 0..2 {
        assert_eq!(chat(&base, AGENT_KEY).status, 200);
    }
    assert!(eventually(5, || lines(&log) == 2));
    assert_eq!(
        lines(&rotated),
        4,
        "nothing lost, nothing in the wrong file"
    );

    // Rotated through the admin API (token required).
    let rotated2 = dir.join("access.log.2");
    std::fs::rename(&log, &rotated2).unwrap();
    let url = gw.admin_url("/admin/access-log/reopen");
    assert_eq!(curl(&["-X", "POST", &url]).status, 401);
    let r = curl(&[
        "-X",
        "POST",
        &url,
        "-H",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
    ]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ok"], true);
    assert!(eventually(5, || log.exists()));
    assert_eq!(chat(&base, AGENT_KEY).status, 200);
    assert!(eventually(5, || lines(&log) == 1));
    assert_eq!(lines(&rotated2), 2);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(lines(&rotated) + lines(&rotated2) + lines(&log), 7);
}

#[test]
fn reopening_a_log_that_is_no_file_is_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&format!(
        "{}\naccess_log: {{ path: \"off\" }}\nadmin: {{ listen: \"127.0.0.1:{{ADMIN_PORT}}\", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}\n",
        default_config(&mock)
    ));
    let r = curl(&[
        "-X",
        "POST",
        &gw.admin_url("/admin/access-log/reopen"),
        "-H",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
    ]);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "not_a_file");
}
