//! Body inspection: the facts admission judges, taken from a JSON request
//! body in one pass.
//!
//! The body is walked once with serde and nothing is kept but the facts:
//! `messages` is counted, every string is scanned for blocked phrases in
//! place, never copied into a tree, so a multi-megabyte context costs one
//! pass. A judged field that appears twice at the top level is refused: a
//! provider might read the other copy than the gateway did; so is a key
//! that differs from a judged one only by case (`Tools`, `MAX_TOKENS`).
//!
//! # Text
//!
//! Every string value in the body except `model`, at any depth, and every
//! key below the top level, is scanned for blocked phrases: messages and
//! their tool results, `system`, `instructions`, `input`, `prompt`, tool
//! descriptions and parameter schemas, `response_format` and `text.format`
//! schemas, `metadata`; there is no list of text fields to fall behind the
//! providers. Strings are scanned after JSON unescaping (`\u0069gnore` is
//! `ignore`) and after [`crate::normalize`] (NFKC, case folding, invisible
//! characters removed, whitespace collapsed).
//!
//! # Prompt estimate
//!
//! The same pass counts what the budgets reserve for the prompt
//! ([`BodyFacts::estimated_prompt_tokens`]): every token-bearing part, not
//! only string values. [`BodyFacts::text_bytes`] is the bytes of every
//! string value scanned, at 4 bytes a token; [`BodyFacts::key_bytes`] of
//! every key of an object nested below a top-level field's items (a
//! message's content parts, a tool's function and its schema: a schema's
//! property names are read by the model as much as its descriptions), at
//! 3 bytes a token: keys are short words and identifiers, and generated
//! ones (hashed property names: hex tokenizes at about 2 bytes a token)
//! would otherwise be undercounted by half. The keys of a message or tool
//! object itself (`role`, `content`, `type`, `function`) are the chat
//! format's framing, which providers write with tokens of their own, and
//! of a top-level object (`metadata`) not prompt: neither is counted.
//! [`BodyFacts::counted_tokens`] is the parts counted as
//! tokens directly: a number inside a container at one token per three
//! digits (tokenizers split digit runs in threes), a fraction at three, a
//! `true`, `false` or `null` at one, and an integer under `input` or
//! `prompt` (embeddings' and completions' token ids, an array or arrays
//! of them) at exactly one. Top-level scalars (`max_tokens`,
//! `temperature`) are settings, not prompt, and are not counted.
//!
//! # Depth
//!
//! Containers nested deeper than [`MAX_DEPTH`] (the top-level object is
//! level 1) are refused with `invalid_json`, in every field, judged or not,
//! as the walk descends: a deep body is refused after reading at most
//! [`MAX_DEPTH`] levels, never by exhausting the stack, and nothing deeper
//! than that reaches a later parse.
//!
//! # Tools
//!
//! Every field through which a request can hand the model a tool is read,
//! and each tool becomes one [`ToolUse`] whose [`ToolUse::id`] is what a
//! tool grant (`tools:` in the config) must match:
//!
//! | where | shape | kind | id |
//! | --- | --- | --- | --- |
//! | `tools[*]` | no `type`, or `type` `function` / `custom` | function | its name: `function.name` (OpenAI chat), `custom.name`, or `name` (Responses, Anthropic) |
//! | `tools[*]` | `type` `mcp` (OpenAI Responses) | MCP | `mcp:<server_label>@<server_url or connector_id>` |
//! | `tools[*]` | any other `type` (Anthropic server tools such as `web_search_20250305`, Responses built-ins such as `web_search_preview`, `file_search`, `code_interpreter`, `computer_use_preview`, `image_generation`, `local_shell`) | built-in | the `type`, whatever its `name` says: the provider dispatches on the type |
//! | `functions[*]` (legacy OpenAI) | `{"name": ...}` | function | the name |
//! | `mcp_servers[*]` (Anthropic) | `{"name": ..., "url": ...}` | MCP | `mcp:<name>@<url>` |
//! | `web_search_options` (OpenAI chat, search models) | an object (`{}` included) | built-in | `web_search` |
//!
//! So an MCP connector is granted by label and address together, e.g.
//! `mcp:github@https://api.githubcopilot.com/mcp/`, a family with a prefix
//! (`mcp:github@https://api.githubcopilot.com/*`), or every connector with
//! `mcp:*`; a grant of `*` admits every tool, connectors included. A
//! connector grant admits all of that server's tools. Labels may not hold
//! `@`, and function names may not start with `mcp:`, so no identity can
//! pass for another.
//!
//! `tool_choice` (every provider's form, `allowed_tools` lists included)
//! and the legacy `function_call` must name a tool the request declares:
//! one that is declared is judged with the rest, one that is not is
//! refused. A tool-bearing shape the gateway cannot read (a `tools` entry
//! that is not an object, a tool with neither name nor type, two different
//! names in one tool, `functions` not an array, a connector without label
//! or address) is refused with `invalid_request` naming the field, and so is
//! any other top-level field whose name mentions `tool`, `function` or `mcp`
//! (other than `parallel_tool_calls` and `max_tool_calls`), and a Responses
//! stored prompt (`prompt` as an object), which can carry tools and text the
//! gateway never sees.
//!
//! # Output tokens
//!
//! [`BodyFacts::max_tokens`] is whichever of `max_tokens`,
//! `max_completion_tokens`, `max_output_tokens` the body sets (two set are
//! refused: providers differ in which they obey); [`BodyFacts::n`] the
//! largest of `n` and `best_of` (each a positive integer when present): the
//! request may cost `max_tokens × n` output tokens. When the body bounds
//! nothing, [`BodyFacts::max_tokens_field`] names the field the gateway
//! inserts the agent's limit under by default; the field and value each
//! attempt's target gets are decided per attempt ([`crate::output`]).

use crate::decision::{Deny, DenyCode};
use crate::endpoint::Endpoint;
use crate::output::{LimitField, LimitFields};
use crate::phrases::{PhraseMatcher, PhraseSearch};
use crate::tokens::{Token, TokenSink};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Containers may nest this deep, the top-level object being level 1.
pub const MAX_DEPTH: usize = 64;

/// How a tool reaches the model, which decides how it is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// A function the agent implements: named by its name.
    Function,
    /// A tool the provider runs (Anthropic server tools, Responses
    /// built-ins): named by its `type`.
    BuiltIn,
    /// A remote MCP server handed to the provider: `mcp:<label>@<address>`.
    Mcp,
}

/// One tool a request gives the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolUse {
    pub kind: ToolKind,
    /// What a tool grant must match (see the module docs).
    pub id: String,
    /// The top-level field that declared it: `tools`, `functions`,
    /// `mcp_servers` or `web_search_options`.
    pub field: &'static str,
}

impl ToolUse {
    /// A function tool declared in `tools`.
    pub fn function(name: &str) -> ToolUse {
        ToolUse {
            kind: ToolKind::Function,
            id: name.to_string(),
            field: "tools",
        }
    }
}

/// What admission learned from a body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BodyFacts {
    pub model: String,
    /// `"stream": true` was requested.
    pub stream: bool,
    /// Number of entries in `messages`, when present.
    pub messages: Option<usize>,
    /// Every tool the request gives the model, from every tool-bearing
    /// field, in body order (see the module docs for how each is named).
    pub tools: Vec<ToolUse>,
    /// The output limit per completion: `max_tokens`, `max_completion_tokens`
    /// or `max_output_tokens`, whichever the body sets (two are refused).
    pub max_tokens: Option<u64>,
    /// The field that set [`BodyFacts::max_tokens`].
    pub limit_field: Option<LimitField>,
    /// Every output-limit field at the top level, numbers or `null`.
    pub limit_fields: LimitFields,
    /// Where a max-tokens limit goes when the body sets none: the field
    /// present as `null`, if any (its value is to be replaced), else the
    /// endpoint's [`Endpoint::max_tokens_field`]. `None` for endpoints with
    /// no output to bound (embeddings).
    pub max_tokens_field: Option<&'static str>,
    /// Completions asked for: the largest of `n` and `best_of` (at least 1);
    /// `None` when the body sets neither.
    pub n: Option<u64>,
    /// Bytes of every string value scanned (all but `model`).
    pub text_bytes: usize,
    /// Bytes of every key of an object nested below a top-level field's
    /// items (see the module docs).
    pub key_bytes: usize,
    /// Tokens counted directly rather than from text: numbers, literals
    /// and token ids inside containers (see the module docs).
    pub counted_tokens: u64,
    /// The first blocked phrase found in that text (index into the matcher).
    pub blocked_phrase: Option<usize>,
}

impl BodyFacts {
    /// A rough prompt size in tokens (4 bytes of text or 3 of keys per
    /// token, plus the tokens counted directly), used to reserve budgets
    /// and rate-limit capacity before the provider reports real usage.
    pub fn estimated_prompt_tokens(&self) -> u64 {
        (self.text_bytes as u64)
            .div_ceil(4)
            .saturating_add((self.key_bytes as u64).div_ceil(3))
            .saturating_add(self.counted_tokens)
            .max(1)
    }

    /// Completions the request asks for (1 unless `n` / `best_of` say more).
    pub fn choices(&self) -> u64 {
        self.n.unwrap_or(1).max(1)
    }

    /// Output tokens the body allows: `max_tokens × n`, when it bounds them.
    pub fn output_tokens(&self) -> Option<u64> {
        self.max_tokens.map(|m| m.saturating_mul(self.choices()))
    }
}

impl Endpoint {
    /// The top-level field that bounds output tokens on this endpoint, the
    /// one the gateway inserts an agent's limit under: `max_tokens` for chat
    /// completions, completions and Anthropic messages (read by every
    /// OpenAI-compatible server, where `max_completion_tokens` is not),
    /// `max_output_tokens` for responses; `None` where there is no output.
    pub fn max_tokens_field(self) -> Option<&'static str> {
        match self {
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Messages => {
                Some("max_tokens")
            }
            Endpoint::Responses => Some("max_output_tokens"),
            // count_tokens takes no output limit: it writes nothing.
            Endpoint::Embeddings | Endpoint::CountTokens | Endpoint::Models => None,
        }
    }
}

/// Checks the body of `endpoint` and extracts its facts, scanning text with
/// `phrases` when given.
///
/// Refuses, with the code in parentheses: bodies that are not one JSON
/// object, duplicate or case-variant judged fields, nesting deeper than
/// [`MAX_DEPTH`] (`invalid_json`); no usable `model` (`missing_model`);
/// `messages` missing or not an array where required (`invalid_messages`);
/// malformed max-tokens fields, `n`, `best_of`, tool-bearing fields, a
/// `tool_choice` naming an undeclared tool (`invalid_request`).
pub fn inspect_body(
    endpoint: Endpoint,
    body: &[u8],
    phrases: Option<&PhraseMatcher>,
) -> Result<BodyFacts, Deny> {
    inspect_body_with(endpoint, body, phrases, &mut NoTokens)
}

/// A sink that takes nothing: [`inspect_body`]'s, compiled away.
pub struct NoTokens;

