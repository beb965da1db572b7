//! Tool isolation, the recording side: a task's answers from a tool feed
//! its failure streak (same failing status again and again), a record in
//! the state store (`streak:<agent>/<task>/<tool>`, shared by replicas)
//! that tool admission reads to cut the task off from the tool for a
//! while. A success of a task without a streak writes nothing.

use super::{Admission, End, Env, Feature};
use crate::proxy::ctx::Plan;
use crate::proxy::guards;
use pingora::ErrorSource;
use std::time::Duration;

#[derive(Debug)]
pub struct Streak {
    key: String,
    threshold: u32,
    cooldown: Duration,
}

impl Feature for Streak {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Tool(t) => t.isolation.as_ref().map(|(key, threshold, cooldown)| Streak {
                key: key.clone(),
                threshold: *threshold,
                cooldown: *cooldown,
            }),
            _ => None,
        }
    }

    async fn done(&mut self, env: &Env<'_>, _adm: &Admission, end: &End<'_>) {
        if !end.sent {
            return;
        }
        let failure = match (end.upstream_status, end.error) {
            (Some(s), _) if s >= 400 => Some(u64::from(s)),
            (None, Some(err)) if *err.esource() != ErrorSource::Downstream => Some(1000),
            _ => None,
        };
        let recorded = guards::record_streak(
            env,
            &self.key,
            failure,
            self.threshold,
            self.cooldown,
        )
        .await;
        match recorded {
            Ok(true) => log::warn!(
                "tool isolated for task `{}`: {} identical failures in a row",
                self.key,
                self.threshold
            ),
            Ok(false) => {}
            // The answer is out already: what is lost is one answer's count.
            Err(e) => log::warn!("task `{}`: tool answer not counted: {e}", self.key),
        }
    }
}
