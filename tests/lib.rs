//! Helpers for Loopgate's end-to-end tests: start the real `loopgate`
//! binary (gateway and mock provider) on loopback ports and talk to them with
//! real clients (curl, the official SDKs).
//!
//! Every test gets its own mock and gateway on fresh ports, so tests run in
//! parallel and never depend on each other.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The agent key the test configs accept for agent `tester`.
pub const AGENT_KEY: &str = "test-agent-key-0001";
/// The narrow agent: `/v1/chat/completions` and model `gpt-4o` only.
pub const NARROW_KEY: &str = "test-narrow-key-0002";
/// The provider credential the gateway injects.
pub const UPSTREAM_KEY: &str = "sk-upstream-secret-42";
/// A tool credential, for configs with `value_env: LOOPGATE_TEST_TOOL_KEY`.
pub const TOOL_KEY: &str = "tool-secret-9911";
/// A provider key no HTTP header can carry (a control byte), in
/// `LOOPGATE_TEST_BAD_KEY`: configs naming it must be refused at load.
pub const BAD_KEY: &str = "sk-bad\u{1}secret-31";
/// The admin token, for configs with `token_env: LOOPGATE_TEST_ADMIN_TOKEN`.
pub const ADMIN_TOKEN: &str = "adm-token-secret-77";
/// `policy.max_body_bytes` in [`Gateway::start_default`].
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// The `loopgate` binary of the current build profile: beside the
/// running executable (a bench binary in `target/<profile>/`) or one up
/// (a test binary in `target/<profile>/deps/`).
pub fn bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let name = format!("loopgate{}", std::env::consts::EXE_SUFFIX);
    let dir = exe.parent().expect("target dir");
    let bin = [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(&name))
        .find(|b| b.exists());
    bin.unwrap_or_else(|| {
        panic!(
            "{name} not found beside {}: build it first (cargo test --workspace builds it)",
            exe.display()
        )
    })
}

