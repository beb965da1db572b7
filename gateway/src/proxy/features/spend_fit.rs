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

    async fn done(&mut self, env: &Env<'_>, _adm: &Admission, end: &End<'_>) {
        // A step without a known cost (no usage, refused upstream) is not
        // a step of the fit: it would read as a free one.
        if let Some(usd) = end.cost_usd {
            let micro = (usd * 1e6).round() as u64;
            guards::record_spend(env, &self.key, self.ttl, micro).await;
        }
    }
}
