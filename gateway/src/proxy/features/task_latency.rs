//! The task watchdog's latency reading: each finished call of a task feeds
//! the task's latency EMA, which the watchdog judges at the next call.

use super::{Admission, End, Env, Feature};

#[derive(Debug)]
pub struct TaskLatency {
    key: String,
}

impl Feature for TaskLatency {
    fn arm(adm: &Admission) -> Option<Self> {
        adm.task_key.clone().map(|key| TaskLatency { key })
    }

    async fn done(&mut self, env: &Env<'_>, _adm: &Admission, end: &End<'_>) {
        env.watchdog.latency(&self.key, end.elapsed);
    }
}
