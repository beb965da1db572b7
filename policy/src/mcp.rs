//! MCP (Model Context Protocol) authorization: pure rules over JSON-RPC
//! messages, shared by listing and calling so the two can never disagree.
//!
//! This file owns the MCP rules: [`McpGrant::allows`] is the one rule
//! function (`tools/call` of a tool is allowed exactly when `tools/list`
//! would show it, and the same for prompts and resources), and [`judge`]
//! reads a client POST once and judges every message in it. Everything the
//! gateway does not know is refused: unknown methods, malformed messages, a
//! batch with any refused element.
//!
//! What it leans on, and why:
//! - [`crate::json`] parses the body (one pass): a duplicated key anywhere
//!   is refused (`invalid_json`), since a first-wins server would run what
//!   a last-wins judge never saw; so is nesting deeper than
//!   [`crate::json::MAX_DEPTH`].
//! - [`crate::uri`] reads resource URIs: an ambiguous one (`..`, `%2f`, `\`)
//!   is `invalid_path`; grants match canonical URIs by path segments.
//! - [`JudgeLimits`] caps a batch (default [`DEFAULT_MAX_BATCH`]), and ids
//!   are unique among a batch's requests, so that every response maps back
//!   to one request: [`ListFilters`] finds the list request a response
//!   answers by id in O(1), keeping the response rewrite linear.
//! - [`Judgement`] carries all the gateway needs afterwards (ids, methods,
//!   the tool calls and their arguments, canonical resources), so the body
//!   is never parsed again.

use crate::decision::{clip, Deny, DenyCode};
use crate::json::JsonError;
use crate::pattern::PatternList;
#[cfg(doc)]
use crate::uri::ResourcePattern;
use crate::uri::{ResourceMatcher, ResourceUri};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// What one agent may use on one MCP server.
#[derive(Debug, Clone)]
pub struct McpGrant {
    /// Tool names (`tools/list`, `tools/call`).
    pub tools: PatternList,
    /// Prompt names (`prompts/list`, `prompts/get`, completion refs).
    pub prompts: PatternList,
    /// Resource URIs, read as [`ResourcePattern`]s (`resources/*`,
    /// completion refs).
    pub resources: PatternList,
}

/// The three kinds of things a server lists and an agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `tools/*`.
    Tool,
    /// `prompts/*`.
    Prompt,
    /// `resources/*`.
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
    /// The request's JSON-RPC id (a string or an integer).
    pub id: Value,
    /// What it lists.
    pub kind: Kind,
    /// `resources/templates/list` (items named by `uriTemplate`).
    pub templates: bool,
}

/// A JSON-RPC id as a map key: strings and integers stay distinct (`1` and
/// `"1"` are different ids). An integral float (`1.0`, `1e0`) is the integer
/// it equals, as JavaScript clients read it, so a server cannot dodge a
/// list filter by respelling the id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RpcId {
    /// A number id.
    Int(i128),
    /// A string id.
    Str(String),
}

impl RpcId {
    /// The key of `id`; `None` for what is not a string or an integral
    /// number.
    pub fn from_value(id: &Value) -> Option<RpcId> {
        match id {
            Value::String(s) => Some(RpcId::Str(s.clone())),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Some(RpcId::Int(i.into()))
                } else if let Some(u) = n.as_u64() {
                    Some(RpcId::Int(u.into()))
                } else {
                    let f = n.as_f64()?;
                    // Exactly integral and within u64/i64 range.
                    (f.fract() == 0.0 && f.abs() < 1.8e19).then_some(RpcId::Int(f as i128))
                }
            }
            _ => None,
        }
    }
}

/// The list requests of one POST, by id: which filter a response (or each
/// element of a response batch) needs, in O(1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilters {
    by_id: HashMap<RpcId, ListFilter>,
}

impl ListFilters {
    /// No filters.
    pub fn new() -> ListFilters {
        ListFilters::default()
    }

