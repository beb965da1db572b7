//! An agent's compiled rules and their evaluation, in the one documented
//! order (see the crate docs), with enforce and dry-run modes.

use crate::body::{BodyFacts, ToolKind};
use crate::decision::{BudgetDetail, BudgetLevel, Deny, DenyCode};
use crate::endpoint::Endpoint;
use crate::output::OutputLimit;
use crate::pattern::PatternList;
use crate::phrases::PhraseMatcher;
use crate::price::{fmt_usd, Price};
use crate::store::{AdmitOutcome, Lease, Refusal, SlotTake, StateStore, WindowTake};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// `enforce` denies; `dry_run` lets the request through and reports what it
/// would have denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Enforce,
    DryRun,
}

/// What `max_tokens_over_limit` does with a body asking for more output
/// tokens than the agent's `max_tokens`: refuse it (400, the default), or
/// lower it to the agent's limit and send it (frameworks such as
/// LangChain send a model's whole output maximum, 64000, unasked by
/// their user).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverLimit {
    #[default]
    Refuse,
    Clamp,
}

/// Per-agent limits; `None` means no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_in_flight: Option<u64>,
}

/// Token and money budgets. A model call reserves its estimated prompt
/// plus `max_tokens` (or `default_max_tokens`) from each token budget, and
/// what that costs at the model's price from each money budget; both
/// settle on the reported usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    /// Tokens one task (`x-agent-task-id`) may use in all.
    pub task_tokens: Option<u64>,
    /// How long a task's budget is remembered after its last use.
    pub task_ttl: Duration,
    /// Tokens the agent may use in any 24 hours.
    pub daily_tokens: Option<u64>,
    pub default_max_tokens: u64,
    /// Micro-dollars one task may spend in all (`task_usd`).
    pub task_usd: Option<u64>,
    /// Micro-dollars the agent may spend in any 24 hours (`daily_usd`).
    pub daily_usd: Option<u64>,
    /// Micro-dollars the agent may spend in any 30 days (`monthly_usd`).
    pub monthly_usd: Option<u64>,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            task_tokens: None,
            task_ttl: Duration::from_secs(24 * 3600),
            daily_tokens: None,
            default_max_tokens: 1024,
            task_usd: None,
            daily_usd: None,
            monthly_usd: None,
        }
    }
}

/// A team: agents sharing money budgets (`teams:`; an agent is in at most
/// one). Its windows are one pair of store keys whichever agent spends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team {
    pub name: Arc<str>,
    /// Micro-dollars in any 24 hours.
    pub daily_usd: Option<u64>,
    /// Micro-dollars in any 30 days.
    pub monthly_usd: Option<u64>,
    /// `@<team>:usd:day`: `@` is in no agent name, so no agent key is a
    /// team's.
    pub day_key: Arc<str>,
    pub month_key: Arc<str>,
}

impl Team {
    pub fn new(name: &str, daily_usd: Option<u64>, monthly_usd: Option<u64>) -> Team {
        Team {
            name: Arc::from(name),
            daily_usd,
            monthly_usd,
            day_key: Arc::from(format!("@{name}:usd:day")),
            month_key: Arc::from(format!("@{name}:usd:month")),
        }
    }
}

/// What a model call asks of the money budgets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoneyAsk {
    /// Micro-dollars reserved: the prompt estimate at the input price plus
    /// the output limit at the output price.
    pub reserve: u64,
    /// The prompt estimate's part of it.
    pub prompt: u64,
    /// The price reserved at (the output price turns money room into the
    /// output tokens a stream may still produce).
    pub price: Price,
}

/// What one request asks of the limits.
#[derive(Debug, Clone, Copy)]
pub struct LimitRequest<'a> {
    pub estimated_prompt: u64,
    pub max_tokens: Option<u64>,
    /// The task id, when the request named one.
    pub task: Option<&'a str>,
    /// Further windows taken in the same atomic call (an MCP tool's call rate).
    pub extra: &'a [WindowTake],
    /// A model call under a money budget: what it reserves.
    pub money: Option<MoneyAsk>,
    /// The body set no output limit, and the output reserved is the
    /// budgets' `default_max_tokens` (this many per completion): a budget
    /// refusal says so, and how to ask for less.
    pub default_output: Option<u64>,
    /// Whether the token and money budgets and the token rate count this
    /// call. `false` for a `count_tokens` call: it produces nothing and
    /// costs nothing, so it takes only the request rate and an in-flight
    /// slot.
    pub budgets: bool,
}

/// What an admitted request holds on its limits.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsTaken {
    pub lease: Lease,
    /// Windows whose reservation is replaced by the reported usage.
    pub settle_keys: Vec<Arc<str>>,
    /// Money windows, whose reservation is replaced by the reported
    /// usage's cost in micro-dollars.
    pub money_keys: Vec<Arc<str>>,
    /// Output tokens this request may still produce under its budgets (its
    /// own reservation plus what the budgets have left); `None` without budgets.
    pub budget_room: Option<u64>,
    /// Output tokens the money budgets still pay for at the output price
    /// (this call's reservation plus what they have left, less the prompt
    /// estimate); `None` without money budgets or with free output.
    pub money_room: Option<u64>,
    /// Share of the task budget used, after this reservation (the larger
    /// of the token and the money task budget's).
    pub task_budget_used: Option<f64>,
    /// Each money budget's share used, after this reservation.
    pub money_used: Vec<(BudgetLevel, f64)>,
}

impl LimitsTaken {
    /// Nothing taken (no limits apply, or none could be).
    pub fn none() -> LimitsTaken {
        LimitsTaken {
            lease: Lease::empty(),
            settle_keys: Vec::new(),
            money_keys: Vec::new(),
            budget_room: None,
            money_room: None,
            task_budget_used: None,
            money_used: Vec::new(),
        }
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);
/// A month of money budgets: a sliding 30 days.
pub const MONTH: Duration = Duration::from_secs(30 * 24 * 3600);

/// What a window of [`AgentRules::limit_takes`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowKind {
    Rate,
    /// A token budget; `true` for the task's.
    Tokens(bool),
    Money(BudgetLevel),
    /// The caller's extra windows (MCP tool call rates).
    Extra,
}

/// Everything admission checks for one agent (global defaults already
/// merged with the agent's overrides).
#[derive(Debug)]
pub struct AgentRules {
    pub name: Arc<str>,
    pub models: PatternList,
    /// `None`: every served endpoint.
    pub paths: Option<HashSet<Endpoint>>,
    /// Tool grants, matched against each tool's [`crate::body::ToolUse::id`]
    /// (function name, built-in type, `mcp:<label>@<address>`).
    /// `None`: any function or built-in tool, but no MCP connector.
    pub tools: Option<PatternList>,
    /// Lower-case header names that must be present and non-empty.
    pub required_headers: Vec<String>,
    pub max_body_bytes: u64,
    pub max_tokens: Option<u64>,
    /// A larger `max_tokens` asked: refused, or lowered to `max_tokens`.
    pub over_limit: OverLimit,
    pub max_messages: Option<usize>,
    pub phrases: Option<Arc<PhraseMatcher>>,
    pub limits: Limits,
    pub budgets: Budgets,
    /// The team whose money budgets the agent also spends from.
    pub team: Option<Arc<Team>>,
    pub mode: Mode,
    /// Rules in dry-run while `mode` is enforce.
    pub dry_run: HashSet<DenyCode>,
    /// This agent's state-store keys, built once from `name`.
    pub keys: AgentKeys,
}

/// An agent's state-store keys (`{name}:rpm` and so on), built once when
/// the rules are: every admission takes them, shared, without building or
/// copying a string.
#[derive(Debug, Clone)]
pub struct AgentKeys {
    rpm: Arc<str>,
    tpm: Arc<str>,
    day: Arc<str>,
    inflight: Arc<str>,
    /// `{agent}:budget:task:`, followed by the task id.
    task: Arc<str>,
    pub usd_day: Arc<str>,
    pub usd_month: Arc<str>,
    /// `{agent}:usd:task:`, followed by the task id.
    usd_task: Arc<str>,
}

impl AgentKeys {
    pub fn new(agent: &str) -> AgentKeys {
        let key = |suffix: &str| Arc::from(format!("{agent}{suffix}"));
        AgentKeys {
            rpm: key(":rpm"),
            tpm: key(":tpm"),
            day: key(":budget:day"),
            inflight: key(":inflight"),
            task: key(":budget:task:"),
            usd_day: key(":usd:day"),
            usd_month: key(":usd:month"),
            usd_task: key(":usd:task:"),
        }
    }

