//! The command line: `check`, `hash-key`, and every file in `conf/`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn loopgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loopgate"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn scratch(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loopgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

/// Environment variables that configs in conf/ name for secrets.
const KEY_VARS: [&str; 4] = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "LOOPGATE_DEMO_UPSTREAM_KEY",
    "LOOPGATE_ADMIN_TOKEN",
];

#[test]
fn every_file_in_conf_is_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(repo().join("conf")).unwrap() {
        let path = entry.unwrap().path();
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            continue;
        }
        // Prometheus's own config; tests/prometheus.rs checks it with promtool.
        if path.file_name().is_some_and(|n| n == "prometheus.yml") {
            continue;
        }
        let mut cmd = loopgate();
        cmd.arg("check").arg("--config").arg(&path);
        for v in KEY_VARS {
            cmd.env(v, "placeholder-key");
        }
        // conf/compose.yaml shares state through Redis.
        cmd.env("LOOPGATE_REDIS_URL", "redis://127.0.0.1:6379/0");
        let out = cmd.output().unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{}: {stderr}", path.display());
        assert!(stdout.contains(": ok: "), "{stdout}");
        assert_eq!(stdout.lines().count(), 1, "one-line summary: {stdout}");
        n += 1;
    }
    assert!(n >= 2, "conf/ should hold gateway.yaml and demo.yaml");
}

#[test]
fn a_missing_provider_key_names_the_variable() {
    let out = loopgate()
        .args(["check", "--config"])
        .arg(repo().join("conf/gateway.yaml"))
        .env_remove("OPENAI_API_KEY")
        .env("ANTHROPIC_API_KEY", "x")
        .env("LOOPGATE_ADMIN_TOKEN", "x")
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("conf/gateway.yaml: providers.openai.api_key_env: environment variable OPENAI_API_KEY is not set"),
        "{stderr}"
    );
}

#[test]
fn check_reports_every_error_with_file_and_field() {
    let p = scratch(
        "bad.yaml",
        r#"
listen: "127.0.0.1:99999"
providers:
  p: { kind: openai_compatible, base_url: "127.0.0.1:1" }
routes:
  - models: [m]
    targets: [ { provider: q } ]
agents:
  a: { key_sha256: "nothex", models: [m] }
"#,
    );
    let out = loopgate()
        .args(["check", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    let file = p.display().to_string();
    for want in [
        format!("{file}: listen: "),
        format!("{file}: providers.p.base_url: "),
        format!("{file}: routes[0].targets[0].provider: unknown provider `q`"),
        format!("{file}: agents.a.key_sha256: must be 64 hex digits"),
    ] {
        assert!(stderr.contains(&want), "missing {want:?} in:\n{stderr}");
    }
    assert_eq!(stderr.lines().count(), 4, "{stderr}");
}

#[test]
fn unknown_fields_and_syntax_errors_are_located() {
    let p = scratch(
        "typo.yaml",
        "listen: 127.0.0.1:1\nproviders: {}\nagentz: {}\n",
    );
    let out = loopgate()
        .args(["check", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown field `agentz`"), "{stderr}");
    assert!(stderr.starts_with(&p.display().to_string()), "{stderr}");

    let p = scratch("syntax.yaml", "listen: [\n");
    let out = loopgate()
        .args(["check", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.starts_with(&p.display().to_string()));

    let out = loopgate()
        .args(["check", "--config", "/nonexistent/loopgate.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out)
        .1
        .contains("/nonexistent/loopgate.yaml: (top level): cannot read file"));
}

#[test]
fn run_refuses_a_bad_config_without_starting() {
    let p = scratch("run-bad.yaml", "listen: nope\nproviders: {}\n");
    let out = loopgate()
        .args(["run", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out)
        .1
        .contains("listen: `nope` is not an IP:port address"));
}

#[test]
fn hash_key_prints_the_sha256_of_stdin() {
    for (input, want) in [
        (
            &b"abc"[..],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
        (
            b"abc\n",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
        (
            b"abc\r\n",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
    ] {
        let mut child = loopgate()
            .arg("hash-key")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(text(&out).0.trim(), want);
    }
    let out = loopgate()
        .arg("hash-key")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "an empty key is refused");
}