    /// Adds `f`; false (and nothing changes) when its id is not a string or
    /// an integer, or is already there.
    pub fn insert(&mut self, f: ListFilter) -> bool {
        let Some(key) = RpcId::from_value(&f.id) else {
            return false;
        };
        match self.by_id.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(f);
                true
            }
        }
    }

    /// The filter for the response with this `id`, if it answers a list
    /// request.
    pub fn get(&self, id: &Value) -> Option<&ListFilter> {
        self.by_id.get(&RpcId::from_value(id)?)
    }

    /// How many list requests.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// No list requests.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Drops every filter (dry-run: lists pass unfiltered).
    pub fn clear(&mut self) {
        self.by_id.clear();
    }

    /// The filters, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &ListFilter> {
        self.by_id.values()
    }
}

impl FromIterator<ListFilter> for ListFilters {
    fn from_iter<I: IntoIterator<Item = ListFilter>>(iter: I) -> ListFilters {
        let mut f = ListFilters::new();
        for x in iter {
            f.insert(x);
        }
        f
    }
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
    /// The id; `None` for a notification.
    pub id: Option<Value>,
    /// The method; `None` for a response to a server request.
    pub method: Option<String>,
    /// `tools/call`: the tool and its arguments (`{}` when absent), moved
    /// out of the parsed body, never cloned.
    pub tool: Option<(String, Value)>,
    /// A `*/list` request: how to filter its result.
    pub list: Option<ListFilter>,
    /// A message naming a resource: its canonical URI
    /// ([`ResourceUri::as_str`]).
    pub resource: Option<String>,
}

impl Judged {
    /// Is this a `tools/call`?
    pub fn is_call(&self) -> bool {
        self.tool.is_some()
    }
}

/// What a client POST carries: everything the gateway needs from the body,
/// from its one parse.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The messages, in order (one unless `batch`).
    pub messages: Vec<Judged>,
    /// The body was a JSON array (answers go in an array too).
    pub batch: bool,
}

impl Judgement {
    /// The first `tools/call`, if any (what the loop guard fingerprints).
    pub fn first_call(&self) -> Option<&Judged> {
        self.messages.iter().find(|m| m.is_call())
    }

    /// Every `tools/call`: tool name and arguments, in order.
    pub fn calls(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.messages
            .iter()
            .filter_map(|m| m.tool.as_ref().map(|(t, a)| (t.as_str(), a)))
    }

    /// The id a refusal of the whole POST answers: the first `tools/call`'s,
    /// else a lone message's, else `null`.
    pub fn answer_id(&self) -> Value {
        let first = self.first_call().or(match self.batch {
            false => self.messages.first(),
            true => None,
        });
        first.and_then(|m| m.id.clone()).unwrap_or(Value::Null)
    }

    /// One word for logs and metrics: `batch` for a batch, else the
    /// method (always one the judge knows, so a bounded label), else
    /// `response`.
    pub fn method_summary(&self) -> &str {
        if self.batch {
            return "batch";
        }
        self.messages
            .first()
            .and_then(|m| m.method.as_deref())
            .unwrap_or("response")
    }

    /// The list requests, by id, for the response rewrite.
    pub fn list_filters(&self) -> ListFilters {
        self.messages
            .iter()
            .filter_map(|m| m.list.clone())
            .collect()
    }

    /// Does any message `initialize`?
    pub fn initializes(&self) -> bool {
        self.messages
            .iter()
            .any(|m| m.method.as_deref() == Some("initialize"))
    }
}

/// A refused message: the JSON-RPC id to answer, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// The id of the refused message (`null` when it has none or it could
    /// not be trusted).
    pub id: Value,
    /// Why.
    pub deny: Deny,
    /// The refused message's method (clipped), when it had one: for the
    /// audit log, never judged again.
    pub method: Option<Box<str>>,
    /// A refused `tools/call`'s tool name (clipped), likewise.
    pub tool: Option<Box<str>>,
}

/// The largest batch [`judge`] accepts by default. MCP clients batch a
/// handful of messages at most (the 2025-06-18 revision dropped batches
/// altogether); 100 leaves room while bounding the work one POST can ask.
pub const DEFAULT_MAX_BATCH: usize = 100;

