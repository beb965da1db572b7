//! Bodies of every size up to `max_body_bytes` are judged and forwarded byte
//! for byte: across Pingora's 64 KiB retry-buffer boundary, in megabytes,
//! with either framing.

use loopgate_tests::*;

/// A valid chat body of exactly `size` bytes.
fn chat_body(size: usize) -> Vec<u8> {
    let head = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#;
    let tail = br#""}]}"#;
    let fill = size - head.len() - tail.len();
    let mut b = Vec::with_capacity(size);
    b.extend_from_slice(head);
    // Varying content so a shifted or truncated copy cannot match by accident.
    b.extend((0..fill).map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789"[(i * 7 + i / 97) % 36]));
    b.extend_from_slice(tail);
    assert_eq!(b.len(), size);
    b
}

#[test]
fn bodies_around_and_far_past_64k_arrive_intact() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let sizes = [
        60 * 1024,
        64 * 1024,
        64 * 1024 + 1,
        70 * 1024,
        1024 * 1024,
        3 * 1024 * 1024 + 17,
        MAX_BODY,
    ];
    for size in sizes {
        let body = chat_body(size);
        for chunked in [false, true] {
            let framing: &[&str] = if chunked {
                &["-H", "Transfer-Encoding: chunked"]
            } else {
                &[]
            };
            let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", framing, &body);
            assert_eq!(r.status, 200, "size {size} chunked {chunked}: {}", r.text());
            assert_eq!(r.json()["object"], "chat.completion");
            let seen = mock.last_request();
            assert_eq!(seen["body_len"], size, "size {size} chunked {chunked}");
            assert_eq!(
                seen["body_sha256"],
                sha256_hex(&body),
                "size {size} chunked {chunked}"
            );
            assert_eq!(
                recorded_header(&seen, "authorization"),
                Some(format!("Bearer {UPSTREAM_KEY}").as_str())
            );
            assert_eq!(
                recorded_header(&seen, "expect"),
                None,
                "Expect is answered by the gateway"
            );
            assert!(!seen["headers"].to_string().contains(AGENT_KEY));
        }
    }
}

#[test]
fn large_body_streams_back_byte_identical() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let mut body = chat_body(2 * 1024 * 1024);
    // turn on streaming: {"model":..,"stream":true,...}
    body.splice(1..1, br#""stream":true,"#.iter().copied());
    let direct = curl_body(
        &[
            &format!("{}/v1/chat/completions", mock.url()),
            "-N",
            "-H",
            "x-mock-chunks: 20",
            "-H",
            "x-mock-usage-if-asked: 1",
        ],
        &body,
    );
    let via = curl_body(
        &[
            &gw.url("/v1/chat/completions"),
            "-N",
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-mock-chunks: 20",
            "-H",
            "x-mock-usage-if-asked: 1",
        ],
        &body,
    );
    assert_eq!(via.status, 200, "{}", via.text());
    assert_eq!(via.header("content-type"), Some("text/event-stream"));
    assert!(via.header("x-request-id").is_some());
    // The mock streams as OpenAI does (usage only when asked): the gateway
    // asked for it (a priced model) and relayed no usage chunk.
    assert_eq!(direct.body, via.body);
    let mut asked = body.clone();
    asked.splice(
        1..1,
        br#""stream_options":{"include_usage":true},"#.iter().copied(),
    );
    assert_eq!(mock.last_request()["body_sha256"], sha256_hex(&asked));
}

#[test]
fn large_body_denials_and_failures_are_still_structured() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    // Judged after reading all of it: a 1 MiB body naming a forbidden model.
    let mut body = chat_body(1024 * 1024);
    let at = body.windows(11).position(|w| w == b"gpt-4o-mini").unwrap();
    body.splice(at..at + 11, b"gpt-4o-nano".iter().copied());
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &body);
    r.assert_gateway_error(403, "model_not_allowed");
    assert_eq!(
        mock.connections(),
        0,
        "a refused large body reached the upstream"
    );
    assert!(mock.requests().is_empty());
    // A provider failure on the large-body path keeps the provider's answer.
    let body = chat_body(200 * 1024);
    let r = post_json(
        &gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &["-H", "x-mock-status: 503"],
        &body,
    );
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["message"], "injected fault");
}