impl TokenSink for NoTokens {
    #[inline(always)]
    fn token(&mut self, _: Token<'_>) {}
}

/// [`inspect_body`], handing every token of the body, in order, to `sink`
/// as the one pass reads it (for the loop guard's fingerprint). What
/// `sink` has seen of a refused body is partial.
pub fn inspect_body_with<'a, S: TokenSink + ?Sized>(
    endpoint: Endpoint,
    body: &[u8],
    phrases: Option<&'a PhraseMatcher>,
    sink: &'a mut S,
) -> Result<BodyFacts, Deny> {
    let mut walk = Walk {
        scan: TextScan::new(phrases, body.len()),
        fail: None,
        ids: false,
        sink,
    };
    let raw = {
        let mut de = serde_json::Deserializer::from_slice(body);
        let raw = de::Deserializer::deserialize_any(&mut de, FactsVisitor { walk: &mut walk });
        let raw = raw.and_then(|raw| de.end().map(|()| raw));
        match raw {
            Ok(raw) => raw,
            Err(e) => {
                return Err(walk.fail.take().unwrap_or_else(|| {
                    Deny::new(
                        DenyCode::InvalidJson,
                        format!("request body is not valid JSON: {e}"),
                    )
                }))
            }
        }
    };
    let blocked_phrase = walk.scan.finish();
    let model = match raw.model {
        None => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                "request body must contain a string field `model`",
            ))
        }
        Some(Kind::Str(s)) if !s.is_empty() => s,
        Some(Kind::Str(_)) => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                "`model` must not be empty",
            ))
        }
        Some(other) => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                format!("`model` must be a string, got {}", other.name()),
            ))
        }
    };
    let messages = match raw.messages {
        None if endpoint.needs_messages() => {
            return Err(Deny::new(
                DenyCode::InvalidMessages,
                "request body must contain a `messages` array",
            ))
        }
        None => None,
        Some(Kind::Array(n)) => Some(n),
        Some(other) if endpoint.needs_messages() => {
            return Err(Deny::new(
                DenyCode::InvalidMessages,
                format!("`messages` must be an array, got {}", other.name()),
            ))
        }
        Some(_) => None,
    };
    let mut max_tokens = None;
    let mut null_field = None;
    let mut limit_fields = LimitFields::default();
    for (field, v) in [
        (LimitField::MaxTokens, raw.max_tokens),
        (LimitField::MaxCompletionTokens, raw.max_completion_tokens),
        (LimitField::MaxOutputTokens, raw.max_output_tokens),
    ] {
        if v.is_some() {
            limit_fields.insert(field);
        }
        match v {
            None => {}
            Some(Kind::Null) => {
                if let Some(other) = null_field.replace(field.name()) {
                    return Err(invalid(format!(
                        "`{other}` and `{field}` are both null: set at most one of them"
                    )));
                }
            }
            Some(Kind::Number(Some(n))) => {
                // Two limits: which one a provider obeys differs (some take
                // one, some the other, OpenAI's reasoning models refuse
                // one); the gateway would judge one and the provider obey
                // the other.
                if let Some((other, _)) = max_tokens.replace((field, n)) {
                    return Err(invalid(format!(
                        "`{other}` and `{field}` are both set: send one output limit"
                    )));
                }
            }
            Some(other) => {
                return Err(invalid(format!(
                    "`{field}` must be a non-negative integer, got {}",
                    other.name()
                )))
            }
        }
    }
    let mut n = None;
    for (field, v) in [("n", raw.n), ("best_of", raw.best_of)] {
        match v {
            None | Some(Kind::Null) => {}
            Some(Kind::Number(Some(k))) if k >= 1 => n = Some(n.unwrap_or(1).max(k)),
            Some(Kind::Number(Some(_))) => {
                return Err(invalid(format!(
                    "`{field}` must be a positive integer, got 0"
                )))
            }
            Some(other) => {
                return Err(invalid(format!(
                    "`{field}` must be a positive integer, got {}",
                    other.name()
                )))
            }
        }
    }
    if endpoint == Endpoint::Responses && matches!(raw.prompt, Some(Kind::Object)) {
        return Err(invalid(
            "`prompt` (a stored prompt) can carry tools and text the gateway cannot judge; \
             send them in the request instead",
        ));
    }
    let mut declared = declared_tools(raw.tools, raw.functions, raw.mcp_servers)?;
    match raw.web_search_options {
        None | Some(Kind::Null) => {}
        // Any options object, `{}` included, turns the search on: it is
        // judged as the built-in web search tool a grant names `web_search`.
        Some(Kind::Object) => declared.push(Declared {
            tool: ToolUse {
                kind: ToolKind::BuiltIn,
                id: "web_search".to_string(),
                field: "web_search_options",
            },
            name: None,
            label: None,
        }),
        Some(other) => {
            return Err(invalid(format!(
                "`web_search_options` must be an object, got {}",
                other.name()
            )))
        }
    }
    for (field, choice) in [
        ("tool_choice", raw.tool_choice),
        ("function_call", raw.function_call),
    ] {
        if let Some(choice) = choice {
            check_choice(field, &choice, &declared)?;
        }
    }
    Ok(BodyFacts {
        model,
        stream: matches!(raw.stream, Some(Kind::Bool(true))),
        messages,
        tools: declared.into_iter().map(|d| d.tool).collect(),
        max_tokens: max_tokens.map(|(_, n)| n),
        limit_field: max_tokens.map(|(f, _)| f),
        limit_fields,
        max_tokens_field: endpoint.max_tokens_field().map(|f| null_field.unwrap_or(f)),
        n,
        text_bytes: walk.scan.bytes,
        key_bytes: walk.scan.key_bytes,
        counted_tokens: walk.scan.tokens,
        blocked_phrase,
    })
}

fn invalid(msg: impl Into<String>) -> Deny {
    Deny::new(DenyCode::InvalidRequest, msg)
}

/// A declared tool with what `tool_choice` may call it by.
struct Declared {
    tool: ToolUse,
    /// Its `name`, for a built-in too (Anthropic's `tool_choice` names
    /// server tools by name).
    name: Option<String>,
    /// An MCP connector's label.
    label: Option<String>,
}

/// A string field of a tool object: absent, a string, or refused.
fn str_field<'a>(kind: &'a Option<Kind>, at: &str, key: &str) -> Result<Option<&'a str>, Deny> {
    match kind {
        None | Some(Kind::Null) => Ok(None),
        Some(Kind::Str(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Kind::Str(_)) => Err(invalid(format!("`{at}.{key}` must not be empty"))),
        Some(other) => Err(invalid(format!(
            "`{at}.{key}` must be a string, got {}",
            other.name()
        ))),
    }
}

/// The one name a function tool (or a choice naming one) gives: its
/// `function.name`, `custom.name` or `name`, which must agree.
fn one_name(f: &Fields, at: &str) -> Result<Option<String>, Deny> {
    let mut found: Option<&str> = None;
    let mut nested = Vec::new();
    for (key, obj) in [("function", &f.function), ("custom", &f.custom)] {
        match obj.as_deref() {
            None | Some(Obj::Null) => {}
            Some(Obj::Map(inner)) => nested.push((key, &inner.name)),
            Some(other) => {
                return Err(invalid(format!(
                    "`{at}.{key}` must be an object, got {}",
                    other.name()
                )))
            }
        }
    }
    let at_key = |key: &str| format!("{at}.{key}");
    let mut names = vec![(str_field(&f.name, at, "name")?, "name".to_string())];
    for (key, name) in nested {
        names.push((
            str_field(name, &at_key(key), "name")?,
            format!("{key}.name"),
        ));
    }
    for (name, _) in &names {
        if let Some(n) = name {
            match found {
                Some(prev) if prev != *n => {
                    return Err(invalid(format!(
                        "`{at}` names two tools (`{}` and `{}`)",
                        crate::decision::clip(prev, 100),
                        crate::decision::clip(n, 100)
                    )))
                }
                _ => found = Some(n),
            }
        }
    }
    Ok(found.map(str::to_string))
}

fn mcp_id(label: &str, target: &str, at: &str) -> Result<String, Deny> {
    if label.contains('@') {
        return Err(invalid(format!(
            "`{at}`: an MCP server label may not hold `@`"
        )));
    }
    Ok(format!("mcp:{label}@{target}"))
}

/// Reads `tools`, `functions` and `mcp_servers` into the tools they give.
fn declared_tools(
    tools: Option<List>,
    functions: Option<List>,
    mcp_servers: Option<List>,
) -> Result<Vec<Declared>, Deny> {
    let mut out = Vec::new();
    for (field, list) in [
        ("tools", tools),
        ("functions", functions),
        ("mcp_servers", mcp_servers),
    ] {
        let items = match list {
            None | Some(List::Null) => continue,
            Some(List::Items(items)) => items,
            Some(List::Other(what)) => {
                return Err(invalid(format!("`{field}` must be an array, got {what}")))
            }
        };
        for (i, item) in items.iter().enumerate() {
            let at = format!("{field}[{i}]");
            let f = match item {
                Obj::Map(f) => f,
                other => {
                    return Err(invalid(format!(
                        "`{at}` must be a tool object, got {}",
                        other.name()
                    )))
                }
            };
            out.push(match field {
                "tools" => tool_entry(f, &at)?,
                "functions" => {
                    let name = str_field(&f.name, &at, "name")?
                        .ok_or_else(|| invalid(format!("`{at}` has no `name`")))?;
                    function(name, field, &at)?
                }
                _ => {
                    let label = str_field(&f.name, &at, "name")?
                        .ok_or_else(|| invalid(format!("`{at}` has no `name`")))?;
                    let url = str_field(&f.url, &at, "url")?
                        .ok_or_else(|| invalid(format!("`{at}` has no `url`")))?;
                    Declared {
                        tool: ToolUse {
                            kind: ToolKind::Mcp,
                            id: mcp_id(label, url, &at)?,
                            field,
                        },
                        name: None,
                        label: Some(label.to_string()),
                    }
                }
            });
        }
    }
    Ok(out)
}

fn function(name: &str, field: &'static str, at: &str) -> Result<Declared, Deny> {
    if name.starts_with("mcp:") {
        return Err(invalid(format!(
            "`{at}`: a function name may not start with `mcp:`"
        )));
    }
    Ok(Declared {
        tool: ToolUse {
            kind: ToolKind::Function,
            id: name.to_string(),
            field,
        },
        name: Some(name.to_string()),
        label: None,
    })
}

