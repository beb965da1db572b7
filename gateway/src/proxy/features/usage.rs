//! Usage metering on model calls: reads the provider's reported usage from
//! the answer as it passes (JSON or SSE), for token metrics and limit
//! settlement; counts the output it relayed (what an answer whose usage
//! cannot be read settles on, see `request::settled_usage`); drops the
//! usage chunk the gateway asked for on the agent's behalf
//! (`ModelPlan::ask_usage`) from the stream the agent receives; and cuts
//! a stream that outgrows its token budgets or the money its budgets have
//! left with a proper error event (the overshoot is at most one upstream
//! read).

use super::{Admission, Env, Feature};
use crate::error::GatewayError;
use crate::proxy::failure::{answer, BUDGET_CUT};
use bytes::Bytes;
use loopgate_policy::usage::UsageChunkDropper;
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
    /// Embeddings: the answer's numbers are no output to count.
    counts_output: bool,
    /// Bytes of generated text relayed so far.
    relayed: u64,
    /// The gateway asked for the stream's usage, the agent did not.
    ask_usage: bool,
    /// Armed for such a stream's event-stream answer.
    dropper: Option<UsageChunkDropper>,
}

impl UsageMeter {
    /// What the provider reported (or, for a cut stream, what it produced).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Output tokens counted in what was relayed (an estimate, at the
    /// prompt estimate's 4 bytes a token).
    pub fn relayed_output(&self) -> u64 {
        loopgate_policy::usage::estimate_tokens(self.relayed)
    }
}

impl Feature for UsageMeter {
    fn arm(adm: &Admission) -> Option<Self> {
        // A token count is no exchange: nothing to settle or cost.
        let m = adm.model()?;
        (m.endpoint != loopgate_policy::Endpoint::CountTokens).then(|| UsageMeter {
            room: m.budget_room,
            money_room: m.money_room,
            prompt: m.estimated_prompt,
            scanner: None,
            usage: None,
            counts_output: m.settles && m.endpoint != loopgate_policy::Endpoint::Embeddings,
            relayed: 0,
            ask_usage: m.ask_usage,
            dropper: None,
        })
    }

    fn upstream_header(&mut self, _env: &Env<'_>, _adm: &Admission, resp: &ResponseHeader) {
        let ct = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let mut scanner = UsageScanner::for_content_type(ct);
        scanner.count_text(self.counts_output);
        self.scanner = Some(scanner);
        let sse = crate::proxy::respond::is_event_stream(resp);
        self.dropper = (self.ask_usage && sse).then(UsageChunkDropper::default);
    }

    async fn response_header(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        resp: &mut ResponseHeader,
    ) -> pingora::Result<()> {
        if self.dropper.is_some() {
            // One event fewer than the provider sent.
            super::rewritten_length(resp)?;
        }
        Ok(())
    }

    fn response_body(
        &mut self,
        _adm: &Admission,
        body: &mut Option<Bytes>,
        end: bool,
    ) -> pingora::Result<()> {
        let Some(dropper) = self.dropper.as_mut() else {
            return Ok(());
        };
        let chunk = body.as_deref().unwrap_or_default();
        if let Some(out) = dropper.filter(chunk, end) {
            *body = Some(Bytes::from(out));
        }
        Ok(())
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
        }
        if self.counts_output {
            self.relayed = scanner.relayed_text_bytes();
        }
        // About a token an event, or the text's count where it says more.
        let produced = scanner
            .events()
            .max(loopgate_policy::usage::estimate_tokens(self.relayed));
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
            self.scanner = None;
        }
        Ok(())
    }
}
