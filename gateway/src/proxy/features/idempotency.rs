//! Idempotency keys on tool calls, both ends: at admission [`claim`] reads
//! the body and claims the key in the store (or answers a repeat from its
//! record, or refuses a key in use or reused for another request); the
//! [`Recorder`] then keeps the answer of a call that claimed a fresh
//! `Idempotency-Key` as it passes (up to
//! the tool's `max_record_bytes`) and recorded when the exchange ends, so
//! a repeat is answered from the record. An answer too large to keep, or
//! cut, is marked unrecorded; a call sent but unanswered is marked failed
//! (it may have acted); one never sent is forgotten.

use super::{Admission, End, Env, Feature};
use crate::config::runtime::Idempotency;
use crate::error::GatewayError;
use crate::proxy::admit::{read_body, FailMode};
use crate::proxy::ctx::{Plan, RequestCtx};
use crate::proxy::ids::RequestIds;
use bytes::Bytes;
use loopgate_policy::{Deny, DenyCode, IdemBegin, IdemOutcome, IdemRecord};
use pingora::http::ResponseHeader;
use pingora::ErrorSource;
use pingora_proxy::Session;
use sha2::Digest;

/// The tool call a key is claimed for.
pub struct Call<'a> {
    pub agent: &'a str,
    pub tool: &'a str,
    pub method: &'a http::Method,
    /// Path and query, as sent.
    pub target: &'a str,
    /// The largest body read to hash it.
    pub body_limit: u64,
}

/// What admission learnt from the `Idempotency-Key`.
#[derive(Default)]
pub struct Claim {
    /// The body, read when a key was given (it is part of the record).
    pub body: Bytes,
    pub body_sha: Option<[u8; 32]>,
    /// A fresh claim: the record's key and the most it keeps.
    pub record: Option<(String, usize)>,
    /// The key was used before by the same request, which was answered:
    /// the answer to replay.
    pub replay: Option<IdemRecord>,
}

/// Claims the call's `Idempotency-Key` under the tool's policy. Safe
/// methods (GET, HEAD, OPTIONS) claim nothing. A key that is malformed,
/// missing where required, in use, or reused for another request is
/// refused; an unreadable store is decided by `fail`.
pub async fn claim(
    session: &mut Session,
    ctx: &mut RequestCtx,
    env: &Env<'_>,
    policy: &Idempotency,
    call: &Call<'_>,
    fail: &mut FailMode,
) -> Result<Claim, GatewayError> {
    let side_effecting = !matches!(
        *call.method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    );
    if !side_effecting {
        return Ok(Claim::default());
    }
    let given = session
        .req_header()
        .headers
        .get("idempotency-key")
        .map(|v| RequestIds::accept(v.as_bytes()).map(str::to_string));
    let key = match given {
        Some(Some(key)) => key,
        Some(None) => {
            return Err(Deny::new(
                DenyCode::IdempotencyKeyRequired,
                "Idempotency-Key must be 1-128 characters of [A-Za-z0-9-_.:]",
            )
            .into())
        }
        None if policy.required => {
            return Err(Deny::new(
                DenyCode::IdempotencyKeyRequired,
                format!(
                    "tool `{}` requires an Idempotency-Key for {}",
                    call.tool, call.method
                ),
            )
            .into())
        }
        None => return Ok(Claim::default()),
    };
    let body = read_body(session, call.body_limit, &mut ctx.intake).await?;
    // The record is the whole request: a key reused for another method,
    // path or query is a different request (422), never a replay of the
    // first one's answer.
    let mut h = sha2::Sha256::new();
    for part in [call.method.as_str().as_bytes(), call.target.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(&body);
    let sha: [u8; 32] = h.finalize().into();
    let mut claim = Claim {
        body_sha: Some(sha2::Sha256::digest(&body).into()),
        body,
        ..Claim::default()
    };
    let record_key = format!("{}:idem:{}:{key}", call.agent, call.tool);
    let begin = env
        .store
        .idem_begin(
            env.clock.now(),
            &record_key,
            sha,
            policy.ttl,
            policy.retry_after_failure,
        )
        .await
        .map_err(|e| Deny::new(DenyCode::StateUnavailable, e.to_string()).into());
    // Unreadable under `fail_mode: open`: forwarded unprotected.
    match fail.tolerate(begin)? {
        None => {}
        Some(IdemBegin::Fresh) => claim.record = Some((record_key, policy.max_record_bytes)),
        Some(IdemBegin::Ended(IdemOutcome::Done(record))) => claim.replay = Some(record),
        Some(other) => return Err(refused_claim(other).into()),
    }
    Ok(claim)
}

/// The refusal for a key whose record forbids going on.
fn refused_claim(begin: IdemBegin) -> Deny {
    match begin {
        IdemBegin::InFlight => Deny::new(
            DenyCode::RequestInProgress,
            "a request with this Idempotency-Key is still in progress",
        )
        .retry_after(std::time::Duration::from_secs(1)),
        IdemBegin::Mismatch => Deny::new(
            DenyCode::IdempotencyKeyReused,
            "this Idempotency-Key was used for a different request (method, path, query or body)",
        ),
        IdemBegin::Ended(IdemOutcome::Failed) => Deny::new(
            DenyCode::OutcomeUnknown,
            "the first request with this Idempotency-Key failed after it was sent; it may have taken effect: check before repeating it",
        ),
        IdemBegin::Ended(IdemOutcome::Unrecorded) => Deny::new(
            DenyCode::OutcomeUnknown,
            "the first request with this Idempotency-Key was answered, but the answer could not be recorded for replay",
        ),
        IdemBegin::Fresh | IdemBegin::Ended(IdemOutcome::Done(_)) => Deny::new(
            DenyCode::PolicyUnavailable,
            "unexpected idempotency state",
        ),
    }
}


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
