//! The task watchdog's latency reading: each finished call of a task feeds
//! the task's latency EMA in its watchdog record in the state store, which
//! the watchdog judges at the next call (on any replica).

use super::{Admission, End, Env, Feature};
use crate::proxy::guards;
use std::time::Duration;

#[derive(Debug)]
pub struct TaskLatency {
    key: String,
    ttl: Duration,
}

impl Feature for TaskLatency {
    fn arm(adm: &Admission) -> Option<Self> {
        let (key, ttl) = (adm.task_key.clone()?, adm.watch_ttl?);
        Some(TaskLatency { key, ttl })
    }

    async fn done(&mut self, env: &Env<'_>, _adm: &Admission, end: &End<'_>) {
        guards::watch_latency(env, &self.key, self.ttl, end.elapsed).await;
    }
}