/// One `tools[*]` entry.
fn tool_entry(f: &Fields, at: &str) -> Result<Declared, Deny> {
    match str_field(&f.ty, at, "type")? {
        None | Some("function") | Some("custom") => {
            let name = one_name(f, at)?
                .ok_or_else(|| invalid(format!("`{at}` has neither a name nor a type")))?;
            function(&name, "tools", at)
        }
        Some("mcp") => {
            let label = str_field(&f.server_label, at, "server_label")?
                .ok_or_else(|| invalid(format!("`{at}` has no `server_label`")))?;
            let target = match (
                str_field(&f.server_url, at, "server_url")?,
                str_field(&f.connector_id, at, "connector_id")?,
            ) {
                (Some(u), None) | (None, Some(u)) => u,
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "`{at}` has both `server_url` and `connector_id`"
                    )))
                }
                (None, None) => {
                    return Err(invalid(format!(
                        "`{at}` has neither `server_url` nor `connector_id`"
                    )))
                }
            };
            Ok(Declared {
                tool: ToolUse {
                    kind: ToolKind::Mcp,
                    id: mcp_id(label, target, at)?,
                    field: "tools",
                },
                name: None,
                label: Some(label.to_string()),
            })
        }
        Some(ty) => Ok(Declared {
            tool: ToolUse {
                kind: ToolKind::BuiltIn,
                id: ty.to_string(),
                field: "tools",
            },
            name: str_field(&f.name, at, "name")?.map(str::to_string),
            label: None,
        }),
    }
}

/// `tool_choice` / `function_call`: modes pass; a named tool must be one
/// the request declares (and so is judged with the others).
fn check_choice(field: &str, choice: &Obj, declared: &[Declared]) -> Result<(), Deny> {
    const MODES: [&str; 4] = ["none", "auto", "required", "any"];
    match choice {
        Obj::Null => Ok(()),
        Obj::Str(s) if MODES.contains(&s.as_str()) => Ok(()),
        Obj::Str(s) => Err(invalid(format!(
            "`{field}` must be `none`, `auto`, `required` or an object naming a tool, got `{}`",
            crate::decision::clip(s, 100)
        ))),
        Obj::Other(what) => Err(invalid(format!(
            "`{field}` must be a string or an object, got {what}"
        ))),
        Obj::Map(f) => choice_map(field, f, declared, true),
    }
}

fn choice_map(at: &str, f: &Fields, declared: &[Declared], top: bool) -> Result<(), Deny> {
    let undeclared = |what: &str| {
        Err(invalid(format!(
            "`{at}` names tool `{}`, which the request does not declare",
            crate::decision::clip(what, 200)
        )))
    };
    let by_name = |at: &str| -> Result<(), Deny> {
        let name = one_name(f, at)?.ok_or_else(|| invalid(format!("`{at}` names no tool")))?;
        if declared.iter().any(|d| d.name.as_deref() == Some(&*name)) {
            Ok(())
        } else {
            undeclared(&name)
        }
    };
    match str_field(&f.ty, at, "type")? {
        None => by_name(at),
        Some("auto" | "any" | "none" | "required") if top => Ok(()),
        Some("tool" | "function" | "custom") => by_name(at),
        Some("mcp") => {
            let label = str_field(&f.server_label, at, "server_label")?
                .ok_or_else(|| invalid(format!("`{at}` has no `server_label`")))?;
            if declared.iter().any(|d| d.label.as_deref() == Some(label)) {
                Ok(())
            } else {
                undeclared(&format!("mcp:{label}"))
            }
        }
        Some("allowed_tools") if top => {
            let list = match (&f.tools, f.allowed_tools.as_deref()) {
                (Some(l), None) => l,
                (None, Some(Obj::Map(inner))) => match &inner.tools {
                    Some(l) => l,
                    None => return Err(invalid(format!("`{at}.allowed_tools` has no `tools`"))),
                },
                (None, Some(other)) => {
                    return Err(invalid(format!(
                        "`{at}.allowed_tools` must be an object, got {}",
                        other.name()
                    )))
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "`{at}` has both `tools` and `allowed_tools`"
                    )))
                }
                (None, None) => return Err(invalid(format!("`{at}` has no `tools`"))),
            };
            let items = match list {
                List::Items(items) => items,
                List::Null => return Ok(()),
                List::Other(what) => {
                    return Err(invalid(format!(
                        "`{at}` allowed tools must be an array, got {what}"
                    )))
                }
            };
            for (i, item) in items.iter().enumerate() {
                let item_at = format!("{at}.tools[{i}]");
                match item {
                    Obj::Map(g) => choice_map(&item_at, g, declared, false)?,
                    other => {
                        return Err(invalid(format!(
                            "`{item_at}` must be an object, got {}",
                            other.name()
                        )))
                    }
                }
            }
            Ok(())
        }
        Some(ty) => {
            if declared
                .iter()
                .any(|d| d.tool.kind == ToolKind::BuiltIn && d.tool.id == ty)
            {
                Ok(())
            } else {
                undeclared(ty)
            }
        }
    }
}

/// The walk's shared state: the text scan, and the refusal that stopped
/// it (serde errors carry only text; this keeps the code and message).
struct Walk<'m, S: TokenSink + ?Sized> {
    scan: TextScan<'m>,
    fail: Option<Deny>,
    /// Inside top-level `input` or `prompt`, where integers are token ids.
    ids: bool,
    /// Takes every token as the walk reads it.
    sink: &'m mut S,
}

impl<S: TokenSink + ?Sized> Walk<'_, S> {
    #[inline(always)]
    fn token(&mut self, t: Token<'_>) {
        self.sink.token(t);
    }

    /// A scalar other than a string read at `depth` (2: a top-level
    /// value, a setting, not counted), worth `tokens` in the prompt.
    #[inline(always)]
    fn scalar(&mut self, depth: usize, tokens: u64) {
        if depth > 2 || self.ids {
            self.scan.tokens = self.scan.tokens.saturating_add(tokens);
        }
    }

    /// An integer of `digits` decimal digits at `depth`: a token id (one
    /// token) under `input` or `prompt`, else a token per three digits.
    #[inline(always)]
    fn integer(&mut self, depth: usize, digits: u32) {
        let tokens = if self.ids {
            1
        } else {
            u64::from(digits.div_ceil(3))
        };
        self.scalar(depth, tokens);
    }

    fn refuse<E: de::Error>(&mut self, code: DenyCode, msg: String) -> E {
        self.fail = Some(Deny::new(code, msg));
        E::custom("refused")
    }

    /// Entering a container at `depth`.
    fn enter<E: de::Error>(&mut self, depth: usize) -> Result<(), E> {
        if depth > MAX_DEPTH {
            return Err(self.refuse(
                DenyCode::InvalidJson,
                format!("request body is nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(())
    }
}

#[derive(Default)]
struct RawFacts {
    model: Option<Kind>,
    messages: Option<Kind>,
    stream: Option<Kind>,
    max_tokens: Option<Kind>,
    max_completion_tokens: Option<Kind>,
    max_output_tokens: Option<Kind>,
    n: Option<Kind>,
    best_of: Option<Kind>,
    prompt: Option<Kind>,
    tools: Option<List>,
    functions: Option<List>,
    mcp_servers: Option<List>,
    tool_choice: Option<Obj>,
    function_call: Option<Obj>,
    web_search_options: Option<Kind>,
    // Seen-flags for text fields, to refuse duplicates.
    text_fields: u8,
}

/// Accumulates text size and the first blocked phrase.
///
/// Every string is normalised and searched as it comes, all of a body's
/// strings as one text ([`PhraseSearch`]: joined with NUL, which
/// normalisation removes and no phrase holds, so no match can span two
/// strings), through a window of bounded size: short strings share one
/// search (each search has a fixed cost, ~400 instructions with 100
/// phrases, callgrind, that dominated for the short strings a
/// conversation is made of), and a long one is never copied whole. The
/// first phrase in document order is the one found.
struct TextScan<'m> {
    search: Option<PhraseSearch<'m>>,
    bytes: usize,
    /// Bytes of keys that count (see [`BodyFacts::key_bytes`]).
    key_bytes: usize,
    /// Prompt tokens counted directly (numbers, literals, token ids).
    tokens: u64,
}

impl TextScan<'_> {
    fn new(matcher: Option<&PhraseMatcher>, hint: usize) -> TextScan<'_> {
        TextScan {
            search: matcher.map(|m| PhraseSearch::new(m, hint)),
            bytes: 0,
            key_bytes: 0,
            tokens: 0,
        }
    }

    /// Counts `s` as text and searches it.
    fn text(&mut self, s: &str) {
        self.bytes = self.bytes.saturating_add(s.len());
        self.scan(s);
    }

    /// Searches key `s` of an object at `depth`, and counts it when the
    /// object is nested below a top-level field's items (depth 4 on: the
    /// top-level object is 1, a field's array 2, its items 3).
    fn key(&mut self, s: &str, depth: usize) {
        if depth > 3 {
            self.key_bytes = self.key_bytes.saturating_add(s.len());
        }
        self.scan(s);
    }

    /// Searches `s` (normalised first) without counting it as text.
    fn scan(&mut self, s: &str) {
        if let Some(search) = &mut self.search {
            search.push(s);
        }
    }

    /// The first phrase found in all the text; called when the body ends.
    fn finish(&mut self) -> Option<usize> {
        self.search.as_mut().and_then(|s| s.finish())
    }
}

/// What a number with a fraction counts as in the prompt estimate
/// (`0.25` is `0`, `.`, `25` to a BPE tokenizer).
const FRACTION_TOKENS: u64 = 3;

/// The decimal digits of `n`, its sign as one more.
fn i64_digits(n: i64) -> u32 {
    n.unsigned_abs().checked_ilog10().unwrap_or(0) + 1 + u32::from(n < 0)
}

/// How long a string the tests make to cross a search window.
#[cfg(test)]
const JOIN_UP_TO: usize = crate::phrases::WINDOW;

/// Refuses every non-object body.
macro_rules! not_object {
    ($($f:ident: $t:ty),*) => {
        $(fn $f<E: de::Error>(self, _: $t) -> Result<RawFacts, E> {
            Err(self.walk.refuse(DenyCode::InvalidJson, NOT_OBJECT.into()))
        })*
    };
}

const NOT_OBJECT: &str = "request body must be a JSON object";

struct FactsVisitor<'a, 'm, S: TokenSink + ?Sized> {
    walk: &'a mut Walk<'m, S>,
}

