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
    let mut demo = Proc::from(child);
    assert!(
        eventually(20, || try_curl(&["http://127.0.0.1:9091/health"])
            .is_some_and(|r| r.status == 200)),
        "the demo's admin listener answers"
    );
    let r = chat("http://127.0.0.1:8080", "demo-agent-key");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("mock-openai"));
    assert!(!cwd.join("conf").exists());
    // Ctrl-C removes the demo's temporary directory (issue 42: each run
    // left one behind).
    let pid = demo.id();
    let tmp = std::env::temp_dir().join(format!("loopgate-demo-{pid}"));
    assert!(tmp.join("demo.yaml").exists(), "{}", tmp.display());
    send_signal(pid, "INT");
    assert!(eventually(10, || demo
        .child()
        .try_wait()
        .is_ok_and(|s| s.is_some())));
    assert!(!tmp.exists(), "{} is left behind", tmp.display());
}

/// Sends `signal` (a name for `kill -s`) to process `pid`.
fn send_signal(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -s {signal} {pid}");
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
    send_signal(gw.pid(), "USR1");
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

/// The demo config, listening on free ports: `(yaml, gateway, admin, mock)`.
fn demo_on_free_ports() -> (String, u16, u16, u16) {
    let (gw, admin, mock) = (free_port(), free_port(), free_port());
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/demo.yaml"))
        .expect("conf/demo.yaml")
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{gw}"))
        .replace("127.0.0.1:9091", &format!("127.0.0.1:{admin}"))
        .replace("127.0.0.1:18081", &format!("127.0.0.1:{mock}"));
    (yaml, gw, admin, mock)
}

/// Waits for `child` to exit: its exit code, stdout and stderr, or `None`
/// when it still runs after `secs` (then it is killed).
fn exits_within(child: std::process::Child, secs: u64) -> Option<(Option<i32>, String, String)> {
    let mut proc = Proc::from(child);
    let child = proc.child();
    if !eventually(secs, || child.try_wait().is_ok_and(|s| s.is_some())) {
        return None;
    }
    let out = |r: Option<&mut dyn std::io::Read>| {
        let mut s = String::new();
        if let Some(r) = r {
            let _ = r.read_to_string(&mut s);
        }
        s
    };
    let code = child.try_wait().ok().flatten().and_then(|s| s.code());
    let stdout = out(child.stdout.as_mut().map(|o| o as &mut dyn std::io::Read));
    let stderr = out(child.stderr.as_mut().map(|e| e as &mut dyn std::io::Read));
    Some((code, stdout, stderr))
}

/// Issue 42: with a listen address taken, Pingora retried it for ~28 s,
/// then its listener threads panicked and the process stayed up serving
/// nothing (the demo's banner already printed). Both commands now check
/// every address first and exit 1 at once, naming it.
#[test]
fn a_busy_port_ends_run_and_demo_at_once_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = scratch_dir("busy");
    let (yaml, gw, admin, _) = demo_on_free_ports();
    let busy = format!("127.0.0.1:{port}");
    for (what, text) in [
        (
            "admin.listen",
            yaml.replace(&format!("127.0.0.1:{admin}"), &busy),
        ),
        ("listen", yaml.replace(&format!("127.0.0.1:{gw}"), &busy)),
    ] {
        let path = dir.join(format!("{}.yaml", what.replace('.', "-")));
        std::fs::write(&path, &text).unwrap();
        for cmd in ["run", "demo"] {
            let child = Command::new(bin())
                .args([cmd, "--config"])
                .arg(&path)
                .args(if cmd == "demo" {
                    vec!["--mock-listen", "127.0.0.1:0"]
                } else {
                    vec![]
                })
                .env("LOOPGATE_DEMO_UPSTREAM_KEY", "k")
                .env("LOOPGATE_ADMIN_TOKEN", "t")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let (code, stdout, stderr) = exits_within(child, 10)
                .unwrap_or_else(|| panic!("`loopgate {cmd}` still runs with {what} taken"));
            assert_eq!(code, Some(1), "{cmd} {what}: {stderr}");
            assert!(
                stderr.contains(&format!("{what}: cannot listen on 127.0.0.1:{port}")),
                "{cmd} {what}: {stderr}"
            );
            assert!(!stdout.contains("Loopgate demo"), "{cmd}: {stdout}");
            assert!(!stderr.contains("panicked"), "{cmd}: {stderr}");
        }
    }
    drop(taken);
}

