//! Every admission denial: its status, its code, the structured error body,
//! and that nothing reached the provider.

use loopgate_tests::*;

#[test]
fn every_denial_is_structured_and_sends_nothing_upstream() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let chat = gw.url("/v1/chat/completions");
    let embeddings = gw.url("/v1/embeddings");
    let files = gw.url("/v1/files");
    let admin = gw.url("/admin/config");
    let traversal = gw.url("/v1/chat/completions/../../admin");
    let messages = gw.url("/v1/messages");
    let key = auth(AGENT_KEY);
    let narrow = auth(NARROW_KEY);
    let ok = r#"{"model":"gpt-4o-mini","messages":[]}"#;
    let cases: Vec<(&str, Vec<&str>, u16, &str)> = vec![
        ("no key", vec![&chat, "-d", ok], 401, "missing_key"),
        (
            "empty bearer",
            vec![&chat, "-H", "Authorization: Bearer ", "-d", ok],
            401,
            "missing_key",
        ),
        (
            "basic auth is not a key",
            vec![&chat, "-H", "Authorization: Basic dGVzdA==", "-d", ok],
            401,
            "missing_key",
        ),
        (
            "unknown key",
            vec![&chat, "-H", "Authorization: Bearer sk-wrong", "-d", ok],
            401,
            "unknown_key",
        ),
        (
            "unknown x-api-key",
            vec![&chat, "-H", "x-api-key: sk-wrong", "-d", ok],
            401,
            "unknown_key",
        ),
        (
            "path not allowed",
            vec![
                &embeddings,
                "-H",
                &narrow,
                "-d",
                r#"{"model":"gpt-4o","input":"x"}"#,
            ],
            403,
            "path_not_allowed",
        ),
        (
            "model not allowed",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":"gpt-4o","messages":[]}"#,
            ],
            403,
            "model_not_allowed",
        ),
        (
            "no prefix match",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":"gpt-4o-mini-2024-07-18","messages":[]}"#,
            ],
            403,
            "model_not_allowed",
        ),
        (
            "malformed json",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":"gpt-4o-mini","messages":["#,
            ],
            400,
            "invalid_json",
        ),
        (
            "not an object",
            vec![&chat, "-H", &key, "-d", r#"["gpt-4o-mini"]"#],
            400,
            "invalid_json",
        ),
        (
            "empty body",
            vec![&chat, "-H", &key, "-d", ""],
            400,
            "invalid_json",
        ),
        (
            "duplicate model",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":"gpt-4o-mini","model":"gpt-4o","messages":[]}"#,
            ],
            400,
            "invalid_json",
        ),
        (
            "missing model",
            vec![&chat, "-H", &key, "-d", r#"{"messages":[]}"#],
            400,
            "missing_model",
        ),
        (
            "model not a string",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":["gpt-4o-mini"],"messages":[]}"#,
            ],
            400,
            "missing_model",
        ),
        (
            "messages not an array",
            vec![
                &chat,
                "-H",
                &key,
                "-d",
                r#"{"model":"gpt-4o-mini","messages":"hi"}"#,
            ],
            400,
            "invalid_messages",
        ),
        (
            "messages missing",
            vec![&chat, "-H", &key, "-d", r#"{"model":"gpt-4o-mini"}"#],
            400,
            "invalid_messages",
        ),
        (
            "unknown endpoint",
            vec![&files, "-H", &key, "-d", ok],
            404,
            "not_found",
        ),
        (
            "admin is not on the proxy port",
            vec![&admin, "-H", &key],
            404,
            "not_found",
        ),
        (
            "traversal is unknown",
            vec![&traversal, "--path-as-is", "-H", &key, "-d", ok],
            404,
            "not_found",
        ),
        (
            "wrong method",
            vec![&chat, "-X", "GET", "-H", &key],
            405,
            "method_not_allowed",
        ),
        (
            // The route's OpenAI target would get it translated, but a
            // Messages call without `max_tokens` cannot be.
            "anthropic endpoint, openai model, untranslatable",
            vec![&messages, "-H", &key, "-d", ok],
            400,
            "untranslatable_request",
        ),
    ];
    for (name, args, status, code) in cases {
        let r = curl(&args);
        assert_eq!(r.status, status, "{name}: {}", r.text());
        r.assert_gateway_error(status, code);
        let body = r.json();
        assert_eq!(body["error"]["retryable"], false, "{name}");
        assert!(!r.text().contains(AGENT_KEY), "{name}: key echoed");
    }
    assert!(
        mock.requests().is_empty(),
        "denied requests reached the provider: {:?}",
        mock.requests()
    );

    // A model the agent may use but no route serves: a name only a
    // wildcard grant reaches (a grant no route serves at all is refused
    // by `loopgate check`).
    let unrouted = default_config(&mock).replace(
        "models: [gpt-4o-mini, text-embedding",
        "models: [gpt-4o-mini, o3, text-embedding",
    );
    let path = scratch_dir("denials").join("gateway.yaml");
    std::fs::write(&path, unrouted.replace("{PORT}", "0")).unwrap();
    let (code, stderr) = check_config(&path);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("agents.tester.models[1]: no route serves `o3`"),
        "{stderr}"
    );
    let yaml = default_config(&mock).replace(
        "models: [gpt-4o-mini, text-embedding",
        "models: [\"gpt-4o*\", text-embedding",
    );
    let gw = Gateway::start(&yaml);
    let r = curl(&[
        &gw.url("/v1/chat/completions"),
        "-H",
        &key,
        "-d",
        r#"{"model":"gpt-4o-2024-08-06","messages":[]}"#,
    ]);
    r.assert_gateway_error(404, "unknown_model");
    assert!(mock.requests().is_empty());
}