/// What `loopgate check --config <path>` says of a config file (with the
/// test secrets in its environment): its exit code and its stderr.
pub fn check_config(path: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(path)
        .env("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("LOOPGATE_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
        .env("LOOPGATE_TEST_EMPTY_VAR", "")
        .env_remove("LOOPGATE_TEST_UNSET_VAR")
        .output()
        .expect("run loopgate check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The Python interpreter the tests run: `$PYTHON`, else the pinned
/// environment `tests/setup-python.sh` creates (`<repo>/.venv-tests`, the
/// packages and versions in `tests/requirements.txt`), else `python3`.
/// The pinned environment first, so the packages installed system-wide
/// (e.g. a newer `mcp` from `pip install mcp`) cannot change what the
/// tests run against.
pub fn python() -> PathBuf {
    python_from("PYTHON", ".venv-tests")
}

/// The Python with the 1.x `mcp` SDK (`tests/requirements-mcp1.txt`), for
/// the one test that keeps that SDK working: `$PYTHON_MCP1`, else
/// `<repo>/.venv-tests-mcp1` (also made by `tests/setup-python.sh`), else
/// `python3`.
pub fn python_mcp1() -> PathBuf {
    python_from("PYTHON_MCP1", ".venv-tests-mcp1")
}

fn python_from(var: &str, venv: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(venv)
        .join("bin")
        .join("python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Runs the official-SDK script `tests/sdk/{name}` with [`python`] and
/// `args`; it must exit 0 and print `done`. Its output.
/// `tests/setup-python.sh` installs the SDKs; without them the test fails,
/// not skips.
pub fn run_sdk_script(name: &str, args: &[&str], done: &str) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sdk")
        .join(name);
    let python = python();
    let out = Command::new(&python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(done),
        "SDK script {name} failed with {} (run tests/setup-python.sh)\nstdout:\n{stdout}\nstderr:\n{stderr}",
        python.display()
    );
    stdout
}

/// A fresh scratch directory under the system temp dir. Named for the
/// process, a counter and the time: process ids wrap (every curl is a
/// process), and a gateway left running by an interrupted run polls its
/// config file for changes, so a later test must never write to its path.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "loopgate-test-{}-{}-{}-{nanos}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A child process killed when dropped.
pub struct Proc(Child);

impl From<Child> for Proc {
    fn from(c: Child) -> Proc {
        Proc(c)
    }
}

impl Proc {
    /// The process, to wait on or read its output.
    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The mock provider (`loopgate mock`) on a kernel-chosen port.
pub struct Mock {
    pub addr: SocketAddr,
    /// Connections this harness opened to the mock's own `/_mock/*`
    /// endpoints, so [`Mock::connections`] can tell the gateway's apart.
    control: AtomicU64,
    _proc: Proc,
}

impl Mock {
    pub fn start() -> Mock {
        Mock::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Mock {
        let mut child = Command::new(bin())
            .args(["mock", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start loopgate mock");
        let stdout = child.stdout.take().expect("mock stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read mock address");
        let addr = line
            .trim()
            .strip_prefix("mock listening on ")
            .unwrap_or_else(|| panic!("unexpected mock output: {line:?}"))
            .parse()
            .expect("mock address");
        Mock {
            addr,
            control: AtomicU64::new(0),
            _proc: Proc(child),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One of the mock's own endpoints (`/_mock/...`), on a connection
    /// of its own that [`Mock::connections`] leaves out.
    fn control(&self, path: &str) -> Value {
        self.control.fetch_add(1, Ordering::SeqCst);
        let r = curl(&[&format!("{}{path}", self.url())]);
        assert_eq!(r.status, 200, "mock {path}: {}", r.text());
        r.json()
    }

    /// Every request the mock received, oldest first (read whole: the
    /// mock records a request once it has its header and its whole body).
    /// An answer without the list fails: it is not an empty list.
    pub fn requests(&self) -> Vec<Value> {
        let v = self.control("/_mock/requests");
        match v.get("requests") {
            Some(Value::Array(a)) => a.clone(),
            _ => panic!("the mock's /_mock/requests has no `requests` list: {v}"),
        }
    }

    /// Connections anything but this harness opened to the mock: the
    /// gateway's. Unlike [`Mock::requests`] it counts a request forwarded
    /// with framing the mock could not parse or a body that never ended,
    /// so "nothing reached the upstream" is this staying where it was
    /// (with no idle pooled connection the gateway could reuse).
    pub fn connections(&self) -> u64 {
        self.stat("connections")
    }

    /// Request heads anything but this harness sent the mock, counted when
    /// the mock has read the head, before the body: a request forwarded
    /// with a body that never ended counts here, pooled connection or not.
    pub fn heads(&self) -> u64 {
        self.stat("heads")
    }

    /// One `/_mock/stats` count, less the harness's own connections (each
    /// carries one request).
    fn stat(&self, name: &str) -> u64 {
        let v = self.control("/_mock/stats");
        let all = v[name]
            .as_u64()
            .unwrap_or_else(|| panic!("the mock's /_mock/stats has no `{name}` count: {v}"));
        let ours = self.control.load(Ordering::SeqCst);
        all.checked_sub(ours).unwrap_or_else(|| {
            panic!("the mock counted {name} {all}, the harness made {ours}: {v}")
        })
    }

    /// How many requests the mock recorded (its own `/_mock/*` endpoints
    /// are not recorded): [`Mock::requests`]`.len()` without the bodies.
    pub fn received(&self) -> u64 {
        let v = self.control("/_mock/stats");
        v["requests"]
            .as_u64()
            .unwrap_or_else(|| panic!("the mock's /_mock/stats has no `requests` count: {v}"))
    }

    pub fn last_request(&self) -> Value {
        self.requests().pop().expect("the mock received a request")
    }

    /// The mock MCP server's own streams (`GET /mcp`): how many are open
    /// now (until the mock sees the client close), and how many were
    /// opened in all.
    pub fn mcp_streams(&self) -> (u64, u64) {
        let v = self.control("/_mock/stats");
        let n = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("the mock's /_mock/stats has no `{k}`: {v}"))
        };
        (n("mcp_streams_open"), n("mcp_streams_opened"))
    }
}

/// Header value of a recorded mock request (first match, case-insensitive).
pub fn recorded_header<'a>(req: &'a Value, name: &str) -> Option<&'a str> {
    req["headers"].as_array()?.iter().find_map(|h| {
        (h[0].as_str()?.eq_ignore_ascii_case(name))
            .then(|| h[1].as_str())
            .flatten()
    })
}

/// SHA-256 hex, as the mock records bodies.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// The standard test config, pointing both providers at `mock`.
pub fn default_config(mock: &Mock) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
providers:
  oa:
    kind: openai_compatible
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
    timeouts: {{ connect_ms: 1000, read_ms: 5000, total_ms: 20000 }}
  an:
    kind: anthropic
    base_url: {mock}
    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY
routes:
  - models: [gpt-4o, gpt-4o-mini, text-embedding-3-small]
    targets: [ {{ provider: oa }} ]
  - models: ["claude-3-5-haiku*"]
    targets: [ {{ provider: an }} ]
# Transport tests send filler bodies (megabytes) far past the model's real
# context window; the window guard has tests of its own (prices.rs).
models:
  gpt-4o-mini: {{ context_window: 1000000000 }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini, text-embedding-3-small, "claude-3-5-haiku*"]
  narrow:
    key_sha256: "{narrow}"
    models: [gpt-4o]
    paths: [/v1/chat/completions]
policy:
  max_body_bytes: {max_body}
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        narrow = sha256_hex(NARROW_KEY.as_bytes()),
        max_body = MAX_BODY,
    )
}

/// The head of most test configs: `listen` on `{PORT}`, `threads: 2`, and
/// [`oa_provider`]'s providers and routes.
pub fn config_head(mock: &Mock, models: &str, oa_settings: &str) -> String {
    format!("{LISTEN}{}", oa_provider(mock, models, oa_settings))
}

/// As [`config_head`], with [`oa_an_providers`]'s providers and routes.
pub fn config_head_with_anthropic(mock: &Mock, oa_settings: &str) -> String {
    format!("{LISTEN}{}", oa_an_providers(mock, oa_settings))
}

const LISTEN: &str = "listen: 127.0.0.1:{PORT}\nthreads: 2\n";

/// The `providers:` and `routes:` of a test config with one provider, `oa`
/// (OpenAI-compatible, at `mock`, with the upstream key), serving `models`
/// (a YAML list's items, e.g. `gpt-4o-mini`). `oa_settings` adds settings
/// to `oa` in flow style (e.g. `breaker: { consecutive_failures: 1 }`),
/// empty for none.
pub fn oa_provider(mock: &Mock, models: &str, oa_settings: &str) -> String {
    providers(mock, models, oa_settings, false)
}

/// As [`oa_provider`] serving `gpt-4o-mini`, and provider `an`
/// (Anthropic, at `mock`, with the upstream key) serving
/// `claude-3-5-haiku*`.
pub fn oa_an_providers(mock: &Mock, oa_settings: &str) -> String {
    providers(mock, "gpt-4o-mini", oa_settings, true)
}

fn providers(mock: &Mock, models: &str, oa_settings: &str, anthropic: bool) -> String {
    let mock = mock.url();
    let key = "api_key_env: LOOPGATE_TEST_UPSTREAM_KEY";
    let sep = if oa_settings.is_empty() { "" } else { ", " };
    let mut yaml = format!(
        "providers:\n  oa: {{ kind: openai_compatible, base_url: \"{mock}\", {key}{sep}{oa_settings} }}\n"
    );
    if anthropic {
        yaml += &format!("  an: {{ kind: anthropic, base_url: \"{mock}\", {key} }}\n");
    }
    yaml += &format!("routes:\n  - models: [{models}]\n    targets: [ {{ provider: oa }} ]\n");
    if anthropic {
        yaml += "  - models: [\"claude-3-5-haiku*\"]\n    targets: [ { provider: an } ]\n";
    }
    yaml
}

/// A running gateway (`loopgate run`).
pub struct Gateway {
    pub addr: SocketAddr,
    /// The admin listener, when the config has `admin: {listen: 127.0.0.1:{ADMIN_PORT}}`.
    pub admin: SocketAddr,
    pub dir: PathBuf,
    /// The config file the gateway runs (rewrite it to test reloads).
    pub config_path: PathBuf,
    proc: Proc,
}

impl Gateway {
    pub fn start_default(mock: &Mock) -> Gateway {
        Gateway::start(&default_config(mock))
    }

    /// Starts the gateway with `yaml`, where `{PORT}` (and `{ADMIN_PORT}`)
    /// are replaced by free ports. Retries on fresh ports if another process
    /// took one meanwhile.
    pub fn start(yaml: &str) -> Gateway {
        Gateway::start_with_env(yaml, &[])
    }

    /// As [`Gateway::start`], with these environment variables set too
    /// (e.g. the test-only `LOOPGATE_TEST_FAULT`).
    pub fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::start_bin(&bin(), yaml, env)
    }

    /// As [`Gateway::start_with_env`], running the binary at `bin` (a
    /// benchmark comparing another build).
    pub fn start_bin(bin: &Path, yaml: &str, env: &[(&str, &str)]) -> Gateway {
        let dir = scratch_dir("gw");
        // Every test gateway has an admin listener (metrics, reload).
        let yaml = if yaml.contains("{ADMIN_PORT}") {
            yaml.to_string()
        } else {
            format!("{yaml}\nadmin: {{ listen: \"127.0.0.1:{{ADMIN_PORT}}\" }}\n")
        };
        for _ in 0..5 {
            let port = free_port();
            let admin_port = free_port();
            let path = dir.join("gateway.yaml");
            let text = yaml
                .replace("{PORT}", &port.to_string())
                .replace("{ADMIN_PORT}", &admin_port.to_string());
            std::fs::write(&path, text).expect("write config");
            let child = Command::new(bin)
                .args(["run", "--config"])
                .arg(&path)
                .env("LOOPGATE_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
                .env("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)
                .env("LOOPGATE_TEST_TOOL_KEY", TOOL_KEY)
                .env("LOOPGATE_TEST_BAD_KEY", BAD_KEY)
                .env("RUST_LOG", "warn")
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start loopgate run");
            // Exits on a bad config; another process on a port: fresh ports.
            if let Some(proc) = listening(child, &[port, admin_port]) {
                return Gateway {
                    addr: ([127, 0, 0, 1], port).into(),
                    admin: ([127, 0, 0, 1], admin_port).into(),
                    dir,
                    config_path: path,
                    proc,
                };
            }
        }
        panic!("the gateway did not start; config:\n{yaml}");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// One POST of `body` to `path` as the agent with `key` (and `extra`
    /// header lines) on a fresh connection, written by hand (no client
    /// process between: its start would dwarf a small call's latency):
    /// the status (0 when no answer came) and how long the answer took.
    pub fn timed_post(
        &self,
        path: &str,
        key: &str,
        extra: &[&str],
        body: &[u8],
    ) -> (u16, Duration) {
        use std::io::Read;
        let started = Instant::now();
        let Ok(mut s) = TcpStream::connect(self.addr) else {
            return (0, started.elapsed());
        };
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for h in extra {
            head += h;
            head += "\r\n";
        }
        head += "\r\n";
        let mut answer = Vec::new();
        // A refusal may come (and the connection close) before the body
        // is all written: the answer still counts.
        let _ = s
            .write_all(head.as_bytes())
            .and_then(|()| s.write_all(body));
        let _ = s.read_to_end(&mut answer);
        let status = answer
            .get(9..12)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, started.elapsed())
    }

    /// Runs `during` while `senders` threads each POST `body` to `path` as
    /// `key` (see [`Gateway::timed_post`]) back to back, the first of them
    /// sent before `during` starts; returns what `during` returned and the
    /// statuses the senders got, every POST counted to its answer.
    pub fn while_posting<T>(
        &self,
        senders: usize,
        (path, key, extra): (&str, &str, &[&str]),
        body: &[u8],
        during: impl FnOnce() -> T,
    ) -> (T, Vec<u16>) {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let started = std::sync::Barrier::new(senders + 1);
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..senders)
                .map(|_| {
                    s.spawn(|| {
                        let mut statuses = Vec::new();
                        let mut first = true;
                        while first || !stop.load(Ordering::Relaxed) {
                            if std::mem::take(&mut first) {
                                started.wait();
                            }
                            statuses.push(self.timed_post(path, key, extra, body).0);
                        }
                        statuses
                    })
                })
                .collect();
            started.wait();
            let out = during();
            stop.store(true, Ordering::Relaxed);
            let statuses = threads
                .into_iter()
                .flat_map(|t| t.join().expect("sender"))
                .collect();
            (out, statuses)
        })
    }

    /// The value of one sample on the admin `/metrics` page, e.g.
    /// `loopgate_denials_total{code="rate_limited"}`. A sample that is not
    /// on the page fails the test: absent is not zero (a renamed metric or
    /// label would otherwise read as "nothing happened").
    pub fn metric(&self, sample: &str) -> f64 {
        self.metric_or_absent(sample).unwrap_or_else(|| {
            panic!("no sample `{sample}` on /metrics (absent is not 0: use metric_or_absent where absent is meant)")
        })
    }

    /// As [`Gateway::metric`], `None` when the page has no such sample:
    /// for a test that means "not counted yet" (a labelled counter appears
    /// on its first increment).
    pub fn metric_or_absent(&self, sample: &str) -> Option<f64> {
        let r = curl(&[&self.admin_url("/metrics")]);
        assert_eq!(r.status, 200, "metrics: {}", r.text());
        sample_value(&r.text(), sample)
    }
}

/// The value of `sample` (the whole series: name and labels) on a
/// Prometheus text page, `None` when the page has no such series.
fn sample_value(page: &str, sample: &str) -> Option<f64> {
    let mut found = None;
    for l in page.lines().filter(|l| !l.starts_with('#')) {
        // The whole series name, then one space and the value.
        let Some(value) = l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')) else {
            continue;
        };
        let v: f64 = value
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("sample `{sample}`: value {value:?} ({e})"));
        assert!(
            found.is_none(),
            "sample `{sample}` appears twice on /metrics"
        );
        found = Some(v);
    }
    found
}

