//! The official OpenAI and Anthropic Python SDKs work against Loopgate with
//! only their base URL and key changed (`sdk/clients.py`). `.ci/run`
//! installs the SDKs; without them this test fails rather than skip.

use loopgate_tests::*;
use std::process::Command;

#[test]
fn official_python_sdks_work_through_the_gateway() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/clients.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", gw.addr))
        .arg(AGENT_KEY)
        .output()
        .unwrap_or_else(|e| panic!("run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("sdk ok"),
        "SDK script failed (pip install openai anthropic?)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The SDKs' requests reached the provider with the gateway's key only.
    let reqs = mock.requests();
    assert!(reqs.len() >= 6, "{}", reqs.len());
    for r in &reqs {
        assert!(!r["headers"].to_string().contains(AGENT_KEY), "{r}");
    }
}
