//! Usage metering on model calls: reads the provider's reported usage from
//! the answer as it passes (JSON or SSE), for token metrics and limit
//! settlement, and cuts a stream that outgrows its task's token budget
//! with a proper error event (the overshoot is at most one upstream read).

use super::{Admission, Env, Feature};
use crate::error::GatewayError;
use crate::proxy::failure::{answer, BUDGET_CUT};
use bytes::Bytes;
use loopgate_policy::{Deny, DenyCode, Usage, UsageScanner};
use pingora::http::ResponseHeader;

#[derive(Debug)]
pub struct UsageMeter {
    /// Output tokens a stream may produce before its budget is spent.
    room: Option<u64>,
    scanner: Option<UsageScanner>,
    usage: Option<Usage>,
}

impl UsageMeter {
    /// What the provider reported (or, for a cut stream, what it produced).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

impl Feature for UsageMeter {
    fn arm(adm: &Admission) -> Option<Self> {
        adm.model().map(|m| UsageMeter {
            room: m.budget_room,
            scanner: None,
            usage: None,
        })
    }

    fn upstream_header(&mut self, _env: &Env<'_>, _adm: &Admission, resp: &ResponseHeader) {
        let ct = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        self.scanner = Some(UsageScanner::for_content_type(ct));
    }

    fn upstream_body(
        &mut self,
        env: &Env<'_>,
        adm: &Admission,
        body: Option<&Bytes>,
        end: bool,
    ) -> pingora::Result<()> {
        let Some(scanner) = self.scanner.as_mut() else {
            return Ok(());
        };
        if let Some(b) = body {
            scanner.feed(b);
        }
        if let Some(room) = self.room.filter(|r| !end && scanner.events() > *r) {
            let produced = scanner.events();
            log::warn!(
                "request {}: stream cut after ~{produced} tokens: budget room was {room}",
                adm.request_id
            );
            env.metrics
                .budget_cuts
                .with_label_values(&[adm.agent.as_ref()])
                .inc();
            self.usage = Some(Usage {
                output_tokens: produced,
                ..Usage::default()
            });
            self.scanner = None;
            let deny = Deny::new(
                DenyCode::BudgetExceeded,
                format!(
                    "stream cut after about {produced} tokens: the token budget had room for {room}"
                ),
            )
            .never_retryable();
            return Err(answer(BUDGET_CUT, GatewayError::Denied(deny)));
        }
        if end {
            self.usage = scanner.finish();
            self.scanner = None;
        }
        Ok(())
    }
}
