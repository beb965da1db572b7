//! `loopgate`: a fail-closed AI agent gateway on Pingora.
//!
//! Subcommands: `run` (the gateway), `check` (validate a config), `hash-key`
//! (digest an agent key for the config), `mock` (a local provider) and
//! `demo` (mock plus gateway on loopback, ready to try).

mod access_log;
mod config;
mod connections;
mod error;
mod logging;
mod metrics;
mod mock;
mod probe;
mod proxy;
mod reload;
mod secret;
mod server;
mod shared;
mod spend;

use clap::{Parser, Subcommand};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the proxy allocates and frees many
/// small, short-lived buffers per request (headers, bodies, log lines), and
/// glibc's allocator was ~8% of the proxy's CPU in `benches/compare`.
/// `.cargo/config.toml` builds it with arenas committed on demand, so
/// memory freed by finished streams goes back to the OS (eagerly committed
/// arenas held ~190 KB per stream in `benches/streams` instead of ~70).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "loopgate", version, about = "A fail-closed AI agent gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Run {
        #[arg(long, default_value = "conf/gateway.yaml")]
        config: PathBuf,
    },
    /// Validate a config file and print a summary or every error.
    Check {
        #[arg(long, default_value = "conf/gateway.yaml")]
        config: PathBuf,
    },
    /// Read an agent key on stdin and print its SHA-256 for `key_sha256`.
    HashKey,
    /// Run the local OpenAI- and Anthropic-compatible mock provider.
    Mock {
        #[arg(long, default_value = "127.0.0.1:18081")]
        listen: SocketAddr,
        /// Worker threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[command(flatten)]
        faults: FaultArgs,
    },
    /// Start the mock and the gateway with the demo config and print examples.
    Demo {
        /// A config file to run instead of the built-in demo config (a copy
        /// of the repository's conf/demo.yaml, carried by the binary).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the mock listens; conf/demo.yaml points its providers here.
        #[arg(long, default_value = "127.0.0.1:18081")]
        mock_listen: SocketAddr,
    },
}

/// Faults applied to every mock request (headers can still override them).
#[derive(clap::Args)]
struct FaultArgs {
    /// Answer every request with this status.
    #[arg(long)]
    status: Option<u16>,
    /// With --status: send this Retry-After (seconds).
    #[arg(long)]
    retry_after: Option<u64>,
    /// Wait this long before each response header.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Content pieces (tokens) per answer.
    #[arg(long, default_value_t = 8)]
    chunks: usize,
    /// Wait between streamed events.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Drop streams after this many events.
    #[arg(long)]
    reset_after: Option<usize>,
    /// Refuse output limits as the real providers do: `max_tokens` for
    /// OpenAI's reasoning models, a limit above the model's output maximum,
    /// a Messages call without `max_tokens` (per request: `x-mock-strict: 1`).
    #[arg(long)]
    strict: bool,
}

/// The key the demo agent uses; conf/demo.yaml holds its SHA-256.
const DEMO_AGENT_KEY: &str = "demo-agent-key";
/// The provider credential the demo injects (the mock records it).
const DEMO_UPSTREAM_KEY_ENV: &str = "LOOPGATE_DEMO_UPSTREAM_KEY";
/// The admin token the demo uses unless the environment sets one.
const DEMO_ADMIN_TOKEN_ENV: &str = "LOOPGATE_ADMIN_TOKEN";
const DEMO_ADMIN_TOKEN: &str = "demo-admin-token";

fn main() -> ExitCode {
    logging::init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Check { config } => check(&config),
        Command::HashKey => hash_key(),
        Command::Mock {
            listen,
            threads,
            faults,
        } => mock(listen, threads, faults),
        Command::Demo {
            config,
            mock_listen,
        } => demo(config, mock_listen),
    }
}

fn run(path: &Path) -> ExitCode {
    let source = config::Source::file(path.to_path_buf());
    match source.load() {
        Ok(cfg) => server::run(cfg, source),
        Err(errs) => {
            eprintln!("{errs}");
            ExitCode::from(2)
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(cfg) => {
            let taken = config::prices::built_in_date();
            let age = config::prices::built_in_age_days(std::time::SystemTime::now());
            let prices = match age {
                Some(age) => format!("prices taken {taken} ({age} days ago)"),
                None => format!("prices taken {taken}"),
            };
            // One line: scripts read it.
            println!(
                "{}: ok: listen {}, {} providers, {} routed models, {} agents, max body {} bytes, {prices}",
                cfg.file,
                cfg.listen,
                cfg.providers.len(),
                cfg.routes.names().count(),
                cfg.agents.len(),
                cfg.max_body_bytes
            );
            if let Some(age) = age.filter(|a| *a > config::prices::STALE_AFTER_DAYS) {
                eprintln!(
                    "{}: warning: the built-in prices were taken {taken}, {age} days ago \
                     (more than {}): check them against the providers' price pages and \
                     set any that changed under models.<name>.price",
                    cfg.file,
                    config::prices::STALE_AFTER_DAYS
                );
            }
            ExitCode::SUCCESS
        }
        Err(errs) => {
            eprintln!("{errs}");
            ExitCode::from(1)
        }
    }
}

fn hash_key() -> ExitCode {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("cannot read stdin: {e}");
        return ExitCode::from(1);
    }
    // Only the line ending is dropped: a key is used exactly as written.
    let key = input
        .strip_suffix(b"\n")
        .map(|k| k.strip_suffix(b"\r").unwrap_or(k))
        .unwrap_or(&input);
    if key.is_empty() {
        eprintln!("no key on stdin (try: printf '%s' \"$KEY\" | loopgate hash-key)");
        return ExitCode::from(1);
    }
    println!("{}", loopgate_policy::hash_key(key).to_hex());
    ExitCode::SUCCESS
}

