//! MCP (Model Context Protocol) authorization: pure rules over JSON-RPC
//! messages, shared by listing and calling so the two can never disagree.
//!
//! [`McpGrant::allows`] is the one rule function: `tools/call` of a tool is
//! allowed exactly when `tools/list` would show it (and the same for prompts
//! and resources). Everything the gateway does not know is refused: unknown
//! methods, malformed messages, a batch with any refused element.

use crate::decision::{clip, Deny, DenyCode};
use crate::json::JsonError;
use crate::pattern::PatternList;
#[cfg(doc)]
use crate::uri::ResourcePattern;
use crate::uri::{ResourceMatcher, ResourceUri};
use serde_json::{json, Map, Value};

/// What one agent may use on one MCP server.
#[derive(Debug, Clone)]
pub struct McpGrant {
    pub tools: PatternList,
    pub prompts: PatternList,
    pub resources: PatternList,
}

/// The three kinds of things a server lists and an agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Prompt,
    Resource,
}

impl Kind {
    /// The `*/list` result field holding the items, and the item field
    /// naming each.
    fn list_fields(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Kind::Tool => ("tools", &["name"]),
            Kind::Prompt => ("prompts", &["name"]),
            Kind::Resource => ("resources", &["uri"]),
        }
    }
}

/// A list request whose result the gateway filters.
#[derive(Debug, Clone, PartialEq)]
pub struct ListFilter {
    pub id: Value,
    pub kind: Kind,
    /// `resources/templates/list` (items named by `uriTemplate`).
    pub templates: bool,
}

impl McpGrant {
    /// The one rule: may the agent see and use `name` of `kind`? Tools and
    /// prompts match [`PatternList`] names; resources match by
    /// [`ResourceMatcher`]: canonical URIs, prefixes by whole path segments,
    /// and an ambiguous URI (see [`ResourceUri::parse`]) is never allowed.
    pub fn allows(&self, kind: Kind, name: &str) -> bool {
        match kind {
            Kind::Tool => self.tools.allows(name),
            Kind::Prompt => self.prompts.allows(name),
            Kind::Resource => self.resource_matcher().check(name).unwrap_or(false),
        }
    }

    /// The resource entries read as [`ResourcePattern`]s; an entry that is
    /// not one (`file:///public*`) admits nothing. Validate entries at
    /// grant build time with [`McpGrant::validate`].
    pub fn resource_matcher(&self) -> ResourceMatcher {
        ResourceMatcher::lenient(&self.resources)
    }

    /// Refuses a grant with a resource entry that is not a valid
    /// [`ResourcePattern`]: the entry's index and why. Call it where grants
    /// are built (config load), so a typo fails loudly instead of admitting
    /// nothing.
    pub fn validate(&self) -> Result<(), (usize, String)> {
        ResourceMatcher::parse(&self.resources).map(|_| ())
    }

    /// Removes from a `*/list` result every item [`McpGrant::allows`]
    /// refuses; pagination (`nextCursor`) and other fields pass through.
    /// Returns how many were removed.
    pub fn filter_list(&self, f: &ListFilter, result: &mut Value) -> usize {
        let (field, names) = if f.templates {
            ("resourceTemplates", &["uriTemplate"][..])
        } else {
            f.kind.list_fields()
        };
        let Some(items) = result.get_mut(field).and_then(Value::as_array_mut) else {
            return 0;
        };
        let before = items.len();
        // Read the resource entries once, not per item.
        let resources = (f.kind == Kind::Resource).then(|| self.resource_matcher());
        items.retain(|item| {
            names
                .iter()
                .find_map(|n| item.get(*n).and_then(Value::as_str))
                .is_some_and(|name| match &resources {
                    Some(m) => m.check(name).unwrap_or(false),
                    None => self.allows(f.kind, name),
                })
        });
        before - items.len()
    }
}

