//! The watchdog's spend prediction, fed: each settled step of a task
//! whose agent predicts spend adds its cost to the task's fit in the state
//! store (`spend:<agent>/<task>`, see `policy::predict`), which admission
//! reads to predict the task's spend at its next call (on any replica).

use super::{Admission, End, Env, Feature};
use crate::proxy::guards;
use std::time::Duration;

#[derive(Debug)]
pub struct SpendFit {
    key: String,
    ttl: Duration,
}

impl Feature for SpendFit {
    fn arm(adm: &Admission) -> Option<Self> {
        let (key, ttl) = (adm.task_key.clone()?, adm.spend_fit?);
        Some(SpendFit { key, ttl })
    }

    async fn done(&mut self, env: &Env<'_>, adm: &Admission, end: &End<'_>) {
        // A step without a known cost (no usage, refused upstream) is not
        // a step of the fit: it would read as a free one. The cost is the
        // one the money budgets settle, in the same micro-dollars.
        let (Some(usage), Some(served)) = (end.usage, end.served_by) else {
            return;
        };
        if let Some(micros) = adm.cost_micros(served, &usage) {
            guards::record_spend(env, &self.key, self.ttl, micros).await;
        }
    }
}