/// Bounds on one POST, beyond the body size the gateway caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JudgeLimits {
    /// The most messages in a batch; larger is `invalid_request`. 0 refuses
    /// every batch.
    pub max_batch: usize,
}

impl Default for JudgeLimits {
    /// `max_batch`: [`DEFAULT_MAX_BATCH`].
    fn default() -> JudgeLimits {
        JudgeLimits {
            max_batch: DEFAULT_MAX_BATCH,
        }
    }
}

/// Client-to-server notifications the gateway passes.
const NOTIFICATIONS: &[&str] = &[
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// [`judge_with`] under [`JudgeLimits::default`].
pub fn judge(grant: &McpGrant, body: &[u8]) -> Result<Judgement, Refused> {
    judge_with(grant, body, &JudgeLimits::default())
}

/// Judges a client POST body: every message must be allowed, or the first
/// refusal is returned (a batch is all or nothing). Refused before any
/// message is judged: a body that is not strict JSON ([`crate::json`]:
/// duplicate keys, too deep) with `invalid_json`; an empty batch, or one
/// over `limits.max_batch`, with `invalid_request`. Two requests of one
/// batch with the same id are `invalid_request` ("duplicate id in batch"):
/// a response could then be matched to the wrong request. Linear in the
/// body.
pub fn judge_with(
    grant: &McpGrant,
    body: &[u8],
    limits: &JudgeLimits,
) -> Result<Judgement, Refused> {
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
        Value::Array(items) if items.len() > limits.max_batch => {
            return Err(refuse(
                Value::Null,
                DenyCode::InvalidRequest,
                format!(
                    "batch of {} messages exceeds the limit of {}",
                    items.len(),
                    limits.max_batch
                ),
            ))
        }
        Value::Array(items) => (items, true),
        other => (vec![other], false),
    };
    let mut judge = Judge {
        grant,
        resources: None,
        ids: HashSet::with_capacity(items.len()),
    };
    let mut messages = Vec::with_capacity(items.len());
    for m in items {
        messages.push(judge.one(m)?);
    }
    Ok(Judgement { messages, batch })
}

fn refuse(id: Value, code: DenyCode, message: impl Into<String>) -> Refused {
    Refused {
        id,
        deny: Deny::new(code, message).never_retryable(),
        method: None,
        tool: None,
    }
}

/// One POST's judging state.
struct Judge<'g> {
    grant: &'g McpGrant,
    /// The grant's resource entries, read at the first resource.
    resources: Option<ResourceMatcher>,
    /// The request ids seen so far.
    ids: HashSet<RpcId>,
}

/// A string field of `params`.
fn field<'v>(params: Option<&'v Value>, name: &str) -> Option<&'v str> {
    params?.get(name)?.as_str()
}