    /// The money budget key of task `task`.
    pub fn usd_task(&self, task: &str) -> Arc<str> {
        Arc::from(format!("{}{task}", self.usd_task))
    }
}

/// What the rules decided for a request they let through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The first denial a dry-run rule would have made.
    pub would_deny: Option<Deny>,
}

impl Verdict {
    /// Applies a denial decided outside these rules (loop guard, watchdog)
    /// with the same enforce / dry-run semantics.
    pub fn judge_external(
        &mut self,
        rules: &AgentRules,
        outcome: Option<Deny>,
    ) -> Result<(), Deny> {
        self.judge(rules, outcome)
    }

    /// Applies one rule's outcome: a dry-run denial is recorded and the
    /// evaluation continues; an enforced one ends it.
    fn judge(&mut self, rules: &AgentRules, outcome: Option<Deny>) -> Result<(), Deny> {
        match outcome {
            None => Ok(()),
            Some(d) if rules.is_dry_run(d.code) => {
                self.would_deny.get_or_insert(d);
                Ok(())
            }
            Some(d) => Err(d),
        }
    }
}

/// What [`AgentRules::check_body`] leaves the gateway to do with a body it
/// let through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyPlan {
    /// The body's output limit, and the agent's limit (divided among `n`
    /// completions) to set when the body bounds no output tokens: written
    /// per attempt under the field its target reads, capped at that
    /// model's maximum ([`OutputLimit::edit`], [`crate::output`]).
    pub output: OutputLimit,
    /// Output tokens the request may cost, to reserve from rate limits and
    /// budgets (pass as [`LimitRequest::max_tokens`]): its max_tokens (as
    /// sent or to be inserted, else the budgets' `default_max_tokens`)
    /// times `n`. A target's cap only lowers what is sent.
    pub output_tokens: u64,
    /// The body bounds no output: `output_tokens` is the budgets'
    /// `default_max_tokens` per completion (inserted as its limit when
    /// budgets are enforced). A budget refusal says so
    /// ([`LimitRequest::default_output`]).
    pub default_output: Option<u64>,
}

/// What a refusal of a larger `max_tokens` adds: the setting that would
/// have lowered it instead.
const OVER_LIMIT_HINT: &str =
    " (set `max_tokens_over_limit: clamp` for this agent to lower it to the limit instead)";

const MINUTE: Duration = Duration::from_secs(60);

impl AgentRules {
    /// Rules with nothing but a model allowlist (tests, simple configs).
    pub fn new(name: &str, models: PatternList, max_body_bytes: u64) -> AgentRules {
        AgentRules {
            name: Arc::from(name),
            models,
            paths: None,
            tools: None,
            required_headers: Vec::new(),
            max_body_bytes,
            max_tokens: None,
            over_limit: OverLimit::Refuse,
            max_messages: None,
            phrases: None,
            limits: Limits::default(),
            budgets: Budgets::default(),
            team: None,
            mode: Mode::Enforce,
            dry_run: HashSet::new(),
            keys: AgentKeys::new(name),
        }
    }

    pub fn is_dry_run(&self, code: DenyCode) -> bool {
        code.dry_runnable() && (self.mode == Mode::DryRun || self.dry_run.contains(&code))
    }