/// Issue 42: the demo supplied its upstream key and admin token for its
/// first load only, so every reload of the file it says to edit failed
/// ("LOOPGATE_DEMO_UPSTREAM_KEY is not set"). An edit now takes effect,
/// as does the admin API's reload with the demo's token; with
/// `LOOPGATE_ADMIN_TOKEN` set the banner names the variable instead of a
/// token that would get 401.
#[test]
fn the_demos_config_reloads_with_its_own_secrets() {
    let (yaml, gw, admin, mock) = demo_on_free_ports();
    let path = scratch_dir("demo-reload").join("demo.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let child = Command::new(bin())
        .args(["demo", "--config"])
        .arg(&path)
        .args(["--mock-listen", &format!("127.0.0.1:{mock}")])
        .env_remove("LOOPGATE_DEMO_UPSTREAM_KEY")
        .env_remove("LOOPGATE_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start loopgate demo");
    let _demo = Proc::from(child);
    let gw = format!("http://127.0.0.1:{gw}");
    assert!(eventually(20, || try_curl(&[&format!(
        "http://127.0.0.1:{admin}/health"
    )])
    .is_some_and(|r| r.status == 200)));
    assert_eq!(chat(&gw, "demo-agent-key").status, 200);
    // Take gpt-4o-mini away from the demo agent: the edit reloads.
    let edited = yaml.replace(
        "models: [gpt-4o-mini, text-embedding-3-small,",
        "models: [text-embedding-3-small,",
    );
    assert_ne!(edited, yaml);
    std::fs::write(&path, edited).unwrap();
    assert!(
        eventually(10, || chat(&gw, "demo-agent-key").status == 403),
        "the edited demo config took effect"
    );
    let r = curl(&[
        "-X",
        "POST",
        &format!("http://127.0.0.1:{admin}/admin/reload"),
        "-H",
        "authorization: Bearer demo-admin-token",
    ]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ok"], true);

    // With the token in the environment, the banner names the variable.
    let (yaml, _, _, _) = demo_on_free_ports();
    let path = scratch_dir("demo-token").join("demo.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let mut child = Command::new(bin())
        .args(["demo", "--config"])
        .arg(&path)
        .args(["--mock-listen", "127.0.0.1:0"])
        .env("LOOPGATE_ADMIN_TOKEN", "my-own-token")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start loopgate demo");
    let mut banner = String::new();
    {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        for line in out.lines().map_while(Result::ok) {
            banner += &line;
            banner += "\n";
            if line.contains("Press Ctrl-C") {
                break;
            }
        }
    }
    drop(Proc::from(child));
    assert!(
        banner.contains(r#"-H "Authorization: Bearer $LOOPGATE_ADMIN_TOKEN""#),
        "{banner}"
    );
    assert!(!banner.contains("demo-admin-token") && !banner.contains("my-own-token"));
}

/// Issue 42: `loopgate check` passed an agent model that no route serves
/// (refused 404 `no route for model` at run time), printed a bad
/// `policy:` budget once per agent, followed a missing variable with a
/// misleading "no server" error, and worded unset variables two ways.
/// Each mistake is now one line, and only the mistake.
#[test]
fn loopgate_check_names_each_mistake_once_and_nothing_else() {
    let mock = Mock::start();
    let agent = |name: &str, models: &str| {
        format!(
            "  {name}:\n    key_sha256: \"{}\"\n    models: [{models}]\n",
            sha256_hex(name.as_bytes())
        )
    };
    let check = |yaml: &str| {
        let path = scratch_dir("check").join("gateway.yaml");
        std::fs::write(&path, yaml).unwrap();
        let (code, stderr) = check_config(&path);
        let file = path.display().to_string();
        let lines: Vec<String> = stderr
            .lines()
            .map(|l| l.replacen(&format!("{file}: "), "", 1))
            .collect();
        (code, lines)
    };
    let head = config_head(&mock, "gpt-4o-mini, \"text-embedding*\"", "").replace("{PORT}", "0");

    // Unrouted models, exact and wildcard; routed ones, and a wildcard
    // with a routed model under it, pass.
    let (code, lines) = check(&format!(
        "{head}agents:\n{}",
        agent(
            "a",
            "gpt-4o-mini, gpt-5, \"claude*\", \"text-embedding-3*\", \"gpt-4o*\""
        )
    ));
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        [
            "agents.a.models[1]: no route serves `gpt-5`: add it to a route's models or remove it (routed: gpt-4o-mini, text-embedding*)",
            "agents.a.models[2]: no route serves `claude*`: add it to a route's models or remove it (routed: gpt-4o-mini, text-embedding*)",
        ]
    );

    // A bad policy budget inherited by two agents, a bad team budget.
    let (code, lines) = check(&format!(
        "{head}agents:\n{}{}policy:\n  budgets: {{ daily_usd: -1 }}\nteams:\n  t: {{ daily_usd: -2 }}\n",
        agent("a", "gpt-4o-mini"),
        agent("b", "gpt-4o-mini")
    ));
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        [
            "teams.t.daily_usd: `-2` is not a budget: US dollars, more than 0 (at least $0.000001) and at most 1e12",
            "policy.budgets.daily_usd: `-1` is not a budget: US dollars, more than 0 (at least $0.000001) and at most 1e12",
        ]
    );

    // An MCP server whose key is unset, granted to an agent; an admin
    // token that is empty: one line each, worded alike.
    let (code, lines) = check(&format!(
        "{head}mcp_servers:\n  files: {{ url: \"{}/mcp\", auth: {{ bearer_env: LOOPGATE_TEST_UNSET_VAR }} }}\n\
         admin: {{ listen: 127.0.0.1:0, token_env: LOOPGATE_TEST_EMPTY_VAR }}\n\
         agents:\n{}    mcp_access:\n      files: {{ tools: [read_file] }}\n",
        mock.url(),
        agent("a", "gpt-4o-mini"),
    ));
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        [
            "admin.token_env: environment variable LOOPGATE_TEST_EMPTY_VAR is empty",
            "mcp_servers.files.auth.bearer_env: environment variable LOOPGATE_TEST_UNSET_VAR is not set",
        ]
    );
}

/// Issue 42: README said `loopgate check` prints the price catalog's date;
/// it did not. It prints it with its age, and warns (on stderr, still
/// exit 0) once the prices are more than 90 days old.
#[test]
fn loopgate_check_prints_the_price_catalogs_date_and_warns_when_stale() {
    let mock = Mock::start();
    let path = scratch_dir("check-prices").join("gateway.yaml");
    std::fs::write(&path, default_config(&mock).replace("{PORT}", "0")).unwrap();
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(&path)
        .env("LOOPGATE_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let catalog = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gateway/data/prices.yaml"
    ))
    .unwrap();
    let taken = catalog
        .lines()
        .find_map(|l| l.strip_prefix("taken:"))
        .map(|d| d.trim().trim_matches('"').to_string())
        .expect("the catalog's date");
    assert_eq!(stdout.lines().count(), 1, "one-line summary: {stdout}");
    let line = stdout.trim_end();
    let age: u64 = line
        .split_once(&format!(", prices taken {taken} ("))
        .and_then(|(_, rest)| rest.strip_suffix(" days ago)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let warned = stderr.contains(&format!(
        "warning: the built-in prices were taken {taken}, {age} days ago"
    ));
    assert_eq!(warned, age > 90, "{age} days: {stderr}");
}
