//! Usage metering on model calls: reads the provider's reported usage from
//! the answer as it passes (JSON or SSE), for token metrics and limit
//! settlement, and cuts a stream that outgrows its token budgets or the
//! money its budgets have left with a proper error event (the overshoot is
//! at most one upstream read).

use super::{Admission, Env, Feature};
use crate::error::GatewayError;
use crate::proxy::failure::{answer, BUDGET_CUT};
use bytes::Bytes;
use loopgate_policy::{Deny, DenyCode, Usage, UsageScanner};
use pingora::http::ResponseHeader;

#[derive(Debug)]
pub struct UsageMeter {
    /// Output tokens a stream may produce before its token budget is spent.
    room: Option<u64>,
    /// Output tokens the money budgets still pay for.
    money_room: Option<u64>,
    /// The prompt's estimate: a cut stream's usage never comes, and its
    /// prompt was paid for.
    prompt: u64,
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
            money_room: m.money_room,
            prompt: m.estimated_prompt,
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
        let produced = scanner.events();
        let over = |room: Option<u64>| room.filter(|r| !end && produced > *r);
        let cut = match (over(self.room), over(self.money_room)) {
            (Some(room), _) => Some((room, "token budget")),
            (None, Some(room)) => Some((room, "money budget")),
            (None, None) => None,
        };
        if let Some((room, which)) = cut {
            log::warn!(
                "request {}: stream cut after ~{produced} tokens: {which} room was {room}",
                adm.request_id
            );
            env.metrics
                .budget_cuts
                .with_label_values(&[adm.agent.as_ref()])
                .inc();
            self.usage = Some(Usage {
                input_tokens: self.prompt,
                output_tokens: produced,
                ..Usage::default()
            });
            self.scanner = None;
            let deny = Deny::new(
                DenyCode::BudgetExceeded,
                format!("stream cut after about {produced} tokens: the {which} had room for {room}"),
            )
            .never_retryable();
            return Err(answer(BUDGET_CUT, GatewayError::Denied(deny)));
        }
        if end {
            self.usage = scanner.finish();
            if scanner.clamped() {
                // A broken or hostile upstream: settled at the ceiling, so
                // no sum wraps and spend never goes backwards.
                log::warn!(
                    "request {}: the provider reported more than {} tokens in one usage count; \
                     clamped to it",
                    adm.request_id,
                    loopgate_policy::usage::MAX_REPORTED_TOKENS
                );
            }
            self.scanner = None;
        }
        Ok(())
    }
}