fn mock_options(f: FaultArgs) -> mock::MockOptions {
    mock::MockOptions {
        defaults: mock::Faults {
            status: f.status,
            retry_after: f.retry_after,
            latency_ms: f.latency_ms,
            chunks: f.chunks.max(1),
            chunk_delay_ms: f.chunk_delay_ms,
            reset_after: f.reset_after,
            body: None,
            upgrade: false,
            strict: f.strict,
            ..mock::Faults::default()
        },
    }
}

fn mock(listen: SocketAddr, threads: usize, faults: FaultArgs) -> ExitCode {
    // Load tests hold as many connections to the mock as to the gateway.
    connections::raise_nofile();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let res = rt.block_on(mock::serve(listen, mock_options(faults), |addr| {
        // Tests read this line to learn the port when listening on :0.
        println!("mock listening on {addr}");
        let _ = std::io::stdout().flush();
    }));
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock: cannot listen on {listen}: {e}");
            ExitCode::from(1)
        }
    }
}

/// The demo config, carried by the binary so that `loopgate demo` works
/// from any directory and from an installed binary.
const DEMO_CONFIG: &str = include_str!("../../conf/demo.yaml");

/// Writes the built-in demo config to a directory of its own (the
/// gateway watches its file: edit it and the demo reloads) and returns the
/// file's path. The directory is removed when the demo is stopped (see
/// [`remove_on_exit`]); ones left by a demo that was killed are swept here.
fn demo_config_file() -> std::io::Result<PathBuf> {
    sweep_stale_demo_dirs();
    let dir = std::env::temp_dir().join(format!("{DEMO_DIR_PREFIX}{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("demo.yaml");
    std::fs::write(&path, DEMO_CONFIG)?;
    remove_on_exit(&dir, &path);
    Ok(path)
}

const DEMO_DIR_PREFIX: &str = "loopgate-demo-";

/// Removes the demo directories of processes that no longer run (a demo
/// stopped by SIGKILL cannot clean up after itself).
fn sweep_stale_demo_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DEMO_DIR_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// On SIGINT or SIGTERM (Ctrl-C), removes the demo's file and directory
/// before Pingora's own handler ends the process. The handler only calls
/// `unlink` and `rmdir` on paths prepared here: both are safe in a signal
/// handler, where allocating is not.
fn remove_on_exit(dir: &Path, file: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(dir), Ok(file)) = (
        std::ffi::CString::new(dir.as_os_str().as_bytes()),
        std::ffi::CString::new(file.as_os_str().as_bytes()),
    ) else {
        return;
    };
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let (dir, file) = (dir.clone(), file.clone());
        // SAFETY: the action only makes async-signal-safe system calls on
        // strings it owns; it neither allocates nor locks.
        let registered = unsafe {
            signal_hook::low_level::register(signal, move || {
                libc::unlink(file.as_ptr());
                libc::rmdir(dir.as_ptr());
            })
        };
        if let Err(e) = registered {
            log::debug!("demo: cannot clean up on signal {signal}: {e}");
        }
    }
}

