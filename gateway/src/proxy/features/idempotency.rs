//! The idempotency recorder: a tool call that claimed a fresh
//! `Idempotency-Key` at admission has its answer kept as it passes (up to
//! the tool's `max_record_bytes`) and recorded when the exchange ends, so
//! a repeat is answered from the record. An answer too large to keep, or
//! cut, is marked unrecorded; a call sent but unanswered is marked failed
//! (it may have acted); one never sent is forgotten.

use super::{Admission, End, Env, Feature};
use crate::proxy::ctx::Plan;
use bytes::Bytes;
use loopgate_policy::{IdemOutcome, IdemRecord};
use pingora::http::ResponseHeader;
use pingora::ErrorSource;

#[derive(Debug)]
pub struct Recorder {
    key: String,
    max: usize,
    capture: Option<Capture>,
}

#[derive(Debug, Default)]
struct Capture {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    /// Larger than `max`: it cannot be replayed.
    truncated: bool,
    complete: bool,
}

impl Feature for Recorder {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Tool(t) => t.idem.as_ref().map(|(key, max)| Recorder {
                key: key.clone(),
                max: *max,
                capture: None,
            }),
            _ => None,
        }
    }

    fn upstream_header(&mut self, _env: &Env<'_>, _adm: &Admission, resp: &ResponseHeader) {
        self.capture = Some(Capture {
            status: resp.status.as_u16(),
            content_type: resp
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            ..Default::default()
        });
    }

    fn upstream_body(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        body: Option<&Bytes>,
        end: bool,
    ) -> pingora::Result<()> {
        if let Some(cap) = self.capture.as_mut() {
            if let Some(b) = body {
                if cap.body.len() + b.len() > self.max {
                    cap.truncated = true;
                    cap.body = Vec::new();
                } else if !cap.truncated {
                    cap.body.extend_from_slice(b);
                }
            }
            cap.complete = end;
        }
        Ok(())
    }

    async fn done(&mut self, env: &Env<'_>, adm: &Admission, end: &End<'_>) {
        let upstream_failed = end
            .error
            .is_some_and(|e| *e.esource() != ErrorSource::Downstream);
        let outcome = match self.capture.take() {
            Some(cap) if cap.complete && !cap.truncated && !upstream_failed => {
                Some(IdemOutcome::Done(IdemRecord {
                    status: cap.status,
                    content_type: cap.content_type,
                    body: cap.body,
                }))
            }
            Some(_) => Some(IdemOutcome::Unrecorded),
            // Sent but unanswered: it may have acted. Never sent: forget it.
            None if end.sent => Some(IdemOutcome::Failed),
            None => None,
        };
        if let Err(err) = env
            .store
            .idem_finish(env.clock.now(), &self.key, outcome)
            .await
        {
            log::warn!("request {}: idempotency record: {err}", adm.request_id);
        }
    }
}