/// One JSON-RPC message from the client, as judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub id: Option<Value>,
    pub method: Option<String>,
    /// `tools/call`: the tool and its arguments.
    pub tool: Option<(String, Value)>,
    pub list: Option<ListFilter>,
}

/// What a client POST carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub messages: Vec<Judged>,
    pub batch: bool,
}

/// A refused message: the JSON-RPC id to answer, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub id: Value,
    pub deny: Deny,
}

/// Client-to-server notifications the gateway passes.
const NOTIFICATIONS: &[&str] = &[
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// Judges a client POST body: every message must be allowed, or the first
/// refusal is returned (a batch is all or nothing).
pub fn judge(grant: &McpGrant, body: &[u8]) -> Result<Judgement, Refused> {
    let value = crate::json::parse(body).map_err(|e| {
        let message = match e {
            JsonError::Syntax(e) => format!("body is not JSON: {e}"),
            other => other.to_string(),
        };
        refuse(Value::Null, DenyCode::InvalidJson, message)
    })?;
    let (items, batch) = match value {
        Value::Array(items) if items.is_empty() => {
            return Err(refuse(Value::Null, DenyCode::InvalidRequest, "empty batch"))
        }
        Value::Array(items) => (items, true),
        other => (vec![other], false),
    };
    let messages = items
        .into_iter()
        .map(|m| judge_one(grant, m))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Judgement { messages, batch })
}

fn refuse(id: Value, code: DenyCode, message: impl Into<String>) -> Refused {
    Refused {
        id,
        deny: Deny::new(code, message).never_retryable(),
    }
}

fn judge_one(grant: &McpGrant, m: Value) -> Result<Judged, Refused> {
    let Value::Object(obj) = m else {
        return Err(refuse(
            Value::Null,
            DenyCode::InvalidRequest,
            "a JSON-RPC message must be an object",
        ));
    };
    let id = obj.get("id").cloned();
    let answer_id = id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(refuse(
            answer_id,
            DenyCode::InvalidRequest,
            "jsonrpc must be \"2.0\"",
        ));
    }
    if matches!(&id, Some(v) if !(v.is_string() || v.is_i64() || v.is_u64())) {
        return Err(refuse(
            Value::Null,
            DenyCode::InvalidRequest,
            "id must be a string or an integer",
        ));
    }
    let Some(method) = obj.get("method") else {
        // A response to a server request (sampling, roots, elicitation).
        if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) {
            return Ok(Judged {
                id,
                method: None,
                tool: None,
                list: None,
            });
        }
        return Err(refuse(
            answer_id,
            DenyCode::InvalidRequest,
            "neither a request nor a response",
        ));
    };
    let Some(method) = method.as_str() else {
        return Err(refuse(
            answer_id,
            DenyCode::InvalidRequest,
            "method must be a string",
        ));
    };
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    let name_of = |field: &str| {
        params
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let mut judged = Judged {
        id: id.clone(),
        method: Some(method.to_string()),
        tool: None,
        list: None,
    };
    if id.is_none() {
        // A notification: only the known ones.
        if NOTIFICATIONS.contains(&method) {
            return Ok(judged);
        }
        return Err(refuse(
            Value::Null,
            DenyCode::MethodNotAllowed,
            format!("unknown notification `{}`", clip(method, 100)),
        ));
    }
    let list = |kind: Kind, templates: bool| ListFilter {
        id: answer_id.clone(),
        kind,
        templates,
    };
    match method {
        "initialize" | "ping" | "logging/setLevel" => {}
        "tools/list" => judged.list = Some(list(Kind::Tool, false)),
        "prompts/list" => judged.list = Some(list(Kind::Prompt, false)),
        "resources/list" => judged.list = Some(list(Kind::Resource, false)),
        "resources/templates/list" => judged.list = Some(list(Kind::Resource, true)),
        "tools/call" => {
            let Some(name) = name_of("name") else {
                return Err(refuse(
                    answer_id,
                    DenyCode::InvalidRequest,
                    "tools/call needs params.name",
                ));
            };
            if !grant.allows(Kind::Tool, &name) {
                return Err(refuse(
                    answer_id,
                    DenyCode::ToolNotAllowed,
                    format!("tool `{}` is not granted to this agent", clip(&name, 200)),
                ));
            }
            let args = params
                .get("arguments")
                .cloned()
                .unwrap_or(Value::Object(Map::new()));
            judged.tool = Some((name, args));
        }
        "prompts/get" => check_named(grant, Kind::Prompt, name_of("name"), &answer_id, "prompt")?,
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => check_named(
            grant,
            Kind::Resource,
            name_of("uri"),
            &answer_id,
            "resource",
        )?,
        "completion/complete" => {
            let r = params.get("ref");
            let (kind, name, what) = match r.and_then(|r| r.get("type")).and_then(Value::as_str) {
                Some("ref/prompt") => (Kind::Prompt, r.and_then(|r| r.get("name")), "prompt"),
                Some("ref/resource") => (Kind::Resource, r.and_then(|r| r.get("uri")), "resource"),
                _ => {
                    return Err(refuse(
                        answer_id,
                        DenyCode::InvalidRequest,
                        "completion/complete needs a prompt or resource ref",
                    ))
                }
            };
            check_named(
                grant,
                kind,
                name.and_then(Value::as_str).map(str::to_string),
                &answer_id,
                what,
            )?
        }
        other => {
            return Err(refuse(
                answer_id,
                DenyCode::MethodNotAllowed,
                format!(
                    "method `{}` is not allowed through the gateway",
                    clip(other, 100)
                ),
            ))
        }
    }
    Ok(judged)
}