fn demo(config: Option<PathBuf>, mock_listen: SocketAddr) -> ExitCode {
    let own_file = config.is_none();
    let path = match config {
        Some(p) => p,
        None => match demo_config_file() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("demo: cannot write the demo config to a temporary file: {e}");
                return ExitCode::from(1);
            }
        },
    };
    // Removes the demo's own directory on an early exit.
    let give_up = |path: &Path, code: u8| {
        if let (true, Some(dir)) = (own_file, path.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
        ExitCode::from(code)
    };
    // The demo's own upstream key and admin token stand in for variables
    // the environment does not set, at the first load and every reload.
    let source = config::Source::with_fallback(
        path,
        vec![
            (DEMO_UPSTREAM_KEY_ENV, "mock-upstream-secret".to_string()),
            (DEMO_ADMIN_TOKEN_ENV, DEMO_ADMIN_TOKEN.to_string()),
        ],
    );
    let cfg = match source.load() {
        Ok(cfg) => cfg,
        Err(errs) => {
            eprintln!("{errs}");
            return give_up(&source.path, 2);
        }
    };
    // Before the mock starts and the banner is printed: pasted examples
    // must never reach whatever else owns the port.
    if let Err(e) = server::check_listeners(&cfg) {
        eprintln!("demo: {e}");
        return give_up(&source.path, 1);
    }
    let faults = mock::Faults::default();
    let mock_addr = match mock::spawn(mock_listen, mock::MockOptions { defaults: faults }, 1) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo: cannot start the mock provider on {mock_listen}: {e}");
            return give_up(&source.path, 1);
        }
    };
    let gw = format!("http://{}", cfg.listen);
    let admin = cfg
        .admin_listen
        .map_or_else(|| "(no admin listener)".to_string(), |a| a.to_string());
    let config = source.path.display();
    // The token itself is printed only when it is the demo's own.
    let admin_token = if std::env::var_os(DEMO_ADMIN_TOKEN_ENV).is_some() {
        format!("${DEMO_ADMIN_TOKEN_ENV}")
    } else {
        DEMO_ADMIN_TOKEN.to_string()
    };
    println!(
        r#"
Loopgate demo
  mock provider   http://{mock_addr}   (recorded requests: curl -s http://{mock_addr}/_mock/requests)
  gateway         {gw}
  agent key       {DEMO_AGENT_KEY}
  config          {config}   (edit it: the gateway reloads)

Chat completion (OpenAI shape):
  curl -s {gw}/v1/chat/completions -H 'Authorization: Bearer {DEMO_AGENT_KEY}' \
    -H 'content-type: application/json' \
    -d '{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}]}}'

Streaming (SSE, passes through unbuffered):
  curl -sN {gw}/v1/chat/completions -H 'Authorization: Bearer {DEMO_AGENT_KEY}' \
    -H 'content-type: application/json' -H 'x-mock-chunk-delay-ms: 200' \
    -d '{{"model":"gpt-4o-mini","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'

Anthropic Messages, streaming:
  curl -sN {gw}/v1/messages -H 'x-api-key: {DEMO_AGENT_KEY}' -H 'anthropic-version: 2023-06-01' \
    -H 'content-type: application/json' \
    -d '{{"model":"claude-3-5-haiku-latest","max_tokens":64,"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'

Provider families: an Anthropic Messages call served by the OpenAI-shaped
mock (translated both ways), and one whose Anthropic target is down, served
by the local OpenAI-compatible one (see x-loopgate-provider, x-loopgate-fallback):
  curl -sN {gw}/v1/messages -H 'x-api-key: {DEMO_AGENT_KEY}' -H 'anthropic-version: 2023-06-01' \
    -H 'content-type: application/json' \
    -d '{{"model":"claude-via-openai","max_tokens":64,"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'
  curl -si {gw}/v1/messages -H 'x-api-key: {DEMO_AGENT_KEY}' -H 'anthropic-version: 2023-06-01' \
    -H 'content-type: application/json' \
    -d '{{"model":"claude-outage","max_tokens":64,"messages":[{{"role":"user","content":"hi"}}]}}'

A denial (model not allowed for this agent), with its structured error:
  curl -si {gw}/v1/chat/completions -H 'Authorization: Bearer {DEMO_AGENT_KEY}' \
    -H 'content-type: application/json' -d '{{"model":"gpt-4o","messages":[]}}'

MCP (the mock's server behind /mcp/files; only read_file and search_docs are granted):
  curl -s {gw}/mcp/files -H 'Authorization: Bearer {DEMO_AGENT_KEY}' \
    -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    -d '{{"jsonrpc":"2.0","id":1,"method":"tools/list"}}'
  curl -s {gw}/mcp/files -H 'Authorization: Bearer {DEMO_AGENT_KEY}' \
    -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"delete_file","arguments":{{"path":"/"}}}}}}'

Admin (metrics are open; the API needs the token):
  curl -s http://{admin}/metrics | grep loopgate_requests_total
  curl -s http://{admin}/admin/breakers -H "Authorization: Bearer {admin_token}"

Python (pip install openai anthropic):
  from openai import OpenAI
  client = OpenAI(base_url="{gw}/v1", api_key="{DEMO_AGENT_KEY}")
  print(client.chat.completions.create(model="gpt-4o-mini",
        messages=[{{"role": "user", "content": "hi"}}]).choices[0].message.content)

  import anthropic
  client = anthropic.Anthropic(base_url="{gw}", api_key="{DEMO_AGENT_KEY}")
  print(client.messages.create(model="claude-3-5-haiku-latest", max_tokens=64,
        messages=[{{"role": "user", "content": "hi"}}]).content[0].text)

Press Ctrl-C to stop.
"#
    );
    let _ = std::io::stdout().flush();
    server::run(cfg, source)
}