    /// Cheap checks on the request head: path, then required headers.
    pub fn check_head<'h>(
        &self,
        endpoint: Endpoint,
        header: impl Fn(&str) -> Option<&'h [u8]>,
        verdict: &mut Verdict,
    ) -> Result<(), Deny> {
        let allowed = endpoint.allowed_as();
        let path = (!self.paths.as_ref().is_none_or(|p| p.contains(&allowed))).then(|| {
            Deny::new(
                DenyCode::PathNotAllowed,
                format!("agent `{}` may not call {}", self.name, endpoint.path()),
            )
        });
        verdict.judge(self, path)?;
        let missing = self
            .required_headers
            .iter()
            .find(|h| header(h).is_none_or(|v| v.trim_ascii().is_empty()))
            .map(|h| Deny::new(DenyCode::MissingHeader, format!("header `{h}` is required")));
        verdict.judge(self, missing)
    }

    /// Body rules: model, tools, max tokens, message count, blocked phrases.
    ///
    /// Output tokens: a request may cost `max_tokens × n` (see
    /// [`BodyFacts::output_tokens`]), which must fit the agent's
    /// `max_tokens` limit. A body that bounds nothing would get the
    /// provider's default, however large: with a limit the returned plan
    /// says to insert `limit / n` per completion (refused when not even one
    /// token per completion fits), unless `max_tokens_exceeded` is in
    /// dry-run, where the body goes unchanged.
    ///
    /// On success returns what the gateway must still do with the body
    /// ([`BodyPlan`]): apply `output` per attempt ([`OutputLimit::edit`]
    /// with the attempt's target, then
    /// [`crate::rewrite::apply_limit_edit`]), and reserve `output_tokens`
    /// (as [`LimitRequest::max_tokens`]).
    pub fn check_body(&self, facts: &BodyFacts, verdict: &mut Verdict) -> Result<BodyPlan, Deny> {
        let model = (!self.models.allows(&facts.model)).then(|| {
            Deny::new(
                DenyCode::ModelNotAllowed,
                format!(
                    "agent `{}` may not use model `{}`",
                    self.name,
                    clip(&facts.model)
                ),
            )
        });
        verdict.judge(self, model)?;
        verdict.judge(self, self.tool_denial(facts))?;
        let n = facts.choices();
        let mut insert = None;
        // `max_tokens_over_limit: clamp`: the agent's limit replaces the
        // larger one asked, sent under the field each target reads (as an
        // inserted limit is). Not under dry-run: the body goes unchanged.
        let clamp =
            self.over_limit == OverLimit::Clamp && !self.is_dry_run(DenyCode::MaxTokensExceeded);
        let mut clamped = false;
        let tokens = match (self.max_tokens, facts.max_tokens) {
            (Some(max), Some(asked)) if asked.saturating_mul(n) > max => {
                if clamp && max / n > 0 {
                    insert = Some(max / n);
                    clamped = true;
                    None
                } else {
                    Some(Deny::new(
                        DenyCode::MaxTokensExceeded,
                        if n > 1 {
                            format!(
                                "max_tokens {asked} for each of n = {n} completions ({}) exceeds this agent's limit of {max}{OVER_LIMIT_HINT}",
                                asked.saturating_mul(n)
                            )
                        } else {
                            format!("max_tokens {asked} exceeds this agent's limit of {max}{OVER_LIMIT_HINT}")
                        },
                    ))
                }
            }
            (Some(max), None) => match facts.max_tokens_field {
                Some(_) if max / n == 0 => Some(Deny::new(
                    DenyCode::MaxTokensExceeded,
                    format!(
                        "n = {n} completions cannot fit this agent's max_tokens limit of {max}"
                    ),
                )),
                Some(_) if !self.is_dry_run(DenyCode::MaxTokensExceeded) => {
                    insert = Some(max / n);
                    None
                }
                _ => None,
            },
            _ => None,
        };
        verdict.judge(self, tokens)?;
        let mut default_output = None;
        if insert.is_none() && facts.max_tokens.is_none() && facts.max_tokens_field.is_some() {
            // A budget reserves `default_max_tokens` per completion for a
            // body that bounds nothing; unsent, that size would bound
            // nothing either (the provider's default output, however large,
            // would settle far past the reservation).
            insert = self.reserved_output_insert();
            default_output = Some(self.budgets.default_max_tokens);
        }
        let per_choice = match clamped {
            true => insert,
            false => facts.max_tokens.or(insert),
        }
        .unwrap_or(self.budgets.default_max_tokens);
        let plan = BodyPlan {
            output: OutputLimit {
                present: facts.limit_fields,
                asked: facts.limit_field.zip(facts.max_tokens).filter(|_| !clamped),
                insert,
            },
            output_tokens: per_choice.saturating_mul(n),
            default_output,
        };
        let messages = match (self.max_messages, facts.messages) {
            (Some(max), Some(n)) if n > max => Some(Deny::new(
                DenyCode::TooManyMessages,
                format!("{n} messages exceed this agent's limit of {max}"),
            )),
            _ => None,
        };
        verdict.judge(self, messages)?;
        verdict.judge(self, self.phrase_deny(facts.blocked_phrase))?;
        Ok(plan)
    }

    /// The refusal for blocked phrase `found` (an index into this agent's
    /// matcher, as [`BodyFacts::blocked_phrase`] gives it), if any: for
    /// the body as sent and for what translation made of it.
    pub fn phrase_deny(&self, found: Option<usize>) -> Option<Deny> {
        match (&self.phrases, found) {
            (Some(m), Some(i)) if i < m.len() => Some(Deny::new(
                DenyCode::BlockedPhrase,
                format!("the request contains a blocked phrase (`{}`)", m.phrase(i)),
            )),
            _ => None,
        }
    }

    /// The first tool of the request this agent may not use. With a tool
    /// allowlist every tool must match it by its [`crate::body::ToolUse::id`]; without
    /// one, any function or built-in tool passes but an MCP connector never
    /// does: handing the provider a remote server to call is granted
    /// explicitly (`mcp:...`, see [`crate::body`]) or not at all.
    fn tool_denial(&self, facts: &BodyFacts) -> Option<Deny> {
        let t = facts.tools.iter().find(|t| match &self.tools {
            Some(allowed) => !allowed.allows(&t.id),
            None => t.kind == ToolKind::Mcp,
        })?;
        let msg = match (t.kind, &self.tools) {
            (ToolKind::Mcp, None) => format!(
                "agent `{}` may not use MCP server `{}`: MCP servers need a grant in the agent's tools",
                self.name,
                clip(&t.id)
            ),
            (ToolKind::Mcp, Some(_)) => format!(
                "agent `{}` may not use MCP server `{}`",
                self.name,
                clip(&t.id)
            ),
            _ => format!("agent `{}` may not use tool `{}`", self.name, clip(&t.id)),
        };
        Some(Deny::new(DenyCode::ToolNotAllowed, msg))
    }

    /// Step 8: takes every limit that applies in one atomic store call.
    /// A store failure denies with `state_unavailable` (fail closed).
    pub async fn admit_limits(
        &self,
        store: &dyn StateStore,
        now: Duration,
        req: &LimitRequest<'_>,
        verdict: &mut Verdict,
    ) -> Result<LimitsTaken, Deny> {
        let reserve = self.token_reserve(req);
        if let (None, Some(limit), true) = (req.task, self.budgets.task_tokens, req.budgets) {
            // A request without a task id is a task of its own.
            if reserve > limit {
                let d = Deny::new(
                    DenyCode::BudgetExceeded,
                    format!("this request reserves {reserve} tokens, more than the task budget of {limit}"),
                )
                .never_retryable();
                verdict.judge(self, Some(default_hint(req, d)))?;
            }
        }
        if let (None, Some(limit), Some(money)) = (req.task, self.budgets.task_usd, req.money) {
            if money.reserve > limit {
                let d = money_deny(BudgetLevel::Task, limit, money.reserve, None);
                verdict.judge(self, Some(default_hint(req, d)))?;
            }
        }
        let (windows, slots) = self.limit_takes(req);
        if windows.is_empty() && slots.is_empty() {
            return Ok(LimitsTaken::none());
        }
        match store.admit(now, &windows, &slots).await {
            Ok(AdmitOutcome::Taken {
                lease,
                would_refuse,
                remaining,
            }) => {
                if let Some(r) = would_refuse {
                    verdict
                        .would_deny
                        .get_or_insert(default_hint(req, self.refusal_deny(&r, &windows, &slots)));
                }
                let out = reserve.saturating_sub(req.estimated_prompt);
                let mut room: Option<u64> = None;
                let mut money_left: Option<u64> = None;
                let mut task_used: Option<f64> = None;
                let mut settle_keys = Vec::with_capacity(windows.len());
                let mut money_keys = Vec::new();
                let mut money_used = Vec::new();
                for (w, left) in windows.iter().zip(&remaining) {
                    let used = || w.limit.saturating_sub(*left) as f64 / w.limit.max(1) as f64;
                    match self.window_kind(&w.key) {
                        WindowKind::Rate if w.key == self.keys.rpm => {}
                        WindowKind::Rate | WindowKind::Extra => settle_keys.push(w.key.clone()),
                        WindowKind::Tokens(task) => {
                            settle_keys.push(w.key.clone());
                            room = Some(room.map_or(*left, |r: u64| r.min(*left)));
                            if task {
                                task_used = Some(task_used.map_or(used(), |u| u.max(used())));
                            }
                        }
                        WindowKind::Money(level) => {
                            money_keys.push(w.key.clone());
                            money_used.push((level, used()));
                            money_left = Some(money_left.map_or(*left, |r: u64| r.min(*left)));
                            if level == BudgetLevel::Task {
                                task_used = Some(task_used.map_or(used(), |u| u.max(used())));
                            }
                        }
                    }
                }
                // What the call may spend: its own reservation plus what
                // is left; the prompt is paid first, the rest buys output.
                // Budgets in dry-run only report: they cut no stream.
                let cuts = !self.is_dry_run(DenyCode::BudgetExceeded);
                let (room, money_left) = if cuts {
                    (room, money_left)
                } else {
                    (None, None)
                };
                let money_room = match (money_left, req.money) {
                    (Some(left), Some(m)) => m
                        .price
                        .output_tokens_for(left.saturating_add(m.reserve).saturating_sub(m.prompt)),
                    _ => None,
                };
                Ok(LimitsTaken {
                    settle_keys,
                    money_keys,
                    lease,
                    budget_room: room.map(|r| r.saturating_add(out)),
                    money_room,
                    task_budget_used: task_used,
                    money_used,
                })
            }
            Ok(AdmitOutcome::Refused(r)) => {
                Err(default_hint(req, self.refusal_deny(&r, &windows, &slots)))
            }
            Err(e) => Err(Deny::new(
                DenyCode::StateUnavailable,
                format!("limits could not be checked: {}", e.0),
            )),
        }
    }

    /// What a call reserves from its token budgets: its prompt estimate
    /// plus its output limit, saturating (`max_tokens` is the agent's to
    /// set, up to 2^64-1: a wrapped sum would reserve almost nothing).
    pub fn token_reserve(&self, req: &LimitRequest<'_>) -> u64 {
        req.estimated_prompt
            .saturating_add(req.max_tokens.unwrap_or(self.budgets.default_max_tokens))
    }

    /// The limits this request must take from the state store.
    pub fn limit_takes(&self, req: &LimitRequest<'_>) -> (Vec<WindowTake>, Vec<SlotTake>) {
        let estimated_tokens = req.estimated_prompt;
        let reserve = self.token_reserve(req);
        // At most nine of ours, plus the tool limits the caller adds.
        let mut windows = Vec::with_capacity(9 + req.extra.len());
        if let Some(limit) = self.limits.requests_per_minute {
            windows.push(WindowTake {
                key: self.keys.rpm.clone(),
                limit,
                window: MINUTE,
                cost: 1,
                enforce: !self.is_dry_run(DenyCode::RateLimited),
            });
        }
        if let (Some(limit), true) = (self.limits.tokens_per_minute, req.budgets) {
            windows.push(WindowTake {
                key: self.keys.tpm.clone(),
                limit,
                window: MINUTE,
                cost: estimated_tokens,
                enforce: !self.is_dry_run(DenyCode::RateLimited),
            });
        }
        let budget_enforced = !self.is_dry_run(DenyCode::BudgetExceeded);
        if let (Some(limit), true) = (self.budgets.daily_tokens, req.budgets) {
            windows.push(WindowTake {
                key: self.keys.day.clone(),
                limit,
                window: DAY,
                cost: reserve,
                enforce: budget_enforced,
            });
        }
        if let (Some(limit), Some(task), true) = (self.budgets.task_tokens, req.task, req.budgets) {
            windows.push(WindowTake {
                key: format!("{}:budget:task:{task}", self.name).into(),
                limit,
                window: self.budgets.task_ttl,
                cost: reserve,
                enforce: budget_enforced,
            });
        }
        if let (Some(money), true) = (req.money, req.budgets) {
            let team = self.team.as_deref();
            let task_key = req.task.map(|t| self.keys.usd_task(t));
            for (limit, key, window) in [
                (self.budgets.daily_usd, Some(self.keys.usd_day.clone()), DAY),
                (
                    self.budgets.monthly_usd,
                    Some(self.keys.usd_month.clone()),
                    MONTH,
                ),
                (self.budgets.task_usd, task_key, self.budgets.task_ttl),
                (
                    team.and_then(|t| t.daily_usd),
                    team.map(|t| t.day_key.clone()),
                    DAY,
                ),
                (
                    team.and_then(|t| t.monthly_usd),
                    team.map(|t| t.month_key.clone()),
                    MONTH,
                ),
            ] {
                if let (Some(limit), Some(key)) = (limit, key) {
                    windows.push(WindowTake {
                        key,
                        limit,
                        window,
                        cost: money.reserve,
                        enforce: budget_enforced,
                    });
                }
            }
        }
        windows.extend_from_slice(req.extra);
        let slots = self
            .limits
            .max_in_flight
            .map(|limit| SlotTake {
                key: self.keys.inflight.clone(),
                limit,
                enforce: !self.is_dry_run(DenyCode::TooManyInFlight),
            })
            .into_iter()
            .collect();
        (windows, slots)
    }

    /// The denial for a store refusal of the takes from [`Self::limit_takes`].
    pub fn refusal_deny(
        &self,
        refusal: &Refusal,
        windows: &[WindowTake],
        slots: &[SlotTake],
    ) -> Deny {
        let kind = match refusal {
            Refusal::Window { index, .. } => windows.get(*index).map(|w| self.window_kind(&w.key)),
            Refusal::Slot { .. } => None,
        };
        if let (Refusal::Window { index, retry_after }, Some(WindowKind::Money(level))) =
            (refusal, kind)
        {
            let w = &windows[*index];
            return money_deny(level, w.limit, w.cost, *retry_after);
        }
        match refusal {
            Refusal::Window { index, retry_after }
                if matches!(kind, Some(WindowKind::Tokens(_))) =>
            {
                let w = &windows[*index];
                let daily = w.key == self.keys.day;
                let scope = if daily { "daily" } else { "task" };
                let d = Deny::new(
                    DenyCode::BudgetExceeded,
                    format!(
                        "this request reserves {} tokens; the {scope} budget of {} tokens cannot fit it",
                        w.cost, w.limit
                    ),
                );
                match (daily, retry_after) {
                    (true, Some(after)) => d.retry_after(*after),
                    _ => d.never_retryable(),
                }
            }
            Refusal::Window { index, retry_after } if windows[*index].key.contains(":mcp:") => {
                let w = &windows[*index];
                let tool = w.key.rsplit(':').next().unwrap_or("?");
                let d = Deny::new(
                    DenyCode::RateLimited,
                    format!(
                        "agent `{}` is over its limit of {} calls per minute to tool `{tool}`",
                        self.name, w.limit
                    ),
                );
                match retry_after {
                    Some(after) => d.retry_after(*after),
                    None => d.never_retryable(),
                }
            }
            Refusal::Window { index, retry_after } => {
                let w = &windows[*index];
                let what = if w.key == self.keys.tpm {
                    "tokens"
                } else {
                    "requests"
                };
                match retry_after {
                    Some(after) => Deny::new(
                        DenyCode::RateLimited,
                        format!(
                            "agent `{}` is over its limit of {} {what} per minute",
                            self.name, w.limit
                        ),
                    )
                    .retry_after(*after),
                    None => Deny::new(
                        DenyCode::RateLimited,
                        format!(
                            "this request needs {} {what}, more than agent `{}`'s limit of {} per minute",
                            w.cost, self.name, w.limit
                        ),
                    )
                    .never_retryable(),
                }
            }
            Refusal::Slot { index } => Deny::new(
                DenyCode::TooManyInFlight,
                format!(
                    "agent `{}` already has {} requests in flight",
                    self.name, slots[*index].limit
                ),
            )
            // A slot frees when any request ends; one second is an honest hint.
            .retry_after(Duration::from_secs(1)),
        }
    }
}