impl<'de, S: TokenSink + ?Sized> Visitor<'de> for FactsVisitor<'_, '_, S> {
    type Value = RawFacts;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFacts, A::Error> {
        let walk = self.walk;
        let mut facts = RawFacts::default();
        let dup = |walk: &mut Walk<S>, name: &str| {
            walk.refuse::<A::Error>(
                DenyCode::InvalidJson,
                format!("duplicate field `{name}` in request body"),
            )
        };
        // The top-level object is level 1; its values start at level 2.
        let depth = 2;
        walk.token(Token::ObjectStart);
        while let Some(key) = map.next_key_seed(TopKey(&mut *walk))? {
            let slot = match key {
                KeyName::Model => {
                    if facts.model.is_some() {
                        return Err(dup(walk, "model"));
                    }
                    facts.model = Some(map.next_value_seed(Val::new(walk, depth, Strs::Keep))?);
                    continue;
                }
                KeyName::Stream => &mut facts.stream,
                KeyName::MaxTokens => &mut facts.max_tokens,
                KeyName::MaxCompletionTokens => &mut facts.max_completion_tokens,
                KeyName::MaxOutputTokens => &mut facts.max_output_tokens,
                KeyName::N => &mut facts.n,
                KeyName::BestOf => &mut facts.best_of,
                KeyName::WebSearch => &mut facts.web_search_options,
                KeyName::Messages => &mut facts.messages,
                KeyName::Text(bit, name) => {
                    if facts.text_fields & bit != 0 {
                        return Err(dup(walk, name));
                    }
                    facts.text_fields |= bit;
                    // Integers under these are token ids (embeddings,
                    // completions): one token each.
                    walk.ids = matches!(name, "input" | "prompt");
                    let v = map.next_value_seed(Val::new(walk, depth, Strs::Scan));
                    walk.ids = false;
                    let v = v?;
                    if name == "prompt" {
                        facts.prompt = Some(v);
                    }
                    continue;
                }
                KeyName::List(name) => {
                    let slot = match name {
                        "tools" => &mut facts.tools,
                        "functions" => &mut facts.functions,
                        _ => &mut facts.mcp_servers,
                    };
                    if slot.is_some() {
                        return Err(dup(walk, name));
                    }
                    *slot = Some(map.next_value_seed(ListSeed {
                        walk: &mut *walk,
                        depth,
                        ctx: Ctx::Tool,
                    })?);
                    continue;
                }
                KeyName::Choice(name) => {
                    let slot = if name == "tool_choice" {
                        &mut facts.tool_choice
                    } else {
                        &mut facts.function_call
                    };
                    if slot.is_some() {
                        return Err(dup(walk, name));
                    }
                    *slot = Some(map.next_value_seed(ObjSeed {
                        walk: &mut *walk,
                        depth,
                        ctx: Ctx::Choice,
                    })?);
                    continue;
                }
                KeyName::Refused(msg) => return Err(walk.refuse(DenyCode::InvalidRequest, msg)),
                KeyName::CaseVariant(msg) => return Err(walk.refuse(DenyCode::InvalidJson, msg)),
                KeyName::Other => {
                    map.next_value_seed(Val::new(walk, depth, Strs::Scan))?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(dup(walk, key.name()));
            }
            *slot = Some(map.next_value_seed(Val::new(walk, depth, Strs::Scan))?);
        }
        walk.token(Token::ObjectEnd);
        Ok(facts)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawFacts, A::Error> {
        Err(self.walk.refuse(DenyCode::InvalidJson, NOT_OBJECT.into()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawFacts, E> {
        Err(self.walk.refuse(DenyCode::InvalidJson, NOT_OBJECT.into()))
    }
    not_object!(visit_str: &str, visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
}

/// Top-level keys the walk tells apart.
enum KeyName {
    Model,
    Messages,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    N,
    BestOf,
    /// `tools`, `functions`, `mcp_servers`.
    List(&'static str),
    /// `tool_choice`, `function_call`.
    Choice(&'static str),
    /// `web_search_options` (chat completions): a web search tool.
    WebSearch,
    /// A field with its duplicate-detection bit, read as plain text.
    Text(u8, &'static str),
    /// A tool-bearing field the gateway cannot judge.
    Refused(String),
    /// A judged field's name in other case.
    CaseVariant(String),
    Other,
}

/// Judged top-level names, for refusing their case variants.
const JUDGED: [&str; 18] = [
    "model",
    "messages",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "best_of",
    "tools",
    "functions",
    "mcp_servers",
    "tool_choice",
    "function_call",
    "web_search_options",
    "system",
    "prompt",
    "input",
    "instructions",
];

/// Tool-related fields that give no tool.
const TOOL_SETTINGS: [&str; 2] = ["parallel_tool_calls", "max_tool_calls"];

impl KeyName {
    fn name(&self) -> &'static str {
        match self {
            KeyName::Model => "model",
            KeyName::Messages => "messages",
            KeyName::Stream => "stream",
            KeyName::MaxTokens => "max_tokens",
            KeyName::MaxCompletionTokens => "max_completion_tokens",
            KeyName::MaxOutputTokens => "max_output_tokens",
            KeyName::N => "n",
            KeyName::BestOf => "best_of",
            KeyName::WebSearch => "web_search_options",
            KeyName::List(n) | KeyName::Choice(n) | KeyName::Text(_, n) => n,
            KeyName::Refused(_) | KeyName::CaseVariant(_) | KeyName::Other => "?",
        }
    }

    fn of(s: &str) -> KeyName {
        match s {
            "model" => KeyName::Model,
            "messages" => KeyName::Messages,
            "stream" => KeyName::Stream,
            "max_tokens" => KeyName::MaxTokens,
            "max_completion_tokens" => KeyName::MaxCompletionTokens,
            "max_output_tokens" => KeyName::MaxOutputTokens,
            "n" => KeyName::N,
            "best_of" => KeyName::BestOf,
            "tools" => KeyName::List("tools"),
            "functions" => KeyName::List("functions"),
            "mcp_servers" => KeyName::List("mcp_servers"),
            "tool_choice" => KeyName::Choice("tool_choice"),
            "function_call" => KeyName::Choice("function_call"),
            "web_search_options" => KeyName::WebSearch,
            "system" => KeyName::Text(1, "system"),
            "prompt" => KeyName::Text(2, "prompt"),
            "input" => KeyName::Text(4, "input"),
            "instructions" => KeyName::Text(8, "instructions"),
            _ if TOOL_SETTINGS.contains(&s) => KeyName::Other,
            _ => {
                let shown = crate::decision::clip(s, 100);
                if JUDGED.iter().any(|j| j.eq_ignore_ascii_case(s)) {
                    return KeyName::CaseVariant(format!(
                        "field `{shown}` differs from a judged field only by case"
                    ));
                }
                let lower = s.to_ascii_lowercase();
                if ["tool", "function", "mcp"]
                    .iter()
                    .any(|w| lower.contains(w))
                {
                    return KeyName::Refused(format!(
                        "field `{shown}` may give the model tools the gateway cannot judge"
                    ));
                }
                KeyName::Other
            }
        }
    }
}

/// A top-level key: handed to the sink, told apart.
struct TopKey<'a, 'm, S: TokenSink + ?Sized>(&'a mut Walk<'m, S>);

impl<'de, S: TokenSink + ?Sized> DeserializeSeed<'de> for TopKey<'_, '_, S> {
    type Value = KeyName;
    #[inline]
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<KeyName, D::Error> {
        d.deserialize_str(self)
    }
}

impl<S: TokenSink + ?Sized> Visitor<'_> for TopKey<'_, '_, S> {
    type Value = KeyName;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, s: &str) -> Result<KeyName, E> {
        self.0.token(Token::Key(s));
        Ok(KeyName::of(s))
    }
}

/// The shape of a judged value; strings are kept where asked, containers
/// only counted.
enum Kind {
    Str(String),
    Bool(bool),
    /// A number; `Some` when it is a non-negative integer.
    Number(Option<u64>),
    Null,
    Array(usize),
    Object,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Str(_) => "a string",
            Kind::Bool(_) => "a boolean",
            Kind::Number(_) => "a number",
            Kind::Null => "null",
            Kind::Array(_) => "an array",
            Kind::Object => "an object",
        }
    }
}

/// What a [`Val`] does with the strings it meets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Strs {
    /// Count and search them (inside containers too); keep none.
    Scan,
    /// Keep the string, neither counted nor searched (`model`).
    Keep,
    /// Count, search and keep it (tool names and types).
    ScanKeep,
}

/// Reads any value into a [`Kind`], walking containers depth-counted with
/// every string inside them (at any depth) and every key measured and
/// searched.
struct Val<'a, 'm, S: TokenSink + ?Sized> {
    walk: &'a mut Walk<'m, S>,
    depth: usize,
    strs: Strs,
}

impl<'a, 'm, S: TokenSink + ?Sized> Val<'a, 'm, S> {
    fn new(walk: &'a mut Walk<'m, S>, depth: usize, strs: Strs) -> Val<'a, 'm, S> {
        Val { walk, depth, strs }
    }
}

impl<'de, S: TokenSink + ?Sized> DeserializeSeed<'de> for Val<'_, '_, S> {
    type Value = Kind;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Kind, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: TokenSink + ?Sized> Visitor<'de> for Val<'_, '_, S> {
    type Value = Kind;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Kind, E> {
        self.walk.token(Token::Str(s));
        if self.strs != Strs::Keep {
            self.walk.scan.text(s);
        }
        Ok(Kind::Str(match self.strs {
            Strs::Scan => String::new(),
            _ => s.to_string(),
        }))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Kind, E> {
        self.walk.token(Token::Bool(b));
        self.walk.scalar(self.depth, 1);
        Ok(Kind::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Kind, E> {
        self.walk.token(Token::I64(n));
        self.walk.integer(self.depth, i64_digits(n));
        Ok(Kind::Number(u64::try_from(n).ok()))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Kind, E> {
        self.walk.token(Token::U64(n));
        self.walk
            .integer(self.depth, n.checked_ilog10().unwrap_or(0) + 1);
        Ok(Kind::Number(Some(n)))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Kind, E> {
        self.walk.token(Token::F64(n));
        self.walk.scalar(self.depth, FRACTION_TOKENS);
        Ok(Kind::Number(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        self.walk.token(Token::Null);
        self.walk.scalar(self.depth, 1);
        Ok(Kind::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        self.walk.enter(self.depth)?;
        self.walk.token(Token::ArrayStart);
        let mut n = 0;
        while seq
            .next_element_seed(Val::new(self.walk, self.depth + 1, Strs::Scan))?
            .is_some()
        {
            n += 1;
        }
        self.walk.token(Token::ArrayEnd);
        Ok(Kind::Array(n))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        self.walk.enter(self.depth)?;
        self.walk.token(Token::ObjectStart);
        while map.next_key_seed(ScanKey(self.walk, self.depth))?.is_some() {
            map.next_value_seed(Val::new(self.walk, self.depth + 1, Strs::Scan))?;
        }
        self.walk.token(Token::ObjectEnd);
        Ok(Kind::Object)
    }
}

/// A key below the top level, of an object at the depth it holds:
/// searched, and counted where keys count ([`TextScan::key`]).
struct ScanKey<'a, 'm, S: TokenSink + ?Sized>(&'a mut Walk<'m, S>, usize);

impl<'de, S: TokenSink + ?Sized> DeserializeSeed<'de> for ScanKey<'_, '_, S> {
    type Value = ();
    #[inline]
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<S: TokenSink + ?Sized> Visitor<'_> for ScanKey<'_, '_, S> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    #[inline]
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.token(Token::Key(s));
        self.0.scan.key(s, self.1);
        Ok(())
    }
}

/// Which keys an [`ObjSeed`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// A tool: `type`, `name`, `function`, `custom`, MCP fields.
    Tool,
    /// `tool_choice`: a tool's keys plus `allowed_tools` and `tools`.
    Choice,
    /// `function` / `custom` inside a tool: `name`.
    Named,
    /// `allowed_tools` inside a choice: `tools`.
    Allowed,
}

/// The keys read from a tool-bearing object; the rest is only scanned.
#[derive(Default)]
struct Fields {
    ty: Option<Kind>,
    name: Option<Kind>,
    server_label: Option<Kind>,
    server_url: Option<Kind>,
    url: Option<Kind>,
    connector_id: Option<Kind>,
    function: Option<Box<Obj>>,
    custom: Option<Box<Obj>>,
    allowed_tools: Option<Box<Obj>>,
    tools: Option<List>,
}

/// A value where a tool-bearing object belongs.
enum Obj {
    Map(Fields),
    Str(String),
    Null,
    /// Anything else, by its kind's name.
    Other(&'static str),
}

impl Obj {
    fn name(&self) -> &'static str {
        match self {
            Obj::Map(_) => "an object",
            Obj::Str(_) => "a string",
            Obj::Null => "null",
            Obj::Other(what) => what,
        }
    }
}

/// A value where a list of tools belongs.
enum List {
    Items(Vec<Obj>),
    Null,
    Other(&'static str),
}

/// Reads a tool-bearing object's keys (per [`Ctx`]); any other value is
/// walked (scanned, depth-counted) and reported by kind.
struct ObjSeed<'a, 'm, S: TokenSink + ?Sized> {
    walk: &'a mut Walk<'m, S>,
    depth: usize,
    ctx: Ctx,
}

impl<'de, S: TokenSink + ?Sized> DeserializeSeed<'de> for ObjSeed<'_, '_, S> {
    type Value = Obj;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Obj, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: TokenSink + ?Sized> Visitor<'de> for ObjSeed<'_, '_, S> {
    type Value = Obj;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tool object")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Obj, E> {
        self.walk.token(Token::Str(s));
        self.walk.scan.text(s);
        Ok(Obj::Str(s.to_string()))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Obj, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_bool::<E>(b)?;
        Ok(Obj::Other("a boolean"))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Obj, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_i64::<E>(n)?;
        Ok(Obj::Other("a number"))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Obj, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_u64::<E>(n)?;
        Ok(Obj::Other("a number"))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Obj, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_f64::<E>(n)?;
        Ok(Obj::Other("a number"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Obj, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_unit::<E>()?;
        Ok(Obj::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Obj, A::Error> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_seq(seq)?;
        Ok(Obj::Other("an array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Obj, A::Error> {
        let walk = self.walk;
        walk.enter(self.depth)?;
        let depth = self.depth + 1;
        let mut f = Fields::default();
        let tool = matches!(self.ctx, Ctx::Tool | Ctx::Choice);
        walk.token(Token::ObjectStart);
        while let Some(key) = map.next_key::<String>()? {
            walk.token(Token::Key(&key));
            walk.scan.key(&key, self.depth);
            let kind_slot = match key.as_str() {
                "type" if tool => Some(&mut f.ty),
                "name" if self.ctx != Ctx::Allowed => Some(&mut f.name),
                "server_label" if tool => Some(&mut f.server_label),
                "server_url" if tool => Some(&mut f.server_url),
                "url" if tool => Some(&mut f.url),
                "connector_id" if tool => Some(&mut f.connector_id),
                _ => None,
            };
            if let Some(slot) = kind_slot {
                if slot.is_some() {
                    return Err(walk.refuse(
                        DenyCode::InvalidRequest,
                        format!("a tool object has two `{key}` fields"),
                    ));
                }
                *slot = Some(map.next_value_seed(Val::new(walk, depth, Strs::ScanKeep))?);
                continue;
            }
            let obj_slot = match key.as_str() {
                "function" if tool => Some((&mut f.function, Ctx::Named)),
                "custom" if tool => Some((&mut f.custom, Ctx::Named)),
                "allowed_tools" if self.ctx == Ctx::Choice => {
                    Some((&mut f.allowed_tools, Ctx::Allowed))
                }
                _ => None,
            };
            if let Some((slot, ctx)) = obj_slot {
                if slot.is_some() {
                    return Err(walk.refuse(
                        DenyCode::InvalidRequest,
                        format!("a tool object has two `{key}` fields"),
                    ));
                }
                let seed = ObjSeed {
                    walk: &mut *walk,
                    depth,
                    ctx,
                };
                *slot = Some(Box::new(map.next_value_seed(seed)?));
                continue;
            }
            if key == "tools" && matches!(self.ctx, Ctx::Choice | Ctx::Allowed) {
                if f.tools.is_some() {
                    return Err(walk.refuse(
                        DenyCode::InvalidRequest,
                        "a tool object has two `tools` fields".into(),
                    ));
                }
                f.tools = Some(map.next_value_seed(ListSeed {
                    walk: &mut *walk,
                    depth,
                    ctx: Ctx::Tool,
                })?);
                continue;
            }
            map.next_value_seed(Val::new(walk, depth, Strs::Scan))?;
        }
        walk.token(Token::ObjectEnd);
        Ok(Obj::Map(f))
    }
}

/// Reads a list of tool-bearing objects; any other value is walked and
/// reported by kind.
struct ListSeed<'a, 'm, S: TokenSink + ?Sized> {
    walk: &'a mut Walk<'m, S>,
    depth: usize,
    ctx: Ctx,
}

impl<'de, S: TokenSink + ?Sized> DeserializeSeed<'de> for ListSeed<'_, '_, S> {
    type Value = List;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<List, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: TokenSink + ?Sized> Visitor<'de> for ListSeed<'_, '_, S> {
    type Value = List;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of tools")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<List, E> {
        self.walk.token(Token::Str(s));
        self.walk.scan.text(s);
        Ok(List::Other("a string"))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<List, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_bool::<E>(b)?;
        Ok(List::Other("a boolean"))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<List, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_i64::<E>(n)?;
        Ok(List::Other("a number"))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<List, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_u64::<E>(n)?;
        Ok(List::Other("a number"))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<List, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_f64::<E>(n)?;
        Ok(List::Other("a number"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<List, E> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_unit::<E>()?;
        Ok(List::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<List, A::Error> {
        Val::new(self.walk, self.depth, Strs::Scan).visit_map(map)?;
        Ok(List::Other("an object"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List, A::Error> {
        self.walk.enter(self.depth)?;
        self.walk.token(Token::ArrayStart);
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(ObjSeed {
            walk: &mut *self.walk,
            depth: self.depth + 1,
            ctx: self.ctx,
        })? {
            items.push(item);
        }
        self.walk.token(Token::ArrayEnd);
        Ok(List::Items(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<BodyFacts, Deny> {
        inspect_body(Endpoint::ChatCompletions, body.as_bytes(), None)
    }

    #[test]
    fn extracts_facts() {
        let f = chat(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"},{}],"stream":true,"x":{"y":[1,2]}}"#).unwrap();
        assert_eq!(f.model, "gpt-4o");
        assert!(f.stream);
        assert_eq!(f.messages, Some(2));
        // A message's own keys and a top-level object's are not counted;
        // the numbers in `x` count a token each.
        assert_eq!(f.text_bytes, "user".len() + "hi".len());
        assert_eq!(f.key_bytes, 0);
        assert_eq!(f.counted_tokens, 2);
        assert_eq!(f.estimated_prompt_tokens(), 2 + 2);
        // Keys inside a message's content and a tool's function count.
        let f = chat(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"tools":[{"type":"function","function":{"name":"f"}}]}"#).unwrap();
        assert_eq!(f.key_bytes, "type".len() + "text".len() + "name".len());
        let f = inspect_body(
            Endpoint::Embeddings,
            br#"{"model":"e","input":"xyz"}"#,
            None,
        )
        .unwrap();
        assert_eq!(f.messages, None);
        assert_eq!(f.text_bytes, 3);
        assert!(!f.stream);
    }

    #[test]
    fn the_estimate_counts_every_token_bearing_part() {
        // A tool schema of hashed property names: the keys are the prompt
        // (before: 6 tokens for 40 KB, the keys counting as nothing).
        let props: Vec<String> = (0..560)
            .map(|i| format!(r#""{:064x}":{{}}"#, i * 7919))
            .collect();
        let body = format!(
            r#"{{"model":"m","max_tokens":10,"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object","properties":{{{}}}}}}}}}]}}"#,
            props.join(",")
        );
        let f = chat(&body).unwrap();
        assert!(body.len() > 39_000, "{}", body.len());
        let keys = 560 * 64 + "properties".len() + "parameters".len();
        assert!(f.key_bytes > keys, "{}", f.key_bytes);
        assert!(f.estimated_prompt_tokens() > 560 * 64 / 3, "{f:?}");
        // Token ids under `input` (embeddings) or `prompt` (completions):
        // exactly one token each, arrays of arrays summed; top-level
        // settings count nothing.
        let ids: Vec<String> = (0..80_000).map(|i| (100_000 + i).to_string()).collect();
        let flat = format!(r#"{{"model":"e","input":[{}]}}"#, ids.join(","));
        let f = inspect_body(Endpoint::Embeddings, flat.as_bytes(), None).unwrap();
        assert_eq!((f.text_bytes + f.key_bytes, f.counted_tokens), (0, 80_000));
        assert_eq!(f.estimated_prompt_tokens(), 80_000);
        let nested = format!(
            r#"{{"model":"c","prompt":[[{}],[{}]],"max_tokens":5,"temperature":0.5,"echo":false}}"#,
            ids[..30_000].join(","),
            ids[30_000..].join(",")
        );
        let f = inspect_body(Endpoint::Completions, nested.as_bytes(), None).unwrap();
        assert_eq!(f.estimated_prompt_tokens(), 80_000);
        let one = inspect_body(Endpoint::Embeddings, br#"{"model":"e","input":7}"#, None);
        assert_eq!(one.unwrap().estimated_prompt_tokens(), 1);
        // Elsewhere a number is a token per three digits (a sign one
        // more), a fraction three, a literal one.
        let f = chat(
            r#"{"model":"m","messages":[],"metadata":{"n":[1,1234,-5,123456789012,0.25,true,null]}}"#,
        )
        .unwrap();
        assert_eq!(f.counted_tokens, 1 + 2 + 1 + 4 + 3 + 1 + 1);
        assert_eq!((f.text_bytes, f.key_bytes), (0, 0));
        // In tool objects too, however they are read.
        let f = chat(
            r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer","minimum":100,"enum":[1,2,3]}}}}}]}"#,
        )
        .unwrap();
        assert_eq!(f.counted_tokens, 1 + 3);
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        let f = chat(r#"{"model":"gpt\u002d4o","messages":[]}"#).unwrap();
        assert_eq!(f.model, "gpt-4o");
    }

    fn ids(f: &BodyFacts) -> Vec<(ToolKind, &str, &str)> {
        f.tools
            .iter()
            .map(|t| (t.kind, t.id.as_str(), t.field))
            .collect()
    }

    fn refused(body: &str) -> Deny {
        match chat(body) {
            Ok(f) => panic!("{body} was accepted: {f:?}"),
            Err(d) => d,
        }
    }

    #[test]
    fn web_search_options_is_the_web_search_tool() {
        use ToolKind::*;
        for opts in ["{}", r#"{"search_context_size":"low"}"#] {
            let f = chat(&format!(
                r#"{{"model":"gpt-4o-search-preview","messages":[],"web_search_options":{opts}}}"#
            ))
            .unwrap();
            assert_eq!(
                ids(&f),
                vec![(BuiltIn, "web_search", "web_search_options")],
                "{opts}"
            );
        }
        let f = chat(r#"{"model":"m","messages":[],"web_search_options":null}"#).unwrap();
        assert!(f.tools.is_empty());
        for bad in ["true", "\"on\"", "[]", "1"] {
            let d = refused(&format!(
                r#"{{"model":"m","messages":[],"web_search_options":{bad}}}"#
            ));
            assert_eq!(d.code, DenyCode::InvalidRequest, "{bad}");
            assert!(d.message.contains("web_search_options"), "{bad}");
        }
        // Given twice, or in another case: refused, never read one way here
        // and another upstream.
        let d = refused(
            r#"{"model":"m","messages":[],"web_search_options":null,"web_search_options":{}}"#,
        );
        assert_eq!(d.code, DenyCode::InvalidJson);
        let d = refused(r#"{"model":"m","messages":[],"Web_Search_Options":{}}"#);
        assert_eq!(d.code, DenyCode::InvalidJson);
    }

    #[test]
    fn tool_names_in_every_shape() {
        use ToolKind::*;
        let f = chat(
            r#"{"model":"m","messages":[],"tools":[
            {"type":"function","function":{"name":"get_weather","parameters":{}}},
            {"name":"lookup_order","input_schema":{}},
            {"type":"function","name":"resp_tool"},
            {"type":"custom","name":"anthropic_custom"},
            {"type":"custom","custom":{"name":"chat_custom"}},
            {"type":"web_search_preview"},
            {"type":"web_search_20250305","name":"search_web"},
            {"type":"mcp","server_label":"gh","server_url":"https://mcp.example/gh"},
            {"type":"mcp","server_label":"mail","connector_id":"connector_gmail"}],
            "functions":[{"name":"legacy","parameters":{}}],
            "mcp_servers":[{"type":"url","name":"wiki","url":"https://mcp.example/wiki"}]}"#,
        )
        .unwrap();
        assert_eq!(
            ids(&f),
            [
                (Function, "get_weather", "tools"),
                (Function, "lookup_order", "tools"),
                (Function, "resp_tool", "tools"),
                (Function, "anthropic_custom", "tools"),
                (Function, "chat_custom", "tools"),
                (BuiltIn, "web_search_preview", "tools"),
                (BuiltIn, "web_search_20250305", "tools"),
                (Mcp, "mcp:gh@https://mcp.example/gh", "tools"),
                (Mcp, "mcp:mail@connector_gmail", "tools"),
                (Function, "legacy", "functions"),
                (Mcp, "mcp:wiki@https://mcp.example/wiki", "mcp_servers"),
            ]
        );
        for empty in [r#""tools":null"#, r#""tools":[]"#, r#""functions":null"#] {
            let f = chat(&format!(r#"{{"model":"m","messages":[],{empty}}}"#)).unwrap();
            assert!(f.tools.is_empty(), "{empty}");
        }
    }

    #[test]
    fn unreadable_tool_shapes_are_refused_naming_the_field() {
        for (bad, names) in [
            (r#""tools":"x""#, "`tools`"),
            (r#""tools":{}"#, "`tools`"),
            (r#""tools":[1]"#, "`tools[0]`"),
            (r#""tools":[null]"#, "`tools[0]`"),
            (r#""tools":[{"description":"x"}]"#, "`tools[0]`"),
            (r#""tools":[{"type":"function"}]"#, "`tools[0]`"),
            (r#""tools":[{"type":7}]"#, "`tools[0].type`"),
            (r#""tools":[{"type":""}]"#, "`tools[0].type`"),
            (r#""tools":[{"name":["a"]}]"#, "`tools[0].name`"),
            (
                r#""tools":[{"type":"function","name":"a","function":{"name":"b"}}]"#,
                "`tools[0]`",
            ),
            (
                r#""tools":[{"type":"function","function":"f"}]"#,
                "`tools[0].function`",
            ),
            (r#""tools":[{"name":"a","name":"b"}]"#, "two `name`"),
            (r#""tools":[{"name":"mcp:x@y"}]"#, "`tools[0]`"),
            (r#""tools":[{"type":"mcp","server_url":"u"}]"#, "`tools[0]`"),
            (
                r#""tools":[{"type":"mcp","server_label":"a"}]"#,
                "`tools[0]`",
            ),
            (
                r#""tools":[{"type":"mcp","server_label":"a@b","server_url":"u"}]"#,
                "`tools[0]`",
            ),
            (r#""functions":{"name":"x"}"#, "`functions`"),
            (r#""functions":[{}]"#, "`functions[0]`"),
            (r#""functions":["f"]"#, "`functions[0]`"),
            (r#""mcp_servers":[{"url":"u"}]"#, "`mcp_servers[0]`"),
            (r#""mcp_servers":[{"name":"n"}]"#, "`mcp_servers[0]`"),
            (r#""mcp_servers":"u""#, "`mcp_servers`"),
            (r#""tool_resources":{}"#, "`tool_resources`"),
            (r#""mcpServers":[]"#, "`mcpServers`"),
            (r#""toolConfig":{}"#, "`toolConfig`"),
        ] {
            let d = refused(&format!(r#"{{"model":"m","messages":[],{bad}}}"#));
            assert_eq!(d.code, DenyCode::InvalidRequest, "{bad}: {d:?}");
            assert!(d.message.contains(names), "{bad}: {}", d.message);
        }
        // Settings about tools give none.
        chat(r#"{"model":"m","messages":[],"parallel_tool_calls":false,"max_tool_calls":3}"#)
            .unwrap();
        // A judged field in other case is refused, not skipped.
        for bad in [r#""Tools":[]"#, r#""MAX_TOKENS":9"#, r#""Model":"x""#] {
            let d = refused(&format!(r#"{{"model":"m","messages":[],{bad}}}"#));
            assert_eq!(d.code, DenyCode::InvalidJson, "{bad}");
        }
        // A stored prompt on Responses hides its tools.
        let d = inspect_body(
            Endpoint::Responses,
            br#"{"model":"m","prompt":{"id":"pmpt_1"}}"#,
            None,
        )
        .unwrap_err();
        assert_eq!(d.code, DenyCode::InvalidRequest);
        assert!(d.message.contains("`prompt`"), "{}", d.message);
    }

    #[test]
    fn tool_choice_must_name_a_declared_tool() {
        let tools = r#""tools":[{"type":"function","function":{"name":"get"}},
            {"type":"web_search_20250305","name":"search_web"},
            {"type":"file_search"},
            {"type":"mcp","server_label":"gh","server_url":"https://x"}]"#;
        for ok in [
            r#""auto""#,
            r#""none""#,
            r#""required""#,
            r#"null"#,
            r#"{"type":"auto"}"#,
            r#"{"type":"any","disable_parallel_tool_use":true}"#,
            r#"{"type":"function","function":{"name":"get"}}"#,
            r#"{"type":"function","name":"get"}"#,
            r#"{"type":"tool","name":"get"}"#,
            r#"{"type":"tool","name":"search_web"}"#,
            r#"{"type":"file_search"}"#,
            r#"{"type":"mcp","server_label":"gh","name":"create_issue"}"#,
            r#"{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"get"},{"type":"file_search"}]}"#,
            r#"{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"get"}}]}}"#,
        ] {
            let body = format!(r#"{{"model":"m","messages":[],{tools},"tool_choice":{ok}}}"#);
            chat(&body).unwrap_or_else(|d| panic!("{ok}: {d:?}"));
        }
        for bad in [
            r#""get""#,
            r#"7"#,
            r#"{}"#,
            r#"{"type":"function","function":{"name":"delete"}}"#,
            r#"{"type":"tool","name":"web_search_20250305"}"#,
            r#"{"type":"web_search_preview"}"#,
            r#"{"type":"mcp","server_label":"other"}"#,
            r#"{"type":"function","name":"get","function":{"name":"delete"}}"#,
            r#"{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"delete"}]}"#,
            r#"{"type":"allowed_tools","mode":"auto","tools":["get"]}"#,
            r#"{"type":"allowed_tools","mode":"auto","tools":[{"type":"auto"}]}"#,
        ] {
            let body = format!(r#"{{"model":"m","messages":[],{tools},"tool_choice":{bad}}}"#);
            let d = refused(&body);
            assert_eq!(d.code, DenyCode::InvalidRequest, "{bad}: {d:?}");
            assert!(d.message.contains("`tool_choice"), "{bad}: {}", d.message);
        }
        // The legacy pair.
        let legacy = r#""functions":[{"name":"f"}]"#;
        for (choice, ok) in [
            (r#""auto""#, true),
            (r#"{"name":"f"}"#, true),
            (r#"{"name":"g"}"#, false),
            (r#""f""#, false),
        ] {
            let body =
                format!(r#"{{"model":"m","messages":[],{legacy},"function_call":{choice}}}"#);
            assert_eq!(chat(&body).is_ok(), ok, "{choice}");
        }
        // A choice naming a tool with no tools declared at all.
        let d = refused(r#"{"model":"m","messages":[],"tool_choice":{"type":"tool","name":"x"}}"#);
        assert!(d.message.contains("does not declare"), "{}", d.message);
    }

    #[test]
    fn one_output_limit_is_read_and_two_are_refused() {
        let f =
            chat(r#"{"model":"m","messages":[],"max_completion_tokens":300,"max_tokens":null}"#)
                .unwrap();
        assert_eq!(
            (f.max_tokens, f.limit_field),
            (Some(300), Some(LimitField::MaxCompletionTokens))
        );
        assert_eq!(
            f.limit_fields,
            [LimitField::MaxTokens, LimitField::MaxCompletionTokens]
                .into_iter()
                .collect()
        );
        let d = chat(r#"{"model":"m","messages":[],"max_tokens":100,"max_completion_tokens":300}"#)
            .unwrap_err();
        assert_eq!(d.code, DenyCode::InvalidRequest);
        assert!(
            d.message
                .contains("`max_tokens` and `max_completion_tokens` are both set"),
            "{}",
            d.message
        );
        // The same value twice is as ambiguous to the next reader.
        assert!(
            chat(r#"{"model":"m","messages":[],"max_output_tokens":5,"max_tokens":5}"#).is_err()
        );
        assert_eq!(
            chat(r#"{"model":"m","messages":[],"max_tokens":null}"#)
                .unwrap()
                .max_tokens,
            None
        );
        for bad in ["-1", "1.5", "\"10\"", "[]"] {
            let d = chat(&format!(
                r#"{{"model":"m","messages":[],"max_tokens":{bad}}}"#
            ))
            .unwrap_err();
            assert_eq!(d.code, DenyCode::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn n_and_the_max_tokens_field() {
        let f = chat(r#"{"model":"m","messages":[],"n":3,"max_tokens":10}"#).unwrap();
        assert_eq!(
            (f.n, f.choices(), f.output_tokens()),
            (Some(3), 3, Some(30))
        );
        assert_eq!(f.max_tokens_field, Some("max_tokens"));
        let f = inspect_body(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"x","n":2,"best_of":5}"#,
            None,
        )
        .unwrap();
        assert_eq!((f.n, f.output_tokens()), (Some(5), None));
        let f = chat(r#"{"model":"m","messages":[],"n":null}"#).unwrap();
        assert_eq!((f.n, f.choices()), (None, 1));
        for bad in [
            r#""n":0"#,
            r#""n":-1"#,
            r#""n":1.5"#,
            r#""n":"2""#,
            r#""best_of":0"#,
        ] {
            let d = chat(&format!(r#"{{"model":"m","messages":[],{bad}}}"#)).unwrap_err();
            assert_eq!(d.code, DenyCode::InvalidRequest, "{bad}");
            assert!(d.message.contains("positive integer"), "{}", d.message);
        }
        let field = |e: Endpoint, body: &str| {
            inspect_body(e, body.as_bytes(), None)
                .unwrap()
                .max_tokens_field
        };
        assert_eq!(
            field(Endpoint::Responses, r#"{"model":"m","input":"x"}"#),
            Some("max_output_tokens")
        );
        assert_eq!(
            field(Endpoint::Messages, r#"{"model":"m","messages":[]}"#),
            Some("max_tokens")
        );
        assert_eq!(
            field(Endpoint::Embeddings, r#"{"model":"m","input":"x"}"#),
            None
        );
        // A field present as null is the one to fill in.
        assert_eq!(
            field(
                Endpoint::ChatCompletions,
                r#"{"model":"m","messages":[],"max_completion_tokens":null}"#
            ),
            Some("max_completion_tokens")
        );
        let d =
            chat(r#"{"model":"m","messages":[],"max_tokens":null,"max_completion_tokens":null}"#)
                .unwrap_err();
        assert_eq!(d.code, DenyCode::InvalidRequest);
    }

    #[test]
    fn phrases_are_found_in_nested_text_after_unescaping() {
        let m = PhraseMatcher::new(&["ignore previous instructions"]).unwrap();
        let scan = |body: &str| {
            inspect_body(Endpoint::Messages, body.as_bytes(), Some(&m))
                .unwrap()
                .blocked_phrase
        };
        assert_eq!(
            scan(
                r#"{"model":"c","messages":[{"role":"user","content":[{"type":"text","text":"Please IGNORE previous instructions"}]}]}"#
            ),
            Some(0)
        );
        assert_eq!(
            scan(r#"{"model":"c","messages":[],"system":"\u0069gnore previous instructions"}"#),
            Some(0)
        );
        // Every string is scanned, metadata too.
        assert_eq!(
            scan(
                r#"{"model":"c","messages":[{"role":"tool","content":"ok"}],"metadata":{"note":"ignore previous instructions"}}"#
            ),
            Some(0)
        );
        // But not the model name.
        assert_eq!(
            scan(r#"{"model":"ignore previous instructions","messages":[]}"#),
            None
        );
        assert_eq!(
            scan(
                r#"{"model":"c","messages":[{"role":"user","content":"ignore previous, instructions"}]}"#
            ),
            None
        );
    }

    #[test]
    fn phrase_evasions_are_caught_in_every_text_field() {
        let m = PhraseMatcher::new(&["ignore previous instructions"]).unwrap();
        let found = |endpoint: Endpoint, body: String| {
            inspect_body(endpoint, body.as_bytes(), Some(&m))
                .unwrap_or_else(|d| panic!("{body}: {d:?}"))
                .blocked_phrase
        };
        // Evasions of the text itself, as JSON string contents.
        for text in [
            "ＩＧＮＯＲＥ ｐｒｅｖｉｏｕｓ ｉｎｓｔｒｕｃｔｉｏｎｓ",
            "ig\\u200Bnore previous instruc\\u200Dtions",
            "ig\\u00ADnore previous instructions",
            "i\\uDB40\\uDC67gnore previous\\uDB40\\uDC7F instructions",
            "IgNoRe PREVIOUS Instructions",
            "ignore   previous\\n\\t instructions",
            "ignore\\u2060 previous\\uFEFF instructions\\u202E",
        ] {
            let body =
                format!(r#"{{"model":"c","messages":[{{"role":"user","content":"{text}"}}]}}"#);
            assert_eq!(found(Endpoint::ChatCompletions, body), Some(0), "{text}");
        }
        // Every place a request carries text.
        let p = "ignore previous instructions";
        for (endpoint, body) in [
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[],"tools":[{{"type":"function","function":{{"name":"f","description":"{p}"}}}}]}}"#
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[],"tools":[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object","properties":{{"x":{{"description":"{p}"}}}}}}}}}}]}}"#
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[],"tools":[{{"type":"function","function":{{"name":"f","parameters":{{"properties":{{"{p}":{{}}}}}}}}}}]}}"#
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[],"functions":[{{"name":"f","description":"{p}"}}]}}"#
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[],"response_format":{{"type":"json_schema","json_schema":{{"name":"s","schema":{{"description":"{p}"}}}}}}}}"#
                ),
            ),
            (
                Endpoint::Responses,
                format!(
                    r#"{{"model":"c","input":"hi","text":{{"format":{{"type":"json_schema","schema":{{"title":"{p}"}}}}}}}}"#
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"c","messages":[{{"role":"tool","tool_call_id":"1","content":"{p}"}}]}}"#
                ),
            ),
            (
                Endpoint::Messages,
                format!(
                    r#"{{"model":"c","messages":[{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"1","content":[{{"type":"text","text":"{p}"}}]}}]}}]}}"#
                ),
            ),
            (
                Endpoint::Messages,
                format!(
                    r#"{{"model":"c","messages":[],"system":[{{"type":"text","text":"{p}"}}]}}"#
                ),
            ),
            (
                Endpoint::Messages,
                format!(
                    r#"{{"model":"c","messages":[],"tools":[{{"name":"t","input_schema":{{}},"description":"{p}"}}]}}"#
                ),
            ),
            (
                Endpoint::Responses,
                format!(r#"{{"model":"c","instructions":"{p}","input":[]}}"#),
            ),
            (
                Endpoint::Completions,
                format!(r#"{{"model":"c","prompt":["ok","{p}"]}}"#),
            ),
            (
                Endpoint::ChatCompletions,
                format!(r#"{{"model":"c","messages":[],"tool_choice":"auto","user":"{p}"}}"#),
            ),
        ] {
            assert_eq!(found(endpoint, body.clone()), Some(0), "{body}");
        }
    }

    #[test]
    fn depth_is_limited_in_every_field() {
        let nested = |field: &str, levels: usize| {
            let messages = if field == "messages" {
                ""
            } else {
                r#""messages":[],"#
            };
            format!(
                r#"{{"model":"m",{messages}"{field}":{}1{}}}"#,
                "[".repeat(levels),
                "]".repeat(levels)
            )
        };
        // The top-level object is level 1: 63 arrays inside it reach 64.
        for field in ["x", "metadata", "messages", "system", "tool_choice"] {
            if field != "tool_choice" {
                chat(&nested(field, 63)).unwrap_or_else(|d| panic!("{field}: {d:?}"));
            }
            let d = chat(&nested(field, 64)).unwrap_err();
            assert_eq!(d.code, DenyCode::InvalidJson, "{field}");
            assert_eq!(d.message, "request body is nested deeper than 64 levels");
        }
        chat(&nested("x", 60)).unwrap();
        // Deep objects in tools are counted too.
        let deep_obj = format!(
            r#"{{"model":"m","messages":[],"tools":[{{"name":"f","parameters":{}1{}}}]}}"#,
            r#"{"a":"#.repeat(70),
            "}".repeat(70)
        );
        assert_eq!(chat(&deep_obj).unwrap_err().code, DenyCode::InvalidJson);
        // Far past serde_json's own limit: refused at level 65, fast, no
        // stack overflow.
        let start = std::time::Instant::now();
        let d = chat(&nested("x", 100_000)).unwrap_err();
        assert_eq!(d.message, "request body is nested deeper than 64 levels");
        let d = chat(&format!(
            r#"{{"model":"m","messages":[],"x":{}"#,
            "[".repeat(100_000)
        ))
        .unwrap_err();
        assert_eq!(d.code, DenyCode::InvalidJson);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    mod agree {
        //! "Judge and forward agree": the tools inspection judges are the
        //! tools an independent reader of the parsed body (what a provider
        //! would forward to the model) finds, and both refuse alike.
        use super::super::*;
        use proptest::prelude::*;
        use serde_json::{json, Map, Value};
        use std::collections::BTreeSet;

        type Tools = BTreeSet<(ToolKind, String)>;

        fn text(v: Option<&Value>) -> Result<Option<&str>, ()> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
                _ => Err(()),
            }
        }

        /// Every tool `v` gives the model, read from the value tree;
        /// `Err` where a request must be refused.
        fn reader(v: &Value) -> Result<Tools, ()> {
            let mut out = Tools::new();
            let list = |field: &str| match v.get(field) {
                None | Some(Value::Null) => Ok(&[][..]),
                Some(Value::Array(a)) => Ok(&a[..]),
                Some(_) => Err(()),
            };
            let function = |name: &str| {
                if name.starts_with("mcp:") {
                    Err(())
                } else {
                    Ok((ToolKind::Function, name.to_string()))
                }
            };
            let mcp = |label: &str, at: &str| {
                if label.contains('@') {
                    Err(())
                } else {
                    Ok((ToolKind::Mcp, format!("mcp:{label}@{at}")))
                }
            };
            for t in list("tools")? {
                let t = t.as_object().ok_or(())?;
                let tool = match text(t.get("type"))? {
                    None | Some("function" | "custom") => {
                        let mut names = BTreeSet::new();
                        names.extend(text(t.get("name"))?);
                        for inner in ["function", "custom"] {
                            match t.get(inner) {
                                None | Some(Value::Null) => {}
                                Some(Value::Object(o)) => names.extend(text(o.get("name"))?),
                                Some(_) => return Err(()),
                            }
                        }
                        match names.len() {
                            1 => function(names.first().ok_or(())?)?,
                            _ => return Err(()),
                        }
                    }
                    Some("mcp") => {
                        let label = text(t.get("server_label"))?.ok_or(())?;
                        match (text(t.get("server_url"))?, text(t.get("connector_id"))?) {
                            (Some(at), None) | (None, Some(at)) => mcp(label, at)?,
                            _ => return Err(()),
                        }
                    }
                    Some(ty) => {
                        text(t.get("name"))?;
                        (ToolKind::BuiltIn, ty.to_string())
                    }
                };
                out.insert(tool);
            }
            for f in list("functions")? {
                out.insert(function(text(f.get("name"))?.ok_or(())?)?);
            }
            for m in list("mcp_servers")? {
                let label = text(m.get("name"))?.ok_or(())?;
                out.insert(mcp(label, text(m.get("url"))?.ok_or(())?)?);
            }
            Ok(out)
        }

        fn name() -> impl Strategy<Value = Value> {
            prop_oneof![
                8 => "[a-z]{1,3}".prop_map(Value::from),
                1 => Just(json!("mcp:x")),
                1 => Just(json!("a@b")),
                1 => Just(json!("")),
                1 => Just(json!(7)),
                1 => Just(Value::Null),
            ]
        }

        fn tool() -> impl Strategy<Value = Value> {
            let builtin = prop_oneof![
                Just("web_search_preview"),
                Just("web_search_20250305"),
                Just("file_search"),
                Just("code_interpreter"),
                Just("computer_use_preview"),
                Just("image_generation"),
                Just("local_shell"),
                Just("bash_20250124"),
            ];
            prop_oneof![
                name().prop_map(|n| json!({"type":"function","function":{"name":n,"parameters":{"type":"object"}}})),
                name().prop_map(|n| json!({"type":"function","name":n,"description":"d"})),
                name().prop_map(|n| json!({"name":n,"input_schema":{}})),
                name().prop_map(|n| json!({"type":"custom","name":n})),
                name().prop_map(|n| json!({"type":"custom","custom":{"name":n}})),
                (name(), name()).prop_map(|(a, b)| json!({"type":"function","name":a,"function":{"name":b}})),
                builtin.clone().prop_map(|t| json!({"type":t})),
                (builtin, name()).prop_map(|(t, n)| json!({"type":t,"name":n})),
                (name(), name()).prop_map(|(l, u)| json!({"type":"mcp","server_label":l,"server_url":u})),
                (name(), name()).prop_map(|(l, c)| json!({"type":"mcp","server_label":l,"connector_id":c})),
                name().prop_map(|l| json!({"type":"mcp","server_label":l})),
                Just(json!({"description":"no name"})),
                Just(json!({"type":"function","function":"f"})),
                Just(json!(1)),
                Just(json!("tool")),
            ]
        }

        fn list(item: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
            prop_oneof![
                3 => Just(None),
                6 => proptest::collection::vec(item, 0..4).prop_map(|v| Some(Value::Array(v))),
                1 => Just(Some(Value::Null)),
                1 => Just(Some(json!({}))),
            ]
        }

        proptest! {
            #[test]
            fn judged_tools_are_the_tools_a_reader_finds(
                tools in list(tool()),
                functions in list(name().prop_map(|n| json!({"name":n,"parameters":{}}))),
                mcp in list((name(), name()).prop_map(|(n, u)| json!({"type":"url","name":n,"url":u}))),
            ) {
                let mut body = Map::new();
                body.insert("model".into(), json!("m"));
                body.insert("messages".into(), json!([]));
                for (k, v) in [("tools", tools), ("functions", functions), ("mcp_servers", mcp)] {
                    if let Some(v) = v {
                        body.insert(k.into(), v);
                    }
                }
                let body = Value::Object(body);
                let bytes = serde_json::to_vec(&body).unwrap();
                let judged = inspect_body(Endpoint::ChatCompletions, &bytes, None);
                match (judged, reader(&body)) {
                    (Ok(f), Ok(expected)) => {
                        let got: Tools = f.tools.iter().map(|t| (t.kind, t.id.clone())).collect();
                        prop_assert_eq!(got, expected);
                    }
                    (Err(d), Err(())) => prop_assert_eq!(d.code, DenyCode::InvalidRequest),
                    (judged, expected) => {
                        prop_assert!(false, "{body}: judged {judged:?}, reader {expected:?}");
                    }
                }
            }
        }
    }

    /// Any JSON value, biased towards the keys inspection reads.
    fn arb_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let key = prop_oneof![
            Just("model".to_string()),
            Just("messages".to_string()),
            Just("tools".to_string()),
            Just("functions".to_string()),
            Just("mcp_servers".to_string()),
            Just("tool_choice".to_string()),
            Just("function_call".to_string()),
            Just("allowed_tools".to_string()),
            Just("type".to_string()),
            Just("name".to_string()),
            Just("function".to_string()),
            Just("server_label".to_string()),
            Just("server_url".to_string()),
            Just("max_tokens".to_string()),
            Just("n".to_string()),
            Just("prompt".to_string()),
            "\\PC{0,6}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
            Just(Value::from("ig\u{AD}NORE")),
        ];
        leaf.prop_recursive(6, 64, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// A sink sees every token of an admitted body, in order, as a
        /// plain read of it gives them; with a sink or without, the facts
        /// are the same.
        #[test]
        fn the_sink_sees_the_tokens_of_the_body(v in arb_json()) {
            #[derive(Default)]
            struct Collect(Vec<String>);
            impl TokenSink for Collect {
                fn token(&mut self, t: Token<'_>) {
                    self.0.push(format!("{t:?}"));
                }
            }
            let serde_json::Value::Object(mut o) = v else { return Ok(()) };
            o.insert("model".into(), "m".into());
            let bytes = serde_json::to_vec(&o).unwrap();
            for e in Endpoint::ALL {
                let mut seen = Collect::default();
                let with = inspect_body_with(e, &bytes, None, &mut seen);
                proptest::prop_assert_eq!(&with, &inspect_body(e, &bytes, None));
                if with.is_ok() {
                    let mut read = Collect::default();
                    crate::tokens::read(&bytes, &mut read).unwrap();
                    proptest::prop_assert_eq!(&seen.0, &read.0);
                }
            }
        }

        /// Inspection never panics on any JSON value, as a body or inside
        /// one, with a phrase matcher or without.
        #[test]
        fn never_panics_on_json_values(v in arb_json(), model in proptest::bool::ANY) {
            let m = PhraseMatcher::new(&["ignore"]).unwrap();
            let mut bodies = vec![v.clone()];
            if let serde_json::Value::Object(mut o) = v {
                if model {
                    o.insert("model".into(), "m".into());
                }
                bodies.push(serde_json::Value::Object(o));
            }
            for body in bodies {
                let bytes = serde_json::to_vec(&body).unwrap();
                for e in Endpoint::ALL {
                    let a = inspect_body(e, &bytes, Some(&m));
                    let b = inspect_body(e, &bytes, None);
                    // The matcher changes only what is found.
                    proptest::prop_assert_eq!(
                        a.clone().map(|f| BodyFacts { blocked_phrase: None, ..f }),
                        b
                    );
                }
            }
        }

        #[test]
        fn never_panics_on_bytes_with_phrases(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            let m = PhraseMatcher::new(&["ignore", "ｄａｎ"]).unwrap();
            let _ = inspect_body(Endpoint::Responses, &body, Some(&m));
        }
    }

    proptest::proptest! {
        /// Joining strings for one search finds what searching each string
        /// in document order finds: never a match across two strings.
        #[test]
        fn joined_search_finds_the_first_phrase_in_order(
            phrases in proptest::collection::vec("[ab]{1,4}", 1..4),
            contents in proptest::collection::vec("[ab ]{0,12}", 0..6),
            long in proptest::option::of(0usize..6),
        ) {
            let m = PhraseMatcher::new(&phrases).unwrap();
            let mut contents = contents;
            if let Some(i) = long.filter(|i| *i < contents.len()) {
                // One string past the join limit, searched in place.
                contents[i] = format!("{}{}", " ".repeat(JOIN_UP_TO), contents[i]);
            }
            let messages: Vec<_> = contents
                .iter()
                .map(|c| serde_json::json!({ "role": "user", "content": c }))
                .collect();
            let body = serde_json::json!({ "model": "m", "messages": messages }).to_string();
            let got = inspect_body(Endpoint::ChatCompletions, body.as_bytes(), Some(&m))
                .unwrap()
                .blocked_phrase;
            let expected = contents.iter().find_map(|c| m.find("user").or_else(|| m.find(c)));
            proptest::prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn malformed_bodies_are_refused_with_codes() {
        let cases = [
            ("", DenyCode::InvalidJson),
            ("{", DenyCode::InvalidJson),
            ("{} x", DenyCode::InvalidJson),
            ("[1]", DenyCode::InvalidJson),
            ("\"s\"", DenyCode::InvalidJson),
            ("null", DenyCode::InvalidJson),
            (r#"{"messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":3,"messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":"","messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":"m"}"#, DenyCode::InvalidMessages),
            (
                r#"{"model":"m","messages":"hi"}"#,
                DenyCode::InvalidMessages,
            ),
            (r#"{"model":"m","messages":{}}"#, DenyCode::InvalidMessages),
            (
                r#"{"model":"a","model":"b","messages":[]}"#,
                DenyCode::InvalidJson,
            ),
            (
                r#"{"model":"a","messages":[],"messages":[]}"#,
                DenyCode::InvalidJson,
            ),
            (
                r#"{"model":"a","messages":[],"system":"x","system":"y"}"#,
                DenyCode::InvalidJson,
            ),
            (
                r#"{"model":"a","messages":[],"tools":[],"tools":[]}"#,
                DenyCode::InvalidJson,
            ),
        ];
        for (body, code) in cases {
            assert_eq!(chat(body).unwrap_err().code, code, "{body}");
        }
    }

    #[test]
    fn duplicate_model_is_named() {
        let d = chat(r#"{"model":"a","messages":[],"model":"b"}"#).unwrap_err();
        assert_eq!(d.message, "duplicate field `model` in request body");
    }

    #[test]
    fn large_bodies_are_counted_not_copied() {
        let msg = format!(r#"{{"role":"user","content":"{}"}}"#, "a".repeat(1000));
        let body = format!(
            r#"{{"model":"m","messages":[{}]}}"#,
            vec![msg; 3000].join(",")
        );
        let f = chat(&body).unwrap();
        assert_eq!(f.messages, Some(3000));
        // `user` and the text: 1004 bytes a message.
        assert_eq!(f.estimated_prompt_tokens(), (3000 * 1004u64).div_ceil(4));
    }

    #[test]
    fn no_panic_on_arbitrary_bytes() {
        for body in [
            &b"\xff\xfe"[..],
            b"{\"model\":\"\xff\"}",
            b"\0",
            b"{\"a\":1e999999}",
        ] {
            let _ = inspect_body(Endpoint::Messages, body, None);
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = inspect_body(Endpoint::ChatCompletions, &body, None);
        }

        #[test]
        fn any_valid_chat_body_yields_its_model(model in "[a-z0-9.-]{1,20}", n in 0usize..20) {
            let msgs = vec![r#"{"role":"user","content":"x"}"#; n].join(",");
            let body = format!(r#"{{"messages":[{msgs}],"model":"{model}"}}"#);
            let f = chat(&body).unwrap();
            proptest::prop_assert_eq!(f.model, model);
            proptest::prop_assert_eq!(f.messages, Some(n));
        }
    }
}