/// Polls `f` every 50 ms until it returns true or `secs` pass.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Starts a server with `spawn(port)` on a free port, and again on fresh
/// ports while another process takes the port first. A connect alone could
/// reach that other process, so the child must hold the listening socket.
pub fn serve_on_a_free_port(what: &str, mut spawn: impl FnMut(u16) -> Child) -> (Proc, u16) {
    for _ in 0..5 {
        let port = free_port();
        if let Some(proc) = listening(spawn(port), &[port]) {
            return (proc, port);
        }
    }
    panic!("{what} did not start on a free port (5 tries)");
}

/// `child` once it holds the listening sockets on 127.0.0.1 at all of
/// `ports`; `None` (and the child stopped) when it exits first, when another
/// process holds one of them (the child's bind fails: a server exits on it,
/// and Pingora retries it for 30 s), or when 20 s pass. A connect alone
/// could reach that other process.
fn listening(child: Child, ports: &[u16]) -> Option<Proc> {
    let mut proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = proc.0.try_wait() {
            return None;
        }
        let mut all = true;
        for &port in ports {
            match listener_on(port, proc.0.id()) {
                Listener::Ours => {}
                Listener::Theirs => return None,
                Listener::Nobody => all = false,
            }
        }
        if all {
            return Some(proc);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Who listens on 127.0.0.1:`port`, as seen from process `pid`.
enum Listener {
    Nobody,
    Ours,
    Theirs,
}

/// Finds the listening socket on 127.0.0.1:`port` in `/proc/net/tcp` and
/// whether process `pid` holds it among its open file descriptors.
fn listener_on(port: u16, pid: u32) -> Listener {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return Listener::Nobody;
    };
    // Columns: sl local_address rem_address st ... uid timeout inode.
    // 0100007F is 127.0.0.1 in the kernel's byte order; 0A is LISTEN.
    let local = format!("0100007F:{port:04X}");
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.len() > 9 && cols[1] == local && cols[3] == "0A")
                .then(|| format!("socket:[{}]", cols[9]))
        })
        .collect();
    if sockets.is_empty() {
        return Listener::Nobody;
    }
    let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .map(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false);
    if held {
        Listener::Ours
    } else {
        Listener::Theirs
    }
}

