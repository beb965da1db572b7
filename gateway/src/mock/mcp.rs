//! A small MCP server in the mock (`POST /mcp`, streamable HTTP): enough
//! for the demo and the end-to-end tests. Tools: `read_file`, `search_docs`
//! (read) and `delete_file`, `write_note` (write); `tools/call` echoes its
//! arguments. Answers JSON, or an SSE stream (a progress notification, then
//! the response) when the request carries `x-mock-mcp-sse: 1`. A GET opens
//! the server's own stream (`serve_mcp_stream` in the mock's `mod.rs`).

use serde_json::{json, Value};

/// The tools the mock serves, in list order.
pub const TOOLS: [&str; 4] = ["read_file", "search_docs", "delete_file", "write_note"];

/// The answer to one JSON-RPC message; `None` for a notification.
pub fn answer(msg: &Value) -> Option<Value> {
    let id = msg.get("id")?.clone();
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => json!({
            "protocolVersion": params.get("protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "loopgate-mock-mcp", "version": "1.0.0"},
        }),
        "ping" => json!({}),
        "tools/list" => json!({
            "tools": TOOLS.iter().map(|t| json!({
                "name": t,
                "description": format!("mock tool {t}"),
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
            })).collect::<Vec<_>>(),
        }),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            if !TOOLS.contains(&name) {
                return Some(json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32602, "message": format!("unknown tool {name}")}}));
            }
            let args = params.get("arguments").cloned().unwrap_or(json!({}));
            json!({
                "content": [{"type": "text", "text": format!("{name} called with {args}")}],
                "isError": false,
            })
        }
        _ => {
            return Some(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": format!("method not found: {method}")}}))
        }
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// Answers a POST body (one message or a batch): `None` when nothing needs
/// an answer (only notifications or responses: 202).
pub fn answer_body(body: &Value) -> Option<Value> {
    match body {
        Value::Array(items) => {
            let out: Vec<Value> = items.iter().filter_map(answer).collect();
            (!out.is_empty()).then_some(Value::Array(out))
        }
        one => answer(one),
    }
}