fn check_named(
    grant: &McpGrant,
    kind: Kind,
    name: Option<String>,
    id: &Value,
    what: &str,
) -> Result<(), Refused> {
    let Some(name) = name else {
        return Err(refuse(
            id.clone(),
            DenyCode::InvalidRequest,
            format!("the request names no {what}"),
        ));
    };
    let allowed = if kind == Kind::Resource {
        let uri = ResourceUri::parse(&name).map_err(|e| {
            refuse(
                id.clone(),
                DenyCode::InvalidPath,
                format!(
                    "resource `{}` is refused as ambiguous: {e}",
                    clip(&name, 200)
                ),
            )
        })?;
        grant.resource_matcher().allows(&uri)
    } else {
        grant.allows(kind, &name)
    };
    if allowed {
        Ok(())
    } else {
        let code = if kind == Kind::Tool {
            DenyCode::ToolNotAllowed
        } else {
            DenyCode::PathNotAllowed
        };
        Err(refuse(
            id.clone(),
            code,
            format!("{what} `{}` is not granted to this agent", clip(&name, 200)),
        ))
    }
}

/// The JSON-RPC error answering a refused message: same id; `error.data`
/// carries the Loopgate code, `retryable` and, when known, `retry_after`.
pub fn error_response(id: &Value, deny: &Deny, request_id: &str) -> Value {
    let code = match deny.code {
        DenyCode::InvalidJson => -32700,
        DenyCode::InvalidRequest => -32600,
        DenyCode::MethodNotAllowed => -32601,
        _ => -32001,
    };
    let mut data = json!({
        "loopgate_code": deny.code.as_str(),
        "retryable": deny.retryable,
        "request_id": request_id,
    });
    if let Some(after) = deny.retry_after {
        data["retry_after"] = json!(after.as_secs().max(1));
    }
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": deny.message, "data": data },
    })
}