#[test]
fn oversized_bodies_get_413_whatever_the_framing() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let chat = gw.url("/v1/chat/completions");
    let key = auth(AGENT_KEY);
    let big = vec![b'a'; MAX_BODY + 1];
    for framing in [
        vec![],                                   // Content-Length, curl sends Expect: 100-continue
        vec!["-H", "Expect:"],                    // Content-Length, body sent at once
        vec!["-H", "Transfer-Encoding: chunked"], // chunked with Expect
        vec!["-H", "Transfer-Encoding: chunked", "-H", "Expect:"],
    ] {
        let mut args = vec![chat.as_str(), "-H", &key];
        args.extend(framing.iter().copied());
        let r = curl_body(&args, &big);
        r.assert_gateway_error(413, "body_too_large");
    }
    // Not even the head or a part of the body went upstream.
    assert_eq!(
        mock.connections(),
        0,
        "an oversized body reached the upstream"
    );
    assert!(mock.requests().is_empty());
    // And the gateway still serves afterwards.
    let r = curl(&[
        &chat,
        "-H",
        &key,
        "-d",
        r#"{"model":"gpt-4o-mini","messages":[]}"#,
    ]);
    assert_eq!(r.status, 200);
}

/// An agent on the Anthropic SDK gets the gateway's refusals in its own
/// family's shape (`{"type":"error","error":{"type":...}}`, the type
/// Anthropic documents for the status), with Loopgate's fields in `error`.
#[test]
fn messages_refusals_are_anthropic_shaped() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let messages = gw.url("/v1/messages");
    let key = format!("x-api-key: {AGENT_KEY}");
    let body = r#"{"model":"claude-3-5-haiku-latest","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let cases: [(Vec<&str>, u16, &str, &str); 3] = [
        (
            vec![&messages, "-d", body],
            401,
            "missing_key",
            "authentication_error",
        ),
        (
            vec![&messages, "-H", "x-api-key: sk-wrong", "-d", body],
            401,
            "unknown_key",
            "authentication_error",
        ),
        (
            vec![&messages, "-H", &key, "-d", "{\"model\":"],
            400,
            "invalid_json",
            "invalid_request_error",
        ),
    ];
    for (args, status, code, kind) in cases {
        let r = curl(&args);
        r.assert_gateway_error(status, code);
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
    }
    // A chat completion keeps OpenAI's shape.
    let r = curl(&[&gw.url("/v1/chat/completions"), "-d", "{}"]);
    r.assert_gateway_error(401, "missing_key");
    assert!(r.json().get("type").is_none(), "{}", r.text());
    assert!(mock.requests().is_empty());
}