/// A response as curl (or a raw socket) saw it.
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The body as text: a failing assertion shows what was answered.
impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resp")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.text())
            .finish()
    }
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// Asserts Loopgate's structured error with this status and code,
    /// OpenAI-shaped (every path but `/mcp`).
    pub fn assert_gateway_error(&self, status: u16, code: &str) {
        self.assert_error(status, code, &Wire::Json);
    }

    /// Asserts Loopgate's JSON-RPC error (every refusal on `/mcp`) with
    /// this HTTP status and code, answering message `id` (`null` before
    /// the body was judged).
    pub fn assert_rpc_error(&self, status: u16, id: Value, code: &str) {
        self.assert_error(status, code, &Wire::Rpc(id));
    }

    /// The one check of a refusal the gateway wrote, in either wire
    /// format: the status, `x-loopgate-error`, `application/json`, a
    /// non-empty message, `retryable` a boolean, and the body's
    /// `request_id` equal to `x-request-id`; then what the format adds.
    /// Returns the error object (`error`, or the JSON-RPC `error`).
    pub fn assert_error(&self, status: u16, code: &str, wire: &Wire) -> Value {
        assert_eq!(self.status, status, "{code}: {self:?} {}", self.text());
        assert_eq!(
            self.header("x-loopgate-error"),
            Some(code),
            "{self:?} {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        let v = self.json();
        let (error, data) = match wire {
            Wire::Json => {
                let e = v["error"].clone();
                assert_eq!(e["code"], code, "{v}");
                assert!(
                    e["type"].as_str().is_some_and(|t| !t.is_empty()),
                    "error.type: {v}"
                );
                (e.clone(), e)
            }
            Wire::Rpc(id) | Wire::RpcBatch(id) => {
                let one = match (wire, &v) {
                    (Wire::RpcBatch(_), Value::Array(a)) => {
                        assert_eq!(a.len(), 1, "one error answers a refused batch: {v}");
                        a[0].clone()
                    }
                    (Wire::RpcBatch(_), _) => panic!("a refused batch answers an array: {v}"),
                    (_, Value::Object(_)) => v.clone(),
                    _ => panic!("one JSON-RPC error object: {v}"),
                };
                assert_eq!(one["jsonrpc"], "2.0", "{v}");
                assert_eq!(&one["id"], id, "the refused message's id: {v}");
                assert!(one.get("result").is_none(), "{v}");
                let e = one["error"].clone();
                let rpc = e["code"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("error.code: {v}"));
                // The codes JSON-RPC reserves, where one names the refusal.
                let reserved = match code {
                    "invalid_json" => Some(-32700),
                    "invalid_request" | "bad_request" => Some(-32600),
                    "internal_error" => Some(-32603),
                    _ => None,
                };
                match reserved {
                    Some(want) => assert_eq!(rpc, want, "{code}: {v}"),
                    // A method outside the grant (-32601), or a method the
                    // endpoint does not take over HTTP (-32600).
                    None if code == "method_not_allowed" => {
                        assert!(rpc == -32601 || rpc == -32600, "{v}")
                    }
                    // Every other refusal: the implementation-defined range.
                    None => assert!((-32099..=-32000).contains(&rpc), "{v}"),
                }
                let data = e["data"].clone();
                assert_eq!(data["loopgate_code"], code, "{v}");
                (e, data)
            }
        };
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error.message: {v}"
        );
        assert!(data["retryable"].is_boolean(), "retryable: {v}");
        let rid = data["request_id"]
            .as_str()
            .unwrap_or_else(|| panic!("request_id: {v}"));
        assert!(!rid.is_empty(), "{v}");
        assert_eq!(self.header("x-request-id"), Some(rid), "{self:?}");
        error
    }
}

