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
