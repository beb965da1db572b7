//! Money spend as the state store holds it, for `GET /admin/spend` and the
//! `loopgate_budget_used_ratio{agent, scope}` gauge (refreshed at each
//! scrape of `/metrics`): per agent its day and
//! month, per team, and per open task this instance knows of. Read from the
//! store (with Redis: the fleet's spend, not this instance's), in one round
//! trip. Never a secret nor prompt text: names from the config, task ids,
//! amounts.

use crate::config::Config;
use crate::metrics::Metrics;
use loopgate_policy::price::micros_to_usd;
use loopgate_policy::rules::MONTH;
use loopgate_policy::{window_sums, BudgetLevel, StateStore, StoreError};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Most open tasks remembered per agent (the most recently admitted).
pub const TASKS_PER_AGENT: usize = 100;

/// A task id and when it was last admitted.
type Seen = (String, Duration);

/// An agent's windows to read: the level, the index of its [`Read`], and
/// for a task its id.
type AgentReads = Vec<(BudgetLevel, usize, Option<String>)>;

/// A team's windows to read: the level and the index of its [`Read`].
type TeamReads = (Arc<loopgate_policy::Team>, Vec<(BudgetLevel, usize)>);

/// The tasks with a money budget this instance admitted, per agent, most
/// recent last, with when each was last admitted: what `/admin/spend` can
/// list (the store is keyed by task, it cannot be listed).
#[derive(Debug, Default)]
pub struct SpendBook {
    tasks: Mutex<HashMap<Arc<str>, VecDeque<Seen>>>,
}

impl SpendBook {
    /// Task `task` of `agent` was admitted under a money task budget at `now`.
    pub fn saw_task(&self, agent: &Arc<str>, task: &str, now: Duration) {
        let Ok(mut tasks) = self.tasks.lock() else {
            return;
        };
        let list = tasks.entry(agent.clone()).or_default();
        if let Some(i) = list.iter().position(|(t, _)| t == task) {
            list.remove(i);
        }
        if list.len() >= TASKS_PER_AGENT {
            list.pop_front();
        }
        list.push_back((task.to_string(), now));
    }

    /// `agent`'s tasks admitted within `ttl` of `now`, most recent first.
    fn open_tasks(&self, agent: &str, now: Duration, ttl: Duration) -> Vec<String> {
        let Ok(tasks) = self.tasks.lock() else {
            return Vec::new();
        };
        tasks.get(agent).map_or_else(Vec::new, |l| {
            l.iter()
                .rev()
                .filter(|(_, at)| *at + ttl > now)
                .map(|(t, _)| t.clone())
                .collect()
        })
    }
}

/// The gauge's `scope` label for a budget level (a fixed set).
pub fn scope(level: BudgetLevel) -> &'static str {
    match level {
        BudgetLevel::Task => "task",
        BudgetLevel::AgentDay => "day",
        BudgetLevel::AgentMonth => "month",
        BudgetLevel::TeamDay => "team_day",
        BudgetLevel::TeamMonth => "team_month",
    }
}

/// One window to read: where its numbers go.
struct Read {
    key: Arc<str>,
    window: Duration,
    limit: u64,
}

fn window_json(limit: u64, spent: u64) -> Value {
    json!({
        "limit_usd": micros_to_usd(limit),
        "spent_usd": micros_to_usd(spent),
        "left_usd": micros_to_usd(limit.saturating_sub(spent)),
        "used_ratio": spent as f64 / limit.max(1) as f64,
    })
}

/// Which windows `/admin/spend` reads, and whose each is.
#[derive(Default)]
struct Plan {
    reads: Vec<Read>,
    /// Per money-budgeted agent (by index in the config): its reads.
    agents: Vec<(usize, AgentReads)>,
    /// Per team (each once): its reads.
    teams: Vec<TeamReads>,
}

impl Plan {
    /// Every money budget of `cfg`, and each open task of `book`.
    fn of(cfg: &Config, book: &SpendBook, now: Duration) -> Plan {
        let mut p = Plan::default();
        for (i, rules) in cfg.agents.iter().enumerate() {
            if !rules.money_budgeted() {
                continue;
            }
            let b = &rules.budgets;
            let mut mine = Vec::new();
            let k = &rules.keys;
            p.read(
                &mut mine,
                &k.usd_day,
                DAY,
                b.daily_usd,
                BudgetLevel::AgentDay,
                None,
            );
            let month = BudgetLevel::AgentMonth;
            p.read(&mut mine, &k.usd_month, MONTH, b.monthly_usd, month, None);
            if b.task_usd.is_some() {
                for task in book.open_tasks(&rules.name, now, b.task_ttl) {
                    let key = k.usd_task(&task);
                    p.read(
                        &mut mine,
                        &key,
                        b.task_ttl,
                        b.task_usd,
                        BudgetLevel::Task,
                        Some(task),
                    );
                }
            }
            p.agents.push((i, mine));
            let Some(team) = &rules.team else { continue };
            if p.teams.iter().any(|(t, _)| t.name == team.name) {
                continue;
            }
            let mut theirs = Vec::new();
            let (day, month) = (BudgetLevel::TeamDay, BudgetLevel::TeamMonth);
            p.read(&mut theirs, &team.day_key, DAY, team.daily_usd, day, None);
            p.read(
                &mut theirs,
                &team.month_key,
                MONTH,
                team.monthly_usd,
                month,
                None,
            );
            let theirs = theirs.into_iter().map(|(l, at, _)| (l, at)).collect();
            p.teams.push((team.clone(), theirs));
        }
        p
    }