/// Removes `noise` keys at any depth (request ids, timestamps) so that two
/// calls with the same meaning fingerprint the same.
pub fn strip_noise(v: &mut Value, noise: &[String]) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !noise.iter().any(|n| n == k));
            m.values_mut().for_each(|x| strip_noise(x, noise));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip_noise(x, noise)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grant(tools: &[&str]) -> McpGrant {
        McpGrant {
            tools: PatternList::parse(tools).unwrap(),
            prompts: PatternList::parse(&["greet"]).unwrap(),
            resources: PatternList::parse(&["file:///public/*"]).unwrap(),
        }
    }

    fn msg(method: &str, params: Value) -> Vec<u8> {
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn calls_are_judged_by_the_grant() {
        let g = grant(&["read_file", "search*"]);
        let ok = judge(
            &g,
            &msg(
                "tools/call",
                json!({"name": "search_docs", "arguments": {"q": "x"}}),
            ),
        )
        .unwrap();
        assert_eq!(
            ok.messages[0].tool,
            Some(("search_docs".into(), json!({"q": "x"})))
        );
        let err = judge(&g, &msg("tools/call", json!({"name": "delete_file"}))).unwrap_err();
        assert_eq!(
            (err.id, err.deny.code, err.deny.retryable),
            (json!(7), DenyCode::ToolNotAllowed, false)
        );
        let err = judge(&g, &msg("sampling/createMessage", json!({}))).unwrap_err();
        assert_eq!(err.deny.code, DenyCode::MethodNotAllowed);
        assert!(judge(&g, &msg("prompts/get", json!({"name": "greet"}))).is_ok());
        assert!(judge(
            &g,
            &msg("resources/read", json!({"uri": "file:///secret/k"}))
        )
        .is_err());
        assert!(judge(
            &g,
            &msg("resources/read", json!({"uri": "file:///public/a"}))
        )
        .is_ok());
        assert_eq!(
            judge(&g, b"{nope").unwrap_err().deny.code,
            DenyCode::InvalidJson
        );
        assert_eq!(
            judge(&g, br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#)
                .unwrap_err()
                .deny
                .code,
            DenyCode::InvalidRequest
        );
    }

    #[test]
    fn a_batch_is_all_or_nothing_and_notifications_and_responses_pass() {
        let g = grant(&["read_file"]);
        let body = json!([
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": "a", "result": {}},
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file"}},
        ]);
        let j = judge(&g, body.to_string().as_bytes()).unwrap();
        assert!(j.batch && j.messages.len() == 3);
        let body = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file"}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "rm"}},
        ]);
        let err = judge(&g, body.to_string().as_bytes()).unwrap_err();
        assert_eq!(
            (err.id, err.deny.code),
            (json!(2), DenyCode::ToolNotAllowed)
        );
        assert!(judge(&g, b"[]").is_err());
        assert!(judge(&g, br#"{"jsonrpc":"2.0","method":"notifications/evil"}"#).is_err());
    }

    #[test]
    fn duplicate_keys_are_refused_wherever_they_are() {
        let g = grant(&["read_file"]);
        let cases = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_file","name":"read_file"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"read_file"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"params":{"name":"read_file"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///secret/k","uri":"file:///public/a"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"p":"/etc"},"arguments":{"p":"/tmp"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"a":[{"b":{"c":1,"c":2}}]}}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","method":"ping"}]"#,
        ];
        for c in cases {
            let err = judge(&g, c.as_bytes()).unwrap_err();
            assert_eq!(err.deny.code, DenyCode::InvalidJson, "{c}");
            assert_eq!(err.id, Value::Null, "{c}");
            assert!(
                err.deny.message.contains("duplicate key `"),
                "{}",
                err.deny.message
            );
        }
        let err = judge(&g, cases[0].as_bytes()).unwrap_err();
        assert!(err.deny.message.contains("`name`"), "{}", err.deny.message);
    }

    #[test]
    fn too_deep_bodies_are_invalid_json() {
        let g = grant(&["read_file"]);
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"read_file","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        let err = judge(&g, deep.as_bytes()).unwrap_err();
        assert_eq!(err.deny.code, DenyCode::InvalidJson);
        assert!(
            err.deny.message.contains("deeper than 64"),
            "{}",
            err.deny.message
        );
        let err = judge(&g, "[".repeat(100_000).as_bytes()).unwrap_err();
        assert_eq!(err.deny.code, DenyCode::InvalidJson);
    }

    fn read(g: &McpGrant, method: &str, uri: &str) -> Result<Judgement, Refused> {
        let params = match method {
            "completion/complete" => json!({
                "ref": {"type": "ref/resource", "uri": uri},
                "argument": {"name": "n", "value": "v"}
            }),
            _ => json!({ "uri": uri }),
        };
        judge(g, &msg(method, params))
    }

    const RESOURCE_METHODS: [&str; 4] = [
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
    ];

    #[test]
    fn resource_escapes_are_refused_as_invalid_paths() {
        let g = grant(&[]);
        for method in RESOURCE_METHODS {
            for uri in [
                "file:///public/../secret/k",
                "file:///public/%2e%2e/secret/k",
                "file:///public/%2E%2E/secret/k",
                "file:///public/..%2fsecret/k",
                "file:///public/%2e%2e%2fsecret/k",
                "file:///public/./../../secret/k",
                "file:///public/..\\secret/k",
                "file:///public/..%5csecret/k",
                "file:///public/..;/secret/k",
                "file:///public/%2e%2e%3b/secret/k",
                "file:///public/%252e%252e/secret/k",
                "file:///public//a",
                "file:///public/a%00",
                "file:///public/a%zz",
                "/public/a",
            ] {
                let err = read(&g, method, uri).unwrap_err();
                assert_eq!(err.deny.code, DenyCode::InvalidPath, "{method} {uri}");
                assert_eq!(err.id, json!(7));
                assert!(
                    err.deny.message.contains("refused as ambiguous: "),
                    "{}",
                    err.deny.message
                );
            }
            for uri in ["file:///public-x/a", "file:///public", "file:///secret/k"] {
                let err = read(&g, method, uri).unwrap_err();
                assert_eq!(err.deny.code, DenyCode::PathNotAllowed, "{method} {uri}");
            }
            for uri in [
                "file:///public/a",
                "FILE:///public/a",
                "file:///public/a/b",
                "file:///public/a/",
                "file:///public/%61",
            ] {
                assert!(read(&g, method, uri).is_ok(), "{method} {uri}");
            }
        }
        assert!(g.allows(Kind::Resource, "file:///public/a"));
        assert!(!g.allows(Kind::Resource, "file:///public/../a"));
        assert!(!g.allows(Kind::Resource, "file:///public-x/a"));
    }

    #[test]
    fn string_prefix_resource_entries_admit_nothing() {
        let g = McpGrant {
            tools: PatternList::default(),
            prompts: PatternList::default(),
            resources: PatternList::parse(&["file:///public*", "ui://*"]).unwrap(),
        };
        assert_eq!(g.validate().unwrap_err().0, 0);
        assert!(!g.allows(Kind::Resource, "file:///public-x/a"));
        assert!(!g.allows(Kind::Resource, "file:///public/a"));
        assert!(g.allows(Kind::Resource, "ui://w/a"));
        assert!(grant(&[]).validate().is_ok());
    }

    #[test]
    fn resource_lists_and_template_lists_follow_the_same_rule() {
        let g = grant(&[]);
        let mut result = json!({"resources": [
            {"uri": "file:///public/a"}, {"uri": "file:///public/../secret"},
            {"uri": "file:///public-x/a"}, {"uri": "FILE:///public/b"}, {"name": "no uri"},
        ]});
        let f = ListFilter {
            id: json!(1),
            kind: Kind::Resource,
            templates: false,
        };
        assert_eq!(g.filter_list(&f, &mut result), 3);
        assert_eq!(
            result["resources"],
            json!([{"uri": "file:///public/a"}, {"uri": "FILE:///public/b"}])
        );
        let mut result = json!({"resourceTemplates": [
            {"uriTemplate": "file:///public/{path}"}, {"uriTemplate": "file:///{path}"},
        ]});
        let f = ListFilter {
            templates: true,
            ..f
        };
        assert_eq!(g.filter_list(&f, &mut result), 1);
    }

    #[test]
    fn error_responses_carry_the_code() {
        let d = Deny::new(DenyCode::ToolNotAllowed, "no").never_retryable();
        let e = error_response(&json!(3), &d, "req-1");
        assert_eq!(e["id"], 3);
        assert_eq!(e["error"]["data"]["loopgate_code"], "tool_not_allowed");
        assert_eq!(e["error"]["data"]["retryable"], false);
    }

    #[test]
    fn noise_is_stripped_at_any_depth() {
        let mut v = json!({"q": "x", "request_id": 1, "inner": [{"timestamp": 2, "k": 3}]});
        strip_noise(&mut v, &["request_id".into(), "timestamp".into()]);
        assert_eq!(v, json!({"q": "x", "inner": [{"k": 3}]}));
    }

    proptest! {
        /// For random grants and tool sets, listing and calling never disagree:
        /// a tool is in the filtered list exactly when calling it is allowed.
        #[test]
        fn listing_and_calling_never_disagree(
            patterns in proptest::collection::vec("[a-c]{0,3}\\*?", 0..4),
            tools in proptest::collection::vec("[a-c_]{1,5}", 0..12),
            cursor in proptest::option::of("[a-z0-9]{1,8}"),
        ) {
            let Ok(list) = PatternList::parse(&patterns) else { return Ok(()); };
            let g = McpGrant { tools: list, prompts: PatternList::parse::<&str>(&[]).unwrap(), resources: PatternList::parse::<&str>(&[]).unwrap() };
            let mut result = json!({"tools": tools.iter().map(|t| json!({"name": t, "inputSchema": {}})).collect::<Vec<_>>()});
            if let Some(c) = &cursor { result["nextCursor"] = json!(c); }
            let f = ListFilter { id: json!(1), kind: Kind::Tool, templates: false };
            g.filter_list(&f, &mut result);
            let listed: Vec<&str> = result["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
            for t in &tools {
                let call = judge(&g, &msg("tools/call", json!({"name": t}))).is_ok();
                prop_assert_eq!(call, listed.contains(&t.as_str()), "tool {}", t);
            }
            prop_assert_eq!(result.get("nextCursor").and_then(Value::as_str), cursor.as_deref());
        }

        /// The same for resources: a URI is listed exactly when reading it
        /// is allowed, whatever its (possibly hostile) spelling.
        #[test]
        fn resource_listing_and_reading_never_disagree(
            patterns in proptest::collection::vec(prop_oneof![
                Just("file:///public/*"), Just("file:///public*"), Just("file:///a/b"),
                Just("file:*"), Just("*"), Just("FILE:///A/*"),
            ], 0..3),
            uris in proptest::collection::vec(
                "(file|FILE|x):///?(public|public-x|a|A|\\.\\.|%2e|%2f|%2E%2e|b|%61|%252e)?(/(public|a|b|\\.\\.|%2e%2e|%5c|;|)){0,3}/?",
                0..10,
            ),
        ) {
            let Ok(list) = PatternList::parse(&patterns) else { return Ok(()); };
            let g = McpGrant { tools: PatternList::default(), prompts: PatternList::default(), resources: list };
            let mut result = json!({"resources": uris.iter().map(|u| json!({"uri": u})).collect::<Vec<_>>()});
            let f = ListFilter { id: json!(1), kind: Kind::Resource, templates: false };
            g.filter_list(&f, &mut result);
            let listed: Vec<&str> = result["resources"].as_array().unwrap().iter().map(|t| t["uri"].as_str().unwrap()).collect();
            for u in &uris {
                let read = judge(&g, &msg("resources/read", json!({"uri": u}))).is_ok();
                prop_assert_eq!(read, listed.contains(&u.as_str()), "uri {}", u);
                prop_assert_eq!(read, g.allows(Kind::Resource, u), "uri {}", u);
            }
        }
    }
}