impl AgentRules {
    /// Whether any money budget applies to this agent's model calls.
    /// The output size a budget reserves per completion for a body that
    /// bounds none, to be sent as its limit: `default_max_tokens` when a
    /// token or money budget applies and budgets are enforced (in dry-run
    /// they only report, and the body goes as the agent wrote it).
    fn reserved_output_insert(&self) -> Option<u64> {
        let b = &self.budgets;
        let reserves = b.task_tokens.is_some() || b.daily_tokens.is_some() || self.money_budgeted();
        (reserves && !self.is_dry_run(DenyCode::BudgetExceeded) && b.default_max_tokens > 0)
            .then_some(b.default_max_tokens)
    }

    pub fn money_budgeted(&self) -> bool {
        let b = &self.budgets;
        b.task_usd.is_some()
            || b.daily_usd.is_some()
            || b.monthly_usd.is_some()
            || self
                .team
                .as_ref()
                .is_some_and(|t| t.daily_usd.is_some() || t.monthly_usd.is_some())
    }

    /// What the window `key` of [`Self::limit_takes`] is, by the agent's
    /// own keys (never by searching the key: a task id is the agent's text).
    fn window_kind(&self, key: &str) -> WindowKind {
        let k = &self.keys;
        let team = self.team.as_deref();
        if key == &*k.rpm || key == &*k.tpm {
            WindowKind::Rate
        } else if key == &*k.day {
            WindowKind::Tokens(false)
        } else if key == &*k.usd_day {
            WindowKind::Money(BudgetLevel::AgentDay)
        } else if key == &*k.usd_month {
            WindowKind::Money(BudgetLevel::AgentMonth)
        } else if team.is_some_and(|t| key == &*t.day_key) {
            WindowKind::Money(BudgetLevel::TeamDay)
        } else if team.is_some_and(|t| key == &*t.month_key) {
            WindowKind::Money(BudgetLevel::TeamMonth)
        } else if key.starts_with(&*k.usd_task) {
            WindowKind::Money(BudgetLevel::Task)
        } else if key.starts_with(&*k.task) {
            WindowKind::Tokens(true)
        } else {
            WindowKind::Extra
        }
    }
}

/// A money budget's refusal: 402 `budget_exceeded` naming the level and
/// the amounts; with `Retry-After` when the window will free room (a task
/// budget never does: it is the task's in all).
/// A budget refusal of a call whose body set no output limit: the
/// reservation was the budgets' `default_max_tokens`, which the agent never
/// chose; it is told so, and that asking for less may fit.
fn default_hint(req: &LimitRequest<'_>, mut d: Deny) -> Deny {
    if let (DenyCode::BudgetExceeded, Some(default)) = (d.code, req.default_output) {
        d.message.push_str(&format!(
            " (the request set no output limit, so `budgets.default_max_tokens` ({default} output tokens \
             per completion) was reserved for its answer: set `max_tokens` to what the call needs)"
        ));
    }
    d
}

fn money_deny(level: BudgetLevel, limit: u64, reserve: u64, retry_after: Option<Duration>) -> Deny {
    let d = Deny::new(
        DenyCode::BudgetExceeded,
        format!(
            "this request reserves ${}; the {} of ${} cannot fit it",
            fmt_usd(reserve),
            level.describe(),
            fmt_usd(limit)
        ),
    )
    .with_budget(BudgetDetail {
        level,
        limit,
        reserve,
    });
    match (level, retry_after) {
        (BudgetLevel::Task, _) | (_, None) => d.never_retryable(),
        (_, Some(after)) => d.retry_after(after),
    }
}