impl Judge<'_> {
    fn one(&mut self, m: Value) -> Result<Judged, Refused> {
        let Value::Object(mut obj) = m else {
            return Err(refuse(
                Value::Null,
                DenyCode::InvalidRequest,
                "a JSON-RPC message must be an object",
            ));
        };
        // The id first: an id that is not one is never echoed back.
        let id = obj.remove("id");
        if matches!(&id, Some(v) if !(v.is_string() || v.is_i64() || v.is_u64())) {
            return Err(refuse(
                Value::Null,
                DenyCode::InvalidRequest,
                "id must be a string or an integer",
            ));
        }
        let answer_id = id.clone().unwrap_or(Value::Null);
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(refuse(
                answer_id,
                DenyCode::InvalidRequest,
                "jsonrpc must be \"2.0\"",
            ));
        }
        let judged = Judged {
            id,
            method: None,
            tool: None,
            list: None,
            resource: None,
        };
        let method = match obj.remove("method") {
            Some(Value::String(m)) => m,
            Some(_) => {
                return Err(refuse(
                    answer_id,
                    DenyCode::InvalidRequest,
                    "method must be a string",
                ))
            }
            // A response to a server request (sampling, roots, elicitation).
            None if judged.id.is_some()
                && (obj.contains_key("result") || obj.contains_key("error")) =>
            {
                return Ok(judged)
            }
            None => {
                return Err(refuse(
                    answer_id,
                    DenyCode::InvalidRequest,
                    "neither a request nor a response",
                ))
            }
        };
        let mut judged = self
            .method(judged, &method, obj, answer_id)
            .map_err(|mut r| {
                r.method = Some(clip(&method, 64).into());
                r
            })?;
        judged.method = Some(method);
        Ok(judged)
    }

    /// The part of [`Judge::one`] after the method was read.
    fn method(
        &mut self,
        mut judged: Judged,
        method: &str,
        mut obj: Map<String, Value>,
        answer_id: Value,
    ) -> Result<Judged, Refused> {
        let Some(key) = judged.id.as_ref().and_then(RpcId::from_value) else {
            // A notification: only the known ones.
            if NOTIFICATIONS.contains(&method) {
                return Ok(judged);
            }
            return Err(refuse(
                Value::Null,
                DenyCode::MethodNotAllowed,
                format!("unknown notification `{}`", clip(method, 100)),
            ));
        };
        if !self.ids.insert(key) {
            return Err(refuse(
                answer_id,
                DenyCode::InvalidRequest,
                "duplicate id in batch",
            ));
        }
        let mut params = obj.remove("params");
        let list = |kind: Kind, templates: bool| {
            Some(ListFilter {
                id: answer_id.clone(),
                kind,
                templates,
            })
        };
        match method {
            "initialize" | "ping" | "logging/setLevel" => {}
            "tools/list" => judged.list = list(Kind::Tool, false),
            "prompts/list" => judged.list = list(Kind::Prompt, false),
            "resources/list" => judged.list = list(Kind::Resource, false),
            "resources/templates/list" => judged.list = list(Kind::Resource, true),
            "tools/call" => {
                let Some(name) = field(params.as_ref(), "name") else {
                    return Err(refuse(
                        answer_id,
                        DenyCode::InvalidRequest,
                        "tools/call needs params.name",
                    ));
                };
                if !self.grant.allows(Kind::Tool, name) {
                    let mut r = refuse(
                        answer_id,
                        DenyCode::ToolNotAllowed,
                        format!("tool `{}` is not granted to this agent", clip(name, 200)),
                    );
                    r.tool = Some(clip(name, 128).into());
                    return Err(r);
                }
                let name = name.to_string();
                let args = params
                    .as_mut()
                    .and_then(Value::as_object_mut)
                    .and_then(|p| p.remove("arguments"))
                    .unwrap_or(Value::Object(Map::new()));
                judged.tool = Some((name, args));
            }
            "prompts/get" => {
                self.check_prompt(field(params.as_ref(), "name"), &answer_id)?;
            }
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                let uri = field(params.as_ref(), "uri");
                judged.resource = Some(self.check_resource(uri, &answer_id)?);
            }
            "completion/complete" => {
                let r = params.as_ref().and_then(|p| p.get("ref"));
                match r.and_then(|r| r.get("type")).and_then(Value::as_str) {
                    Some("ref/prompt") => self.check_prompt(field(r, "name"), &answer_id)?,
                    Some("ref/resource") => {
                        judged.resource = Some(self.check_resource(field(r, "uri"), &answer_id)?)
                    }
                    _ => {
                        return Err(refuse(
                            answer_id,
                            DenyCode::InvalidRequest,
                            "completion/complete needs a prompt or resource ref",
                        ))
                    }
                }
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

    fn check_prompt(&self, name: Option<&str>, id: &Value) -> Result<(), Refused> {
        let Some(name) = name else {
            return Err(refuse(
                id.clone(),
                DenyCode::InvalidRequest,
                "the request names no prompt",
            ));
        };
        if self.grant.allows(Kind::Prompt, name) {
            return Ok(());
        }
        Err(refuse(
            id.clone(),
            DenyCode::PathNotAllowed,
            format!("prompt `{}` is not granted to this agent", clip(name, 200)),
        ))
    }

    /// The canonical form of an allowed resource URI.
    fn check_resource(&mut self, uri: Option<&str>, id: &Value) -> Result<String, Refused> {
        let Some(uri) = uri else {
            return Err(refuse(
                id.clone(),
                DenyCode::InvalidRequest,
                "the request names no resource",
            ));
        };
        let parsed = ResourceUri::parse(uri).map_err(|e| {
            refuse(
                id.clone(),
                DenyCode::InvalidPath,
                format!("resource `{}` is refused as ambiguous: {e}", clip(uri, 200)),
            )
        })?;
        let grant = self.grant;
        let resources = self
            .resources
            .get_or_insert_with(|| grant.resource_matcher());
        if resources.allows(&parsed) {
            return Ok(parsed.as_str().to_string());
        }
        Err(refuse(
            id.clone(),
            DenyCode::PathNotAllowed,
            format!("resource `{}` is not granted to this agent", clip(uri, 200)),
        ))
    }
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
    use serde_json::json;

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

    fn list_batch(n: usize) -> Vec<u8> {
        let items: Vec<Value> = (0..n)
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"}))
            .collect();
        Value::Array(items).to_string().into_bytes()
    }

    #[test]
    fn batches_are_capped() {
        let g = grant(&["read_file"]);
        let j = judge(&g, &list_batch(DEFAULT_MAX_BATCH)).unwrap();
        assert_eq!(j.messages.len(), DEFAULT_MAX_BATCH);
        assert_eq!(j.list_filters().len(), DEFAULT_MAX_BATCH);
        let err = judge(&g, &list_batch(DEFAULT_MAX_BATCH + 1)).unwrap_err();
        assert_eq!(
            (err.id, err.deny.code, err.deny.message.as_str()),
            (
                Value::Null,
                DenyCode::InvalidRequest,
                "batch of 101 messages exceeds the limit of 100"
            )
        );
        let small = JudgeLimits { max_batch: 2 };
        assert!(judge_with(&g, &list_batch(2), &small).is_ok());
        assert!(judge_with(&g, &list_batch(3), &small).is_err());
        // A lone message is not a batch.
        let none = JudgeLimits { max_batch: 0 };
        assert!(judge_with(&g, &msg("ping", json!({})), &none).is_ok());
        assert!(judge_with(&g, &list_batch(1), &none).is_err());
    }

    #[test]
    fn a_huge_batch_is_refused_in_linear_time() {
        let g = grant(&["read_file"]);
        let body = list_batch(140_000);
        let t = std::time::Instant::now();
        let err = judge(&g, &body).unwrap_err();
        assert_eq!(err.deny.code, DenyCode::InvalidRequest);
        // Debug build, a loaded 2-core machine: generous, but far below
        // what a quadratic judge took.
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        let unlimited = JudgeLimits {
            max_batch: usize::MAX,
        };
        let t = std::time::Instant::now();
        let j = judge_with(&g, &body, &unlimited).unwrap();
        let filters = j.list_filters();
        for i in 0..140_000u64 {
            assert!(filters.get(&json!(i)).is_some());
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn duplicate_request_ids_in_a_batch_are_refused() {
        let g = grant(&["read_file"]);
        let body = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file"}},
        ]);
        let err = judge(&g, body.to_string().as_bytes()).unwrap_err();
        assert_eq!(
            (err.id, err.deny.code, err.deny.message.as_str()),
            (json!(1), DenyCode::InvalidRequest, "duplicate id in batch")
        );
        let body = json!([
            {"jsonrpc": "2.0", "id": "a", "method": "ping"},
            {"jsonrpc": "2.0", "id": "a", "method": "ping"},
        ]);
        assert!(judge(&g, body.to_string().as_bytes()).is_err());
        // `1` and `"1"` are different ids; notifications have none;
        // responses answer the server's ids, a separate space.
        let body = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": "1", "method": "prompts/list"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "result": {}},
        ]);
        let j = judge(&g, body.to_string().as_bytes()).unwrap();
        let f = j.list_filters();
        assert_eq!(f.len(), 2);
        assert_eq!(f.get(&json!(1)).map(|f| f.kind), Some(Kind::Tool));
        assert_eq!(f.get(&json!("1")).map(|f| f.kind), Some(Kind::Prompt));
        assert_eq!(f.get(&json!(1.0)).map(|f| f.kind), Some(Kind::Tool));
        assert_eq!(f.get(&json!(2)), None);
        assert_eq!(f.get(&json!(null)), None);
        assert_eq!(f.get(&json!({"id": 1})), None);
    }

    #[test]
    fn list_filters_key_ids_by_type() {
        let mut f = ListFilters::new();
        let lf = |id: Value| ListFilter {
            id,
            kind: Kind::Tool,
            templates: false,
        };
        assert!(f.insert(lf(json!(1))));
        assert!(f.insert(lf(json!("1"))));
        assert!(f.insert(lf(json!(-1))));
        assert!(f.insert(lf(json!(u64::MAX))));
        assert!(!f.insert(lf(json!(1))));
        assert!(!f.insert(lf(json!(null))));
        assert!(!f.insert(lf(json!(1.5))));
        assert_eq!(f.len(), 4);
        assert!(f.get(&json!(u64::MAX)).is_some());
        assert!(f.get(&json!(-1)).is_some());
        assert!(f.get(&json!(1.5)).is_none());
        assert!(f.get(&json!(1e300)).is_none());
        assert_eq!(f.iter().count(), 4);
        f.clear();
        assert!(f.is_empty());
    }

    #[test]
    fn the_judgement_carries_what_the_gateway_needs() {
        let g = grant(&["read_file", "search*"]);
        let body = json!([
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": "FILE:///public/%61"}},
            {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "search", "arguments": {"q": 1}}},
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "read_file"}},
        ]);
        let j = judge(&g, body.to_string().as_bytes()).unwrap();
        assert_eq!(j.method_summary(), "batch");
        let first = j.first_call().unwrap();
        assert_eq!(first.id, Some(json!("c")));
        assert_eq!(first.tool, Some(("search".into(), json!({"q": 1}))));
        assert_eq!(j.answer_id(), json!("c"));
        assert_eq!(
            j.calls().collect::<Vec<_>>(),
            vec![("search", &json!({"q": 1})), ("read_file", &json!({}))]
        );
        assert_eq!(j.messages[2].resource.as_deref(), Some("file:///public/a"));
        assert_eq!(
            j.messages[0].method.as_deref(),
            Some("notifications/initialized")
        );
        assert_eq!(j.messages[0].id, None);
        assert!(!j.initializes());

        let j = judge(&g, &msg("initialize", json!({}))).unwrap();
        assert_eq!(
            (j.method_summary(), j.answer_id(), j.initializes()),
            ("initialize", json!(7), true)
        );
        assert!(j.first_call().is_none());
        let j = judge(&g, br#"{"jsonrpc":"2.0","id":9,"result":{}}"#).unwrap();
        assert_eq!((j.method_summary(), j.answer_id()), ("response", json!(9)));
        let j = judge(&g, br#"[{"jsonrpc":"2.0","id":9,"method":"ping"}]"#).unwrap();
        assert_eq!((j.method_summary(), j.answer_id()), ("batch", Value::Null));
    }

    #[test]
    fn an_id_that_is_not_one_is_never_echoed() {
        let g = grant(&[]);
        for body in [
            r#"{"jsonrpc":"1.0","id":{"big":[1,2,3]},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
        ] {
            let err = judge(&g, body.as_bytes()).unwrap_err();
            assert_eq!(
                (err.id, err.deny.code),
                (Value::Null, DenyCode::InvalidRequest),
                "{body}"
            );
        }
        let err = judge(&g, br#"{"jsonrpc":"2.0","id":1,"method":7}"#).unwrap_err();
        assert_eq!(
            (err.id, err.deny.code),
            (json!(1), DenyCode::InvalidRequest)
        );
        let err = judge(&g, br#"{"jsonrpc":"2.0","id":1}"#).unwrap_err();
        assert_eq!(err.deny.code, DenyCode::InvalidRequest);
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
