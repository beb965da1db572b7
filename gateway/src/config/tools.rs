//! HTTP tools (`tools:`) and what an agent may do with one (`tool_access`).

use super::providers::{build_provider, UpstreamFields, TOOL_FIELDS};
use super::routes::{Route, Target};
use super::runtime::Errs;
use super::spec::{self, ProviderKind};
use crate::secret::Secret;
use loopgate_policy::PatternList;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// An HTTP tool upstream: a provider-like connection target with its own
/// breaker, served through a one-target route (the gateway never retries a
/// tool call on its own).
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    pub route: Arc<Route>,
    pub idempotency: Option<Idempotency>,
    pub expect_json: bool,
    /// Same failing answer this many times in a row isolates the tool for the task.
    pub isolate_after: u32,
    pub isolate_for: Duration,
    /// `fail_mode: open`: forward when the gateway cannot decide.
    pub fail_open: bool,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub required: bool,
    pub ttl: Duration,
    pub max_record_bytes: usize,
    pub retry_after_failure: bool,
}

/// What an agent may do with one tool.
#[derive(Debug)]
pub struct ToolGrant {
    pub methods: Vec<http::Method>,
    pub paths: PatternList,
    pub max_body_bytes: Option<u64>,
}

pub(super) fn build_tool(
    errs: &mut Errs,
    section: &str,
    fields: UpstreamFields,
    name: &str,
    t: spec::ToolSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Tool> {
    let at = format!("{section}.{name}");
    let (bearer, custom) = match &t.auth {
        None => (None, None),
        Some(a) => match (&a.bearer_env, &a.header, &a.value_env) {
            (Some(b), None, None) => (Some(b.clone()), None),
            (None, Some(h), Some(v)) => (None, Some((h.clone(), v.clone()))),
            _ => {
                errs.push(
                    format!("{at}.auth"),
                    "use either bearer_env, or header with value_env",
                );
                (None, None)
            }
        },
    };
    let idempotency = t.idempotency.as_ref().map(|i| Idempotency {
        required: i.mode == spec::IdempotencyMode::Required,
        ttl: Duration::from_millis(i.ttl_ms.unwrap_or(86_400_000).max(1)),
        max_record_bytes: i.max_record_bytes.unwrap_or(1024 * 1024),
        retry_after_failure: i.retry_after_failure.unwrap_or(false),
    });
    let expect_json = t.expect_json.unwrap_or(false);
    let fail_open = t.fail_mode == Some(spec::FailMode::Open);
    let (isolate_after, isolate_ms) = (t.isolate_after, t.isolate_ms);
    let as_provider = spec::ProviderSpec {
        kind: ProviderKind::OpenaiCompatible,
        base_url: t.base_url,
        api_key_env: bearer,
        anthropic_version: None,
        timeouts: t.timeouts,
        breaker: t.breaker,
    };
    let mut provider = build_provider(errs, section, fields, name, &as_provider, env)?;
    if let Some((header, var)) = custom {
        let name_ok = http::HeaderName::from_bytes(header.as_bytes());
        let value = env(&var).filter(|v| !v.trim().is_empty());
        match (name_ok, value) {
            (Ok(h), Some(v)) => provider.custom_auth = Some((h, Secret::new(v.trim().to_string()))),
            (Err(_), _) => {
                errs.push(
                    format!("{at}.auth.header"),
                    format!("`{header}` is not a header name"),
                );
                return None;
            }
            (_, None) => {
                errs.push(
                    format!("{at}.auth.value_env"),
                    format!("environment variable {var} is not set or empty"),
                );
                return None;
            }
        }
    }
    let provider = Arc::new(provider);
    Some(Tool {
        name: name.to_string(),
        route: Arc::new(Route {
            targets: vec![Target {
                provider,
                weight: 1,
                model: None,
                chat_limit_field: None,
            }],
            max_attempts: 1,
            max_total: Duration::from_secs(600),
            models: Arc::default(),
        }),
        idempotency,
        expect_json,
        isolate_after: isolate_after.unwrap_or(3).max(1),
        isolate_for: Duration::from_millis(isolate_ms.unwrap_or(30_000).max(1)),
        fail_open,
    })
}

/// Builds every tool under `tools:`; a tool with an error is left out (the
/// error is collected).
pub(super) fn build_tools(
    errs: &mut Errs,
    specs: BTreeMap<String, spec::ToolSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> HashMap<String, Arc<Tool>> {
    let mut tools: HashMap<String, Arc<Tool>> = HashMap::new();
    for (name, t) in specs {
        if let Some(tool) = build_tool(errs, "tools", TOOL_FIELDS, &name, t, env) {
            tools.insert(name, Arc::new(tool));
        }
    }
    tools
}