/// Bounds agent-controlled text echoed in a message.
fn clip(s: &str) -> &str {
    crate::decision::clip(s, 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ToolUse;
    use crate::usage::Usage;

    fn rules() -> AgentRules {
        let mut r = AgentRules::new("a", PatternList::parse(&["gpt-4o"]).unwrap(), 1000);
        r.tools = Some(PatternList::parse(&["get_*", "search"]).unwrap());
        r.required_headers = vec!["x-agent-task-id".into()];
        r.max_tokens = Some(100);
        r.max_messages = Some(2);
        r.phrases = Some(Arc::new(PhraseMatcher::new(&["jailbreak"]).unwrap()));
        r.paths = Some([Endpoint::ChatCompletions].into());
        r
    }

    fn facts() -> BodyFacts {
        BodyFacts {
            model: "gpt-4o".into(),
            messages: Some(1),
            tools: vec![
                ToolUse::function("get_weather"),
                ToolUse::function("search"),
            ],
            max_tokens: Some(50),
            ..BodyFacts::default()
        }
    }

    fn head(r: &AgentRules, e: Endpoint, task: Option<&'static str>) -> Result<Verdict, Deny> {
        let mut v = Verdict::default();
        r.check_head(
            e,
            |h| {
                (h == "x-agent-task-id")
                    .then_some(task)
                    .flatten()
                    .map(str::as_bytes)
            },
            &mut v,
        )?;
        Ok(v)
    }

    fn body(r: &AgentRules, f: &BodyFacts) -> Result<Verdict, Deny> {
        let mut v = Verdict::default();
        r.check_body(f, &mut v)?;
        Ok(v)
    }

    fn plan(r: &AgentRules, f: &BodyFacts) -> Result<BodyPlan, Deny> {
        r.check_body(f, &mut Verdict::default())
    }

    #[test]
    fn an_inserted_limit_is_what_the_provider_reads() {
        let r = rules();
        for (endpoint, body) in [
            (
                Endpoint::ChatCompletions,
                &br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"n":2}"#[..],
            ),
            (Endpoint::Responses, br#"{"model":"gpt-4o","input":"hi"}"#),
            (
                Endpoint::Messages,
                br#"{"model":"gpt-4o","max_tokens":null,"messages":[]}"#,
            ),
        ] {
            let facts = crate::inspect_body(endpoint, body, None).unwrap();
            let first = plan(&r, &facts).unwrap();
            let field = crate::LimitField::from_name(facts.max_tokens_field.unwrap()).unwrap();
            let target = crate::TargetOutput {
                field,
                max_output: None,
                clamp_asked: false,
            };
            let edit = first.output.edit(&target).unwrap();
            let out = crate::rewrite::apply_limit_edit(body, &edit).unwrap();
            let again = crate::inspect_body(endpoint, &out, None).unwrap();
            assert_eq!(again.output_tokens(), Some(first.output_tokens));
            assert!(again.output_tokens() <= r.max_tokens);
            let second = plan(&r, &again).unwrap();
            assert_eq!(second.output.insert, None);
            assert_eq!(second.output.edit(&target), None, "nothing left to change");
        }
    }

    #[test]
    fn max_tokens_times_n_must_fit_and_a_missing_limit_is_inserted() {
        let r = rules(); // max_tokens limit 100
        let with = |max_tokens: Option<u64>, n| BodyFacts {
            max_tokens,
            limit_field: max_tokens.map(|_| crate::LimitField::MaxTokens),
            limit_fields: max_tokens
                .map(|_| crate::LimitField::MaxTokens)
                .into_iter()
                .collect(),
            n,
            max_tokens_field: Some("max_tokens"),
            ..facts()
        };
        assert_eq!(
            plan(&r, &with(Some(50), Some(2))).unwrap(),
            BodyPlan {
                output: OutputLimit {
                    asked: Some((crate::LimitField::MaxTokens, 50)),
                    present: [crate::LimitField::MaxTokens].into_iter().collect(),
                    insert: None
                },
                output_tokens: 100,
                default_output: None
            }
        );
        let d = plan(&r, &with(Some(50), Some(3))).unwrap_err();
        assert_eq!(d.code, DenyCode::MaxTokensExceeded);
        assert!(d.message.contains("n = 3"), "{}", d.message);
        assert_eq!(
            plan(&r, &with(Some(u64::MAX), Some(u64::MAX)))
                .unwrap_err()
                .code,
            DenyCode::MaxTokensExceeded
        );
        // Omitted: the limit is inserted, shared among the completions.
        assert_eq!(
            plan(&r, &with(None, None)).unwrap(),
            BodyPlan {
                output: OutputLimit {
                    insert: Some(100),
                    ..OutputLimit::default()
                },
                output_tokens: 100,
                default_output: None
            }
        );
        let mut f = with(None, Some(3));
        f.max_tokens_field = Some("max_output_tokens");
        assert_eq!(
            plan(&r, &f).unwrap(),
            BodyPlan {
                output: OutputLimit {
                    insert: Some(33),
                    ..OutputLimit::default()
                },
                output_tokens: 99,
                default_output: None
            }
        );
        assert_eq!(
            plan(&r, &with(None, Some(101))).unwrap_err().code,
            DenyCode::MaxTokensExceeded
        );
        // No field to bound (embeddings): nothing inserted.
        let mut f = with(None, None);
        f.max_tokens_field = None;
        assert_eq!(plan(&r, &f).unwrap().output.insert, None);
        // Dry-run: reported, the body left as it is.
        let mut dry = rules();
        dry.dry_run.insert(DenyCode::MaxTokensExceeded);
        assert_eq!(
            plan(&dry, &with(None, None)).unwrap(),
            BodyPlan {
                output: OutputLimit::default(),
                output_tokens: 1024,
                default_output: Some(1024)
            }
        );
        // Without a limit: the default output reservation, times n.
        let mut free = rules();
        free.max_tokens = None;
        assert_eq!(
            plan(&free, &with(None, Some(4))).unwrap(),
            BodyPlan {
                output: OutputLimit::default(),
                output_tokens: 4096,
                default_output: Some(1024)
            }
        );
    }

    #[test]
    fn a_budgets_output_reservation_is_sent_as_the_limit() {
        let bare = |n| BodyFacts {
            n,
            max_tokens: None,
            max_tokens_field: Some("max_tokens"),
            ..facts()
        };
        let mut r = rules();
        r.max_tokens = None;
        // No budget: nothing reserved, nothing inserted.
        assert_eq!(plan(&r, &bare(None)).unwrap().output.insert, None);
        for budgets in [
            Budgets {
                daily_usd: Some(10_000),
                default_max_tokens: 100,
                ..Budgets::default()
            },
            Budgets {
                daily_tokens: Some(5_000),
                default_max_tokens: 100,
                ..Budgets::default()
            },
            Budgets {
                task_tokens: Some(5_000),
                default_max_tokens: 100,
                ..Budgets::default()
            },
        ] {
            r.budgets = budgets;
            // Reserved 100 per completion, and 100 per completion sent.
            assert_eq!(
                plan(&r, &bare(Some(3))).unwrap(),
                BodyPlan {
                    output: OutputLimit {
                        insert: Some(100),
                        ..OutputLimit::default()
                    },
                    output_tokens: 300,
                    default_output: Some(100)
                }
            );
            // The agent's own limit goes as it sent it.
            let asked = BodyFacts {
                max_tokens: Some(40),
                limit_field: Some(crate::LimitField::MaxTokens),
                ..bare(None)
            };
            assert_eq!(plan(&r, &asked).unwrap().output.insert, None);
            assert_eq!(plan(&r, &asked).unwrap().output_tokens, 40);
            // Embeddings bound no output.
            let embed = BodyFacts {
                max_tokens_field: None,
                ..bare(None)
            };
            assert_eq!(plan(&r, &embed).unwrap().output.insert, None);
        }
        // A team's money budget reserves too.
        r.budgets = Budgets {
            default_max_tokens: 64,
            ..Budgets::default()
        };
        r.team = Some(Arc::new(Team::new("ops", Some(1), None)));
        assert_eq!(plan(&r, &bare(None)).unwrap().output.insert, Some(64));
        // Budgets in dry-run only report: the body goes as written.
        r.dry_run.insert(DenyCode::BudgetExceeded);
        assert_eq!(plan(&r, &bare(None)).unwrap().output.insert, None);
        assert_eq!(plan(&r, &bare(None)).unwrap().output_tokens, 64);
    }

    #[test]
    fn allowed_request_passes_every_rule() {
        let r = rules();
        assert_eq!(
            head(&r, Endpoint::ChatCompletions, Some("t1")).unwrap(),
            Verdict::default()
        );
        assert_eq!(body(&r, &facts()).unwrap(), Verdict::default());
    }

    #[test]
    fn each_rule_denies_with_its_code() {
        let r = rules();
        assert_eq!(
            head(&r, Endpoint::Embeddings, Some("t")).unwrap_err().code,
            DenyCode::PathNotAllowed
        );
        assert_eq!(
            head(&r, Endpoint::ChatCompletions, None).unwrap_err().code,
            DenyCode::MissingHeader
        );
        assert_eq!(
            head(&r, Endpoint::ChatCompletions, Some("  "))
                .unwrap_err()
                .code,
            DenyCode::MissingHeader
        );
        type Change = fn(&mut BodyFacts);
        let cases: Vec<(Change, DenyCode)> = vec![
            (
                |f| f.model = "gpt-4o-2024-05-13".into(),
                DenyCode::ModelNotAllowed,
            ),
            (
                |f| f.tools.push(ToolUse::function("delete_everything")),
                DenyCode::ToolNotAllowed,
            ),
            (|f| f.max_tokens = Some(101), DenyCode::MaxTokensExceeded),
            (|f| f.messages = Some(3), DenyCode::TooManyMessages),
            (|f| f.blocked_phrase = Some(0), DenyCode::BlockedPhrase),
        ];
        for (change, code) in cases {
            let mut f = facts();
            change(&mut f);
            let d = body(&r, &f).unwrap_err();
            assert_eq!(d.code, code);
            assert!(!d.retryable);
        }
    }

    #[test]
    fn order_is_model_before_tools_before_phrases() {
        let r = rules();
        let mut f = facts();
        f.blocked_phrase = Some(0);
        f.tools.push(ToolUse::function("rm"));
        assert_eq!(body(&r, &f).unwrap_err().code, DenyCode::ToolNotAllowed);
        f.model = "other".into();
        assert_eq!(body(&r, &f).unwrap_err().code, DenyCode::ModelNotAllowed);
    }

    #[test]
    fn dry_run_reports_the_first_would_deny_and_lets_through() {
        let mut r = rules();
        r.mode = Mode::DryRun;
        let mut f = facts();
        f.tools.push(ToolUse::function("rm"));
        f.blocked_phrase = Some(0);
        let v = body(&r, &f).unwrap();
        assert_eq!(v.would_deny.unwrap().code, DenyCode::ToolNotAllowed);
        // Per rule: only phrases in dry-run; tools still enforced.
        let mut r = rules();
        r.dry_run.insert(DenyCode::BlockedPhrase);
        let mut f = facts();
        f.blocked_phrase = Some(0);
        assert_eq!(
            body(&r, &f).unwrap().would_deny.unwrap().code,
            DenyCode::BlockedPhrase
        );
        f.tools.push(ToolUse::function("rm"));
        assert_eq!(body(&r, &f).unwrap_err().code, DenyCode::ToolNotAllowed);
    }

    #[test]
    fn tools_are_judged_by_id_and_mcp_needs_a_grant() {
        let mcp = ToolUse {
            kind: ToolKind::Mcp,
            id: "mcp:gh@https://mcp.example/gh".into(),
            field: "mcp_servers",
        };
        let builtin = ToolUse {
            kind: ToolKind::BuiltIn,
            id: "web_search_20250305".into(),
            field: "tools",
        };
        let with = |tools: Vec<ToolUse>| BodyFacts { tools, ..facts() };
        // Without an allowlist: functions and built-ins pass, MCP never.
        let mut r = rules();
        r.tools = None;
        body(
            &r,
            &with(vec![ToolUse::function("anything"), builtin.clone()]),
        )
        .unwrap();
        let d = body(&r, &with(vec![mcp.clone()])).unwrap_err();
        assert_eq!(d.code, DenyCode::ToolNotAllowed);
        assert!(d.message.contains("MCP server `mcp:gh@"), "{}", d.message);
        // With one: each by its id, `search_*`-style grants do not reach
        // a server tool's type, `mcp:*` grants connectors, `*` everything.
        let mut r = rules();
        r.tools = Some(PatternList::parse(&["lookup_invoice", "search_*"]).unwrap());
        for t in [builtin.clone(), mcp.clone()] {
            assert_eq!(
                body(&r, &with(vec![t])).unwrap_err().code,
                DenyCode::ToolNotAllowed
            );
        }
        r.tools = Some(PatternList::parse(&["web_search_*", "mcp:*"]).unwrap());
        body(&r, &with(vec![builtin.clone(), mcp.clone()])).unwrap();
        r.tools = Some(PatternList::parse(&["mcp:gh@https://other/*"]).unwrap());
        assert!(body(&r, &with(vec![mcp.clone()])).is_err());
        r.tools = Some(PatternList::parse(&["*"]).unwrap());
        body(&r, &with(vec![builtin, mcp])).unwrap();
    }

    #[test]
    fn limits_produce_takes_with_dry_run_flags() {
        let mut r = rules();
        r.limits = Limits {
            requests_per_minute: Some(10),
            tokens_per_minute: Some(1000),
            max_in_flight: Some(2),
        };
        r.dry_run.insert(DenyCode::TooManyInFlight);
        let (w, s) = r.limit_takes(&LimitRequest {
            extra: &[],
            money: None,
            default_output: None,
            budgets: true,
            estimated_prompt: 42,
            max_tokens: None,
            task: None,
        });
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].cost, w[0].enforce), (1, true));
        assert_eq!((w[1].cost, &*w[1].key), (42, "a:tpm"));
        assert!(!s[0].enforce);
        let d = r.refusal_deny(
            &Refusal::Window {
                index: 1,
                retry_after: Some(Duration::from_millis(2500)),
            },
            &w,
            &s,
        );
        assert_eq!(
            (d.code, d.retry_after_secs(), d.retryable),
            (DenyCode::RateLimited, Some(3), true)
        );
        assert!(
            d.message.contains("1000 tokens per minute"),
            "{}",
            d.message
        );
        let d = r.refusal_deny(
            &Refusal::Window {
                index: 1,
                retry_after: None,
            },
            &w,
            &s,
        );
        assert!(!d.retryable && d.retry_after.is_none());
        assert_eq!(
            r.refusal_deny(&Refusal::Slot { index: 0 }, &w, &s).code,
            DenyCode::TooManyInFlight
        );
    }

    #[derive(Debug)]
    struct BrokenStore;

    #[async_trait::async_trait]
    impl StateStore for BrokenStore {
        async fn admit(
            &self,
            _: Duration,
            _: &[WindowTake],
            _: &[SlotTake],
        ) -> Result<AdmitOutcome, crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn settle(
            &self,
            _: Duration,
            _: &Lease,
            _: &str,
            _: u64,
        ) -> Result<(), crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn release(&self, _: &Lease) -> Result<(), crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn record_get(
            &self,
            _: Duration,
            _: &str,
        ) -> Result<Option<(u64, Vec<u8>)>, crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn record_swap(
            &self,
            _: Duration,
            _: &str,
            _: Option<u64>,
            _: Vec<u8>,
            _: Duration,
        ) -> Result<bool, crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn idem_begin(
            &self,
            _: Duration,
            _: &str,
            _: [u8; 32],
            _: Duration,
            _: bool,
        ) -> Result<crate::store::IdemBegin, crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
        async fn idem_finish(
            &self,
            _: Duration,
            _: &str,
            _: Option<crate::store::IdemOutcome>,
        ) -> Result<(), crate::StoreError> {
            Err(crate::StoreError("connection refused".into()))
        }
    }

    fn one() -> LimitRequest<'static> {
        LimitRequest {
            extra: &[],
            money: None,
            default_output: None,
            budgets: true,
            estimated_prompt: 1,
            max_tokens: Some(0),
            task: None,
        }
    }

    #[test]
    fn a_larger_limit_is_refused_naming_the_setting_or_clamped_to_the_agents() {
        let asked = |max_tokens: u64, n| BodyFacts {
            max_tokens: Some(max_tokens),
            limit_field: Some(crate::LimitField::MaxTokens),
            limit_fields: [crate::LimitField::MaxTokens].into_iter().collect(),
            n,
            max_tokens_field: Some("max_tokens"),
            ..facts()
        };
        let mut r = rules(); // max_tokens limit 100
        let d = plan(&r, &asked(64000, None)).unwrap_err();
        assert_eq!(
            (d.code, d.code.status()),
            (DenyCode::MaxTokensExceeded, 400)
        );
        assert_eq!(
            d.message,
            "max_tokens 64000 exceeds this agent's limit of 100 (set \
             `max_tokens_over_limit: clamp` for this agent to lower it to the limit instead)"
        );
        r.over_limit = OverLimit::Clamp;
        // Lowered to the limit, sent under the field the target reads
        // (the field the agent used is replaced, not kept beside it).
        let p = plan(&r, &asked(64000, None)).unwrap();
        assert_eq!(
            p,
            BodyPlan {
                output: OutputLimit {
                    present: [crate::LimitField::MaxTokens].into_iter().collect(),
                    asked: None,
                    insert: Some(100),
                },
                output_tokens: 100,
                default_output: None,
            }
        );
        let target = crate::TargetOutput {
            field: crate::LimitField::MaxTokens,
            max_output: None,
            clamp_asked: false,
        };
        assert_eq!(
            p.output.edit(&target).unwrap().set,
            Some((crate::LimitField::MaxTokens, 100))
        );
        // Shared among n completions: 3 × 33.
        let p = plan(&r, &asked(64000, Some(3))).unwrap();
        assert_eq!((p.output.insert, p.output_tokens), (Some(33), 99));
        // A limit within the agent's goes as sent.
        let p = plan(&r, &asked(40, None)).unwrap();
        assert_eq!(
            (p.output.asked, p.output.insert),
            (Some((crate::LimitField::MaxTokens, 40)), None)
        );
        // Not even one token per completion fits: still refused.
        assert_eq!(
            plan(&r, &asked(5, Some(101))).unwrap_err().code,
            DenyCode::MaxTokensExceeded
        );
        // Under dry-run the body goes unchanged (the refusal only reported).
        r.dry_run.insert(DenyCode::MaxTokensExceeded);
        let mut v = Verdict::default();
        let p = r.check_body(&asked(64000, None), &mut v).unwrap();
        assert_eq!(p.output.asked, Some((crate::LimitField::MaxTokens, 64000)));
        assert_eq!(
            v.would_deny.map(|d| d.code),
            Some(DenyCode::MaxTokensExceeded)
        );
    }

    #[test]
    fn count_tokens_is_allowed_with_messages_and_takes_no_budget() {
        let mut r = rules();
        r.paths = Some([Endpoint::Messages].into());
        assert!(head(&r, Endpoint::CountTokens, Some("t")).is_ok());
        r.paths = Some([Endpoint::ChatCompletions].into());
        let d = head(&r, Endpoint::CountTokens, Some("t")).unwrap_err();
        assert_eq!(d.code, DenyCode::PathNotAllowed);
        assert!(
            d.message.ends_with("/v1/messages/count_tokens"),
            "{}",
            d.message
        );
        r.limits = Limits {
            requests_per_minute: Some(10),
            tokens_per_minute: Some(1000),
            max_in_flight: Some(2),
        };
        r.budgets = Budgets {
            task_tokens: Some(1000),
            daily_tokens: Some(5000),
            daily_usd: Some(1_000_000),
            ..Budgets::default()
        };
        let money = MoneyAsk {
            reserve: 5,
            prompt: 1,
            price: crate::Price::default(),
        };
        let req = |budgets| LimitRequest {
            extra: &[],
            money: Some(money),
            default_output: None,
            budgets,
            estimated_prompt: 10,
            max_tokens: Some(0),
            task: Some("t1"),
        };
        let keys = |budgets| {
            let (w, s) = r.limit_takes(&req(budgets));
            (
                w.iter().map(|w| w.key.to_string()).collect::<Vec<_>>(),
                s.len(),
            )
        };
        assert_eq!(
            keys(true),
            (
                vec![
                    "a:rpm".to_string(),
                    "a:tpm".into(),
                    "a:budget:day".into(),
                    "a:budget:task:t1".into(),
                    "a:usd:day".into()
                ],
                1
            )
        );
        assert_eq!(keys(false), (vec!["a:rpm".to_string()], 1));
    }

    #[test]
    fn a_budget_refusal_of_the_default_output_says_so() {
        let mut r = rules();
        r.max_tokens = None;
        r.budgets = Budgets {
            task_tokens: Some(1000),
            default_max_tokens: 2000,
            ..Budgets::default()
        };
        let bare = BodyFacts {
            max_tokens: None,
            max_tokens_field: Some("max_tokens"),
            ..facts()
        };
        let p = plan(&r, &bare).unwrap();
        assert_eq!(
            (p.default_output, p.output.insert),
            (Some(2000), Some(2000))
        );
        let store = crate::MemoryStore::new();
        let req = |default_output| LimitRequest {
            extra: &[],
            money: None,
            default_output,
            budgets: true,
            estimated_prompt: 10,
            max_tokens: Some(2000),
            task: Some("t1"),
        };
        let mut v = Verdict::default();
        let d = block_on(r.admit_limits(&store, Duration::ZERO, &req(p.default_output), &mut v))
            .unwrap_err();
        assert_eq!((d.code, d.code.status()), (DenyCode::BudgetExceeded, 402));
        assert_eq!(
            d.message,
            "this request reserves 2010 tokens; the task budget of 1000 tokens cannot fit it \
             (the request set no output limit, so `budgets.default_max_tokens` (2000 output \
             tokens per completion) was reserved for its answer: set `max_tokens` to what the \
             call needs)"
        );
        // The agent's own limit: no such hint.
        let d = block_on(r.admit_limits(&store, Duration::ZERO, &req(None), &mut v)).unwrap_err();
        assert!(!d.message.contains("default_max_tokens"), "{}", d.message);
        // Without a task id, the up-front task check says the same.
        let alone = LimitRequest {
            task: None,
            ..req(Some(2000))
        };
        let d = block_on(r.admit_limits(&store, Duration::ZERO, &alone, &mut v)).unwrap_err();
        assert!(d.message.contains("set `max_tokens`"), "{}", d.message);
    }

    #[test]
    fn budgets_reserve_settle_and_refuse_with_their_code() {
        let mut r = rules();
        r.budgets = Budgets {
            task_tokens: Some(1000),
            daily_tokens: Some(5000),
            default_max_tokens: 200,
            ..Budgets::default()
        };
        let store = crate::MemoryStore::new();
        let mut v = Verdict::default();
        let req = |prompt, max: Option<u64>| LimitRequest {
            extra: &[],
            money: None,
            default_output: None,
            budgets: true,
            estimated_prompt: prompt,
            max_tokens: max,
            task: Some("t1"),
        };
        // 100 prompt + 200 default output reserved from the task's 1000.
        let taken =
            block_on(r.admit_limits(&store, Duration::ZERO, &req(100, None), &mut v)).unwrap();
        assert_eq!(taken.task_budget_used, Some(0.3));
        assert_eq!(
            taken.budget_room,
            Some(700 + 200),
            "what is left plus its own output reservation"
        );
        assert_eq!(
            taken.settle_keys,
            [Arc::from("a:budget:day"), Arc::from("a:budget:task:t1")]
        );
        // Settled at the real usage: 150 instead of 300.
        for k in &taken.settle_keys {
            block_on(store.settle(Duration::ZERO, &taken.lease, k, 150)).unwrap();
        }
        let taken =
            block_on(r.admit_limits(&store, Duration::ZERO, &req(100, Some(700)), &mut v)).unwrap();
        assert_eq!(taken.task_budget_used, Some(0.95));
        let d = block_on(r.admit_limits(&store, Duration::ZERO, &req(10, Some(100)), &mut v))
            .unwrap_err();
        assert_eq!(
            (d.code, d.code.status(), d.retryable),
            (DenyCode::BudgetExceeded, 402, false)
        );
        assert!(d.message.contains("task budget of 1000"), "{}", d.message);
        // Another task still has its own budget; a request without a task id is its own task.
        assert!(block_on(r.admit_limits(
            &store,
            Duration::ZERO,
            &LimitRequest {
                task: Some("t2"),
                ..req(10, Some(10))
            },
            &mut v
        ))
        .is_ok());
        let d = block_on(r.admit_limits(
            &store,
            Duration::ZERO,
            &LimitRequest {
                task: None,
                ..req(10, Some(2000))
            },
            &mut v,
        ))
        .unwrap_err();
        assert_eq!(d.code, DenyCode::BudgetExceeded);
        // The daily budget (5000) refuses with a true Retry-After: the
        // first reservation, at 0 s, leaves the window with its slice (the
        // first 144 s) at 86 544 s.
        let tasks = ["t3", "t4", "t5", "t6", "t7", "t8"];
        let d = tasks
            .iter()
            .find_map(|t| {
                let req = LimitRequest {
                    task: Some(t),
                    ..req(900, Some(0))
                };
                block_on(r.admit_limits(&store, Duration::from_secs(10), &req, &mut v)).err()
            })
            .expect("the daily budget runs out");
        assert_eq!(
            (d.code, d.retryable, d.retry_after_secs()),
            (DenyCode::BudgetExceeded, true, Some(86_534))
        );
    }

    #[test]
    fn an_absurd_output_limit_saturates_the_reservation_and_is_refused() {
        let mut r = rules();
        r.budgets = Budgets {
            task_tokens: Some(1000),
            ..Budgets::default()
        };
        let store = crate::MemoryStore::new();
        let mut v = Verdict::default();
        for task in [None, Some("t1")] {
            let req = LimitRequest {
                extra: &[],
                money: None,
                estimated_prompt: 2,
                max_tokens: Some(u64::MAX),
                default_output: None,
                budgets: true,
                task,
            };
            // 2 + (2^64 - 1) wrapped to 1, which fit the 1000.
            assert_eq!(r.token_reserve(&req), u64::MAX);
            let d = block_on(r.admit_limits(&store, Duration::ZERO, &req, &mut v)).unwrap_err();
            assert_eq!(d.code, DenyCode::BudgetExceeded, "{task:?}");
            assert!(
                d.message.contains(&format!("reserves {} tokens", u64::MAX)),
                "{}",
                d.message
            );
        }
        // Nothing was taken: a call that fits still does.
        let fits = LimitRequest {
            task: Some("t1"),
            ..one()
        };
        assert!(block_on(r.admit_limits(&store, Duration::ZERO, &fits, &mut v)).is_ok());
    }

    #[test]
    fn money_budgets_reserve_settle_and_name_the_level_that_refused() {
        // $1 per million in, $10 out: a call of 100 prompt tokens and 100
        // output reserves 100 + 1000 micro-dollars.
        let price = Price {
            input: 1.0,
            output: 10.0,
            cache_read: 0.5,
            cache_write: 1.25,
        };
        let ask = |prompt: u64, out: u64| MoneyAsk {
            reserve: price.reserve_micros(prompt, out),
            prompt: price.reserve_micros(prompt, 0),
            price,
        };
        let mut r = rules();
        r.budgets.daily_usd = Some(5_000);
        r.budgets.monthly_usd = Some(100_000);
        r.budgets.task_usd = Some(3_000);
        r.team = Some(Arc::new(Team::new("ops", Some(4_000), None)));
        assert!(r.money_budgeted());
        let mut mate = rules();
        mate.name = "b".into();
        mate.keys = AgentKeys::new("b");
        mate.team = r.team.clone();
        let store = crate::MemoryStore::new();
        let mut v = Verdict::default();
        let req = |task, money| LimitRequest {
            extra: &[],
            money: Some(money),
            default_output: None,
            budgets: true,
            estimated_prompt: 100,
            max_tokens: Some(100),
            task: Some(task),
        };
        let t0 = Duration::from_secs(1);
        let taken =
            block_on(r.admit_limits(&store, t0, &req("t1", ask(100, 100)), &mut v)).unwrap();
        assert_eq!(
            taken.money_keys,
            [
                Arc::from("a:usd:day"),
                Arc::from("a:usd:month"),
                Arc::from("a:usd:task:t1"),
                Arc::from("@ops:usd:day")
            ]
        );
        assert!(taken.settle_keys.is_empty(), "no token budgets");
        // Left after it: task 3000 - 1100 = 1900, the least; plus its own
        // 1100, less the prompt's 100: 2900 micro-dollars = 290 tokens out.
        assert_eq!(taken.money_room, Some(290));
        assert_eq!(taken.task_budget_used, Some(1100.0 / 3000.0));
        // Settled down to what it cost: 100 in, 20 out = 300.
        let cost = price.cost_micros(&Usage {
            input_tokens: 100,
            output_tokens: 20,
            ..Usage::default()
        });
        assert_eq!(cost, 300);
        let settle: Vec<(&str, u64)> = taken.money_keys.iter().map(|k| (&**k, cost)).collect();
        block_on(store.finish(t0, &taken.lease, &settle)).unwrap();
        // The team's day (4000) is shared: agent b spends 3300 of it.
        let b = block_on(mate.admit_limits(&store, t0, &req("x", ask(300, 300)), &mut v)).unwrap();
        assert_eq!(b.money_keys, [Arc::from("@ops:usd:day")]);
        let d =
            block_on(r.admit_limits(&store, t0, &req("t2", ask(100, 100)), &mut v)).unwrap_err();
        assert_eq!((d.code, d.code.status()), (DenyCode::BudgetExceeded, 402));
        let detail = d.budget.clone().unwrap();
        assert_eq!(
            (detail.level, detail.limit, detail.reserve),
            (BudgetLevel::TeamDay, 4_000, 1_100)
        );
        assert!(
            d.message.contains("team's daily budget of $0.004"),
            "{}",
            d.message
        );
        // Its room comes back a day after the first slice (144 s) ended.
        assert_eq!(d.retry_after_secs(), Some(86_400 + 144 - 1));
        // Settled up: b's answer cost more than it reserved (3300 -> 3700).
        let settle: Vec<(&str, u64)> = b.money_keys.iter().map(|k| (&**k, 3_700)).collect();
        block_on(store.finish(t0, &b.lease, &settle)).unwrap();
        let d = block_on(mate.admit_limits(&store, t0, &req("y", ask(0, 1)), &mut v)).unwrap_err();
        assert_eq!(d.budget.unwrap().level, BudgetLevel::TeamDay);
        // The task budget: never retryable; without a task id, a call is
        // its own task.
        r.team = None;
        let d =
            block_on(r.admit_limits(&store, t0, &req("t1", ask(2000, 100)), &mut v)).unwrap_err();
        assert_eq!(d.budget.unwrap().level, BudgetLevel::Task);
        assert!(!d.retryable && d.retry_after.is_none());
        let alone = LimitRequest {
            task: None,
            ..req("", ask(3000, 100))
        };
        let d = block_on(r.admit_limits(&store, t0, &alone, &mut v)).unwrap_err();
        assert_eq!(d.budget.unwrap().level, BudgetLevel::Task);
        // The agent's day: 300 spent, 5000 in all; 4710 more does not fit.
        r.budgets.task_usd = None;
        let d = block_on(r.admit_limits(&store, t0, &req("t3", ask(0, 471)), &mut v)).unwrap_err();
        assert_eq!(d.budget.unwrap().level, BudgetLevel::AgentDay);
        assert!(d.retryable && d.retry_after.is_some());
        // Dry-run: reported, taken, and no stream is cut for it.
        r.dry_run.insert(DenyCode::BudgetExceeded);
        let mut v = Verdict::default();
        let t = block_on(r.admit_limits(&store, t0, &req("t3", ask(0, 471)), &mut v)).unwrap();
        assert_eq!(v.would_deny.unwrap().code, DenyCode::BudgetExceeded);
        assert_eq!((t.money_room, t.budget_room), (None, None));
        // No money asked (a tool call): no money windows.
        let (w, _) = r.limit_takes(&LimitRequest {
            money: None,
            default_output: None,
            budgets: true,
            ..req("t", ask(1, 1))
        });
        assert!(w.is_empty());
    }

    #[test]
    fn a_task_id_that_looks_like_another_key_is_still_its_task() {
        let mut r = rules();
        r.budgets.task_usd = Some(10);
        r.budgets.task_tokens = Some(10);
        assert_eq!(
            r.window_kind("a:usd:task:x:budget:day"),
            WindowKind::Money(BudgetLevel::Task)
        );
        assert_eq!(
            r.window_kind("a:budget:task:a:usd:day"),
            WindowKind::Tokens(true)
        );
        assert_eq!(r.window_kind("a:budget:day"), WindowKind::Tokens(false));
        assert_eq!(r.window_kind("a:mcp:fs:read"), WindowKind::Extra);
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_failing_store_denies_with_state_unavailable_even_in_dry_run() {
        let mut r = rules();
        r.limits.requests_per_minute = Some(100);
        r.mode = Mode::DryRun;
        let d = block_on(r.admit_limits(
            &BrokenStore,
            Duration::ZERO,
            &one(),
            &mut Verdict::default(),
        ))
        .unwrap_err();
        assert_eq!(
            (d.code, d.code.status(), d.retryable),
            (DenyCode::StateUnavailable, 503, true)
        );
        // Without limits configured the store is not consulted at all.
        r.limits = Limits::default();
        assert!(block_on(r.admit_limits(
            &BrokenStore,
            Duration::ZERO,
            &one(),
            &mut Verdict::default()
        ))
        .is_ok());
    }

    #[test]
    fn limits_with_a_real_store_and_a_manual_clock() {
        use crate::clock::{Clock, ManualClock};
        let mut r = rules();
        r.limits.requests_per_minute = Some(2);
        let store = crate::MemoryStore::new();
        let clock = ManualClock::default();
        let mut v = Verdict::default();
        for _ in 0..2 {
            block_on(r.admit_limits(&store, clock.now(), &one(), &mut v)).unwrap();
        }
        clock.advance(Duration::from_secs(20));
        let d = block_on(r.admit_limits(&store, clock.now(), &one(), &mut v)).unwrap_err();
        // The first two leave the window at the end of their 100 ms slice
        // plus a minute: 40.1 s from now, 41 in whole seconds.
        assert_eq!(
            (d.code, d.retry_after_secs()),
            (DenyCode::RateLimited, Some(41))
        );
        clock.advance(Duration::from_secs(40));
        assert!(block_on(r.admit_limits(&store, clock.now(), &one(), &mut v)).is_err());
        clock.advance(Duration::from_secs(1));
        block_on(r.admit_limits(&store, clock.now(), &one(), &mut v)).unwrap();
    }
}