    /// Reads `key` when the budget is set (`limit`), for `whose`.
    fn read(
        &mut self,
        whose: &mut AgentReads,
        key: &Arc<str>,
        window: Duration,
        limit: Option<u64>,
        level: BudgetLevel,
        task: Option<String>,
    ) {
        if let Some(limit) = limit {
            whose.push((level, self.reads.len(), task));
            self.reads.push(Read {
                key: key.clone(),
                window,
                limit,
            });
        }
    }
}

/// Every money budget's spend and room, read from `store` at `now` in one
/// store call; sets the used-ratio gauge on the way (a task's: its most
/// used open task; a team's: under each of its agents).
pub async fn report(
    cfg: &Config,
    store: &dyn StateStore,
    book: &SpendBook,
    metrics: &Metrics,
    now: Duration,
) -> Result<Value, StoreError> {
    let plan = Plan::of(cfg, book, now);
    let windows: Vec<(Arc<str>, Duration)> = plan
        .reads
        .iter()
        .map(|r| (r.key.clone(), r.window))
        .collect();
    let sums = window_sums(store, now, &windows).await?;
    let spent = |i: usize| sums.get(i).copied().unwrap_or(0);
    let ratio = |i: usize| spent(i) as f64 / plan.reads[i].limit.max(1) as f64;
    let window = |i: usize| window_json(plan.reads[i].limit, spent(i));
    let mut agents = Vec::new();
    for (i, mine) in &plan.agents {
        let rules = &cfg.agents[*i];
        let mut entry = json!({
            "agent": &*rules.name,
            "team": rules.team.as_ref().map(|t| &*t.name),
            "day": Value::Null,
            "month": Value::Null,
        });
        let mut tasks = Vec::new();
        let mut task_ratio: Option<f64> = None;
        for (level, at, task) in mine {
            match (level, task) {
                (BudgetLevel::Task, Some(t)) => {
                    task_ratio = Some(task_ratio.map_or(ratio(*at), |r| r.max(ratio(*at))));
                    let mut w = window(*at);
                    w["task"] = json!(t);
                    tasks.push(w);
                }
                (BudgetLevel::AgentDay, _) => entry["day"] = window(*at),
                _ => entry["month"] = window(*at),
            }
            if *level != BudgetLevel::Task {
                metrics.budget_used(&rules.name, *level, ratio(*at));
            }
        }
        if let Some(r) = task_ratio {
            metrics.budget_used(&rules.name, BudgetLevel::Task, r);
        }
        if let Some(limit) = rules.budgets.task_usd {
            entry["task_limit_usd"] = json!(micros_to_usd(limit));
            entry["tasks"] = json!(tasks);
        }
        let team = rules.team.as_ref();
        let theirs = team.and_then(|t| plan.teams.iter().find(|(u, _)| u.name == t.name));
        for (level, at) in theirs.map_or(&[][..], |(_, r)| &r[..]) {
            metrics.budget_used(&rules.name, *level, ratio(*at));
        }
        agents.push(entry);
    }
    let teams: Vec<Value> = plan
        .teams
        .iter()
        .map(|(t, theirs)| {
            let mut v = json!({"team": &*t.name, "day": Value::Null, "month": Value::Null});
            for (level, at) in theirs {
                let slot = if *level == BudgetLevel::TeamDay {
                    "day"
                } else {
                    "month"
                };
                v[slot] = window(*at);
            }
            v
        })
        .collect();
    Ok(json!({"agents": agents, "teams": teams}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_book_keeps_the_most_recent_open_tasks() {
        let book = SpendBook::default();
        let a: Arc<str> = Arc::from("a");
        let s = Duration::from_secs;
        for i in 0..(TASKS_PER_AGENT + 5) {
            book.saw_task(&a, &format!("t{i}"), s(i as u64));
        }
        book.saw_task(&a, "t10", s(1000));
        let open = book.open_tasks("a", s(1000), s(10_000));
        assert_eq!(open.len(), TASKS_PER_AGENT);
        assert_eq!(open[0], "t10", "most recent first, seen once");
        assert!(!open.contains(&"t0".to_string()), "the oldest went");
        // Idle past the budget's memory: not open any more.
        assert_eq!(book.open_tasks("a", s(1000), s(1)), vec!["t10".to_string()]);
        assert!(book.open_tasks("b", s(0), s(1)).is_empty());
    }
}