/// How the gateway writes a refusal (see [`Resp::assert_error`]).
#[derive(Debug, Clone)]
pub enum Wire {
    /// `{"error":{"code","type","message","retryable","request_id"}}`.
    Json,
    /// `{"jsonrpc":"2.0","id":..,"error":{"code":..,"message":..,
    /// "data":{"loopgate_code","retryable","request_id"}}}` answering the
    /// message with this id.
    Rpc(Value),
    /// As [`Wire::Rpc`], the one error (in an array) answering a batch.
    RpcBatch(Value),
}

/// Runs curl with `args` (plus `-s -i`, and a 30 s limit) and parses its output.
pub fn curl(args: &[&str]) -> Resp {
    let out = Command::new("curl")
        .args(["-s", "-i", "-m", "30"])
        .args(args)
        .output()
        .expect("run curl (is it installed?)");
    parse_curl(&out.stdout).unwrap_or_else(|| {
        panic!(
            "curl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// As [`curl`], but `None` when no response came (e.g. nothing listens yet).
pub fn try_curl(args: &[&str]) -> Option<Resp> {
    let out = Command::new("curl")
        .args(["-s", "-i", "-m", "30"])
        .args(args)
        .output()
        .ok()?;
    parse_curl(&out.stdout)
}

/// As [`curl`], sending `body` on stdin (`--data-binary @-`).
pub fn curl_body(args: &[&str], body: &[u8]) -> Resp {
    let mut child = Command::new("curl")
        .args(["-s", "-i", "-m", "30", "--data-binary", "@-"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run curl");
    let mut stdin = child.stdin.take().expect("stdin");
    let body = body.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let out = child.wait_with_output().expect("curl output");
    let _ = writer.join();
    parse_curl(&out.stdout).unwrap_or_else(|| {
        panic!(
            "curl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn parse_curl(mut out: &[u8]) -> Option<Resp> {
    loop {
        let end = find(out, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&out[..end]).ok()?;
        let rest = &out[end + 4..];
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        if (100..200).contains(&status) {
            out = rest; // informational (100 Continue): the real response follows
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        return Some(Resp {
            status,
            headers,
            body: rest.to_vec(),
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Common curl arguments for a JSON POST with the test agent's key.
pub fn auth(key: &str) -> String {
    format!("Authorization: Bearer {key}")
}

/// A one-message chat completion for `gpt-4o-mini`.
pub const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;

/// POSTs `body` to `path` as the agent with `key`, as JSON
/// (`content-type: application/json`), with `extra` curl arguments (e.g.
/// `["-H", "x-agent-task-id: t-1"]`). The body goes as it is, on stdin.
pub fn post_json(
    gw: &Gateway,
    key: &str,
    path: &str,
    extra: &[&str],
    body: impl AsRef<[u8]>,
) -> Resp {
    let url = gw.url(path);
    let auth = auth(key);
    let mut args = vec![
        url.as_str(),
        "-H",
        &auth,
        "-H",
        "content-type: application/json",
    ];
    args.extend_from_slice(extra);
    curl_body(&args, body.as_ref())
}

/// A JSON-RPC `body` to MCP server `server` (`/mcp/{server}`) as the agent
/// with `key`, accepting JSON or SSE as MCP clients do (see [`post_json`]).
pub fn post_mcp(
    gw: &Gateway,
    key: &str,
    server: &str,
    extra: &[&str],
    body: impl AsRef<[u8]>,
) -> Resp {
    let path = format!("/mcp/{server}");
    let accept = ["-H", "accept: application/json, text/event-stream"];
    post_json(gw, key, &path, &[&accept, extra].concat(), body)
}

/// [`CHAT`] to `/v1/chat/completions` as the agent with `key` (see
/// [`post_json`]).
pub fn post_chat(gw: &Gateway, key: &str, extra: &[&str]) -> Resp {
    post_json(gw, key, "/v1/chat/completions", extra, CHAT)
}

/// The `p`th percentile of `v` (nearest rank; `p` 100 is the largest),
/// zero for none.
pub fn percentile(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n => v[(n * p / 100).min(n - 1)],
    }
}

/// `p50 .., p90 .., max ..` of `v`.
pub fn latency_summary(v: &[Duration]) -> String {
    format!(
        "p50 {:?}, p90 {:?}, max {:?}",
        percentile(v, 50),
        percentile(v, 90),
        percentile(v, 100)
    )
}

/// A real `redis-server` on a free loopback port (no persistence), stopped
/// when dropped. `.ci/run` installs it.
pub struct Redis {
    proc: Option<Proc>,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        let (proc, port) = serve_on_a_free_port("redis-server", Redis::spawn);
        Redis {
            proc: Some(proc),
            port,
        }
    }

    /// On `port` (to bring one back where the gateways expect it).
    pub fn start_on(port: u16) -> Redis {
        let proc = listening(Redis::spawn(port), &[port])
            .unwrap_or_else(|| panic!("redis-server did not start on {port}"));
        Redis {
            proc: Some(proc),
            port,
        }
    }

    fn spawn(port: u16) -> Child {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Stops the server now (a Redis outage).
    pub fn stop(&mut self) {
        self.proc.take();
        assert!(
            eventually(10, || TcpStream::connect(("127.0.0.1", self.port)).is_err()),
            "redis-server did not stop"
        );
    }

    /// `INFO commandstats` as `(command, calls)`.
    pub fn command_calls(&self) -> Vec<(String, u64)> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "commandstats"])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("cmdstat_")?;
                let (cmd, stats) = rest.split_once(':')?;
                let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((cmd.to_string(), calls.parse().ok()?))
            })
            .collect()
    }
}

#[cfg(test)]
mod harness {
    use super::*;
    use serde_json::json;

    fn resp(status: u16, headers: &[(&str, &str)], body: Value) -> Resp {
        Resp {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_string().into_bytes(),
        }
    }

    /// `f` panics (its assertion failed).
    fn fails(f: impl FnOnce() + std::panic::UnwindSafe) -> bool {
        std::panic::catch_unwind(f).is_err()
    }

    #[test]
    fn the_refusal_check_fails_on_each_defect_in_either_wire_format() {
        let rid = "r-1";
        let head = |code: &'static str| {
            vec![
                ("content-type", "application/json"),
                ("x-request-id", rid),
                ("x-loopgate-error", code),
            ]
        };
        let json_err = |e: Value| json!({"error": e});
        let good = json!({"code": "tool_not_allowed", "type": "permission_error",
            "message": "no", "retryable": false, "request_id": rid});
        resp(403, &head("tool_not_allowed"), json_err(good.clone()))
            .assert_gateway_error(403, "tool_not_allowed");
        let without = |k: &str| {
            let mut e = good.clone();
            e.as_object_mut().unwrap().remove(k);
            resp(403, &head("tool_not_allowed"), json_err(e))
        };
        for k in ["code", "type", "message", "retryable", "request_id"] {
            let r = without(k);
            assert!(
                fails(move || r.assert_gateway_error(403, "tool_not_allowed")),
                "{k}"
            );
        }
        let mut other_id = head("tool_not_allowed");
        other_id[1] = ("x-request-id", "r-2");
        let mut no_type = head("tool_not_allowed");
        no_type.remove(0);
        for (status, h) in [
            (400, head("tool_not_allowed")),
            (403, other_id),
            (403, no_type),
            (403, head("invalid_request")),
        ] {
            let r = resp(status, &h, json_err(good.clone()));
            assert!(fails(
                move || r.assert_gateway_error(403, "tool_not_allowed")
            ));
        }
        // JSON-RPC: the id, the reserved code, the data.
        let rpc = |id: Value, code: i64, data: Value| {
            json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": code, "message": "no", "data": data}})
        };
        let data = json!({"loopgate_code": "invalid_json", "retryable": false, "request_id": rid});
        let ok = rpc(json!(7), -32700, data.clone());
        resp(200, &head("invalid_json"), ok.clone()).assert_rpc_error(
            200,
            json!(7),
            "invalid_json",
        );
        resp(200, &head("invalid_json"), json!([ok.clone()])).assert_error(
            200,
            "invalid_json",
            &Wire::RpcBatch(json!(7)),
        );
        let mut no_rid = data.clone();
        no_rid.as_object_mut().unwrap().remove("request_id");
        for body in [
            rpc(json!(8), -32700, data.clone()),
            rpc(json!(7), -32001, data.clone()),
            rpc(json!(7), -32700, no_rid),
            json!([ok.clone()]),
            json_err(good.clone()),
        ] {
            let r = resp(200, &head("invalid_json"), body);
            assert!(fails(move || r.assert_rpc_error(
                200,
                json!(7),
                "invalid_json"
            )));
        }
    }

    /// What `requests()` cannot see, `connections()` and `heads()` do: a
    /// connection that sends nothing the mock can parse, and a head whose
    /// body never ends.
    #[test]
    fn the_mock_counts_what_it_could_not_record() {
        let mock = Mock::start();
        assert_eq!((mock.connections(), mock.heads()), (0, 0));
        let mut s = TcpStream::connect(mock.addr).unwrap();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nContent-Length: 100\r\n\r\n{\"a\"",
        )
        .unwrap();
        assert!(eventually(5, || mock.heads() == 1));
        drop(s);
        let mut s = TcpStream::connect(mock.addr).unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n")
            .unwrap();
        drop(s);
        assert!(eventually(5, || mock.connections() == 2));
        assert_eq!(mock.heads(), 1);
        assert!(mock.requests().is_empty(), "recorded only when whole");
    }

    #[test]
    fn an_absent_sample_is_not_zero() {
        let page =
            "# HELP x y\nloopgate_a_total{code=\"x\"} 0\nloopgate_a_total_more 3\nloopgate_b 2.5\n";
        assert_eq!(
            sample_value(page, r#"loopgate_a_total{code="x"}"#),
            Some(0.0)
        );
        assert_eq!(sample_value(page, "loopgate_b"), Some(2.5));
        assert_eq!(sample_value(page, r#"loopgate_a_total{code="y"}"#), None);
        // A longer name that starts with the sample is another series.
        assert_eq!(sample_value(page, "loopgate_a_total_mor"), None);
        assert_eq!(sample_value(page, "loopgate_a"), None);
    }

    #[test]
    fn a_listener_is_told_apart_by_the_process_holding_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(matches!(
            listener_on(port, std::process::id()),
            Listener::Ours
        ));
        assert!(matches!(listener_on(port, other.id()), Listener::Theirs));
        drop(listener);
        // Another test's child forked meanwhile holds a copy of the socket
        // until its exec closes it (close-on-exec): wait that out.
        assert!(eventually(5, || matches!(
            listener_on(port, std::process::id()),
            Listener::Nobody
        )));
        let _ = other.kill();
        let _ = other.wait();
    }
}
