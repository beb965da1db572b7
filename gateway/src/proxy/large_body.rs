//! The large-body forwarder.
//!
//! Admission must read the whole body before choosing a peer. Pingora 0.9
//! forwards a body consumed in `request_filter` only through its retry
//! buffer, which holds 64 KiB; past that the body would silently not be
//! sent. So bodies that fit go the ordinary way (Pingora replays the
//! buffer), and larger ones are forwarded through a subrequest whose body
//! is the bytes already read and judged. The subrequest runs the same
//! hooks with the admission carried in its context ([`adopt`]), sends the
//! judged bytes on every attempt, and reports what it learned back
//! ([`report`]); its response is piped back unchanged. The split keeps the
//! common small request on the cheaper path.
//!
//! The same route holds an answer whole when its header must say what only
//! its end tells: a priced model's non-streamed answer reports its usage
//! last, after Pingora's own path has sent the header, so such a call goes
//! through a subrequest too and its main request holds the piped answer
//! ([`HeldAnswer`]) until the usage is known, then writes it with
//! `x-loopgate-cost-usd` (`cost_header: true`; off by default, because a
//! second pass through Pingora's proxy costs about a third more CPU per
//! call: `benches/instructions`, small JSON 155k -> 210k instructions).

use super::buffers::BodyIntake;
use super::ctx::{Admission, RequestCtx, Role, SubReport};
use super::failure::map_transport_error;
use super::respond;
use crate::config::Config;
use crate::error::GatewayError;
use bytes::{Bytes, BytesMut};
use pingora_core::protocols::http::HttpTask;
use pingora_proxy::subrequest::pipe::{
    pipe_subrequest, InputBody, InputBodyType, PipeSubrequestError,
};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::Session;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bodies up to this size are replayed by Pingora's own retry buffer
/// (`BODY_BUF_LIMIT` in pingora-core); larger ones use a subrequest.
pub const RETRY_BUFFER_LIMIT: usize = 64 * 1024;

/// What a main request hands its large-body subrequest.
struct LargeBody {
    admission: Arc<Admission>,
    call: Option<super::call::Call>,
    body: Bytes,
    content_type: Option<http::HeaderValue>,
    report: Arc<Mutex<Option<SubReport>>>,
}

/// Whether this admitted body must go through a subrequest.
pub fn needed(session: &Session, adm: &Admission, body: &Bytes) -> bool {
    adm.body_read
        && (body.len() > RETRY_BUFFER_LIMIT || session.downstream_session.retry_buffer_truncated())
}

/// Answers held whole for their cost header are at most this big; a
/// larger one (a big batch of embeddings) is released and passes as it
/// arrives, without the header.
pub const HOLD_LIMIT: u64 = 4 * 1024 * 1024;

/// Whether this admitted call's answer is held for its cost header: a
/// non-streamed model call that some target of its route prices, under
/// `cost_header` (a streamed one carries its usage in its last events).
pub fn holds_answer(cfg: &Config, adm: &Admission) -> bool {
    cfg.cost_header
        && adm.body_read
        && adm
            .model()
            .is_some_and(|m| !m.stream && adm.route.priced(&m.model))
}

/// Forwards `body` through a subrequest (see the module docs) and takes
/// over what it reports; with `hold`, holds the answer for its cost.
pub async fn forward(
    session: &mut Session,
    ctx: &mut RequestCtx,
    admission: Arc<Admission>,
    body: Bytes,
    hold: bool,
) -> Result<(), GatewayError> {
    let spawner = session
        .subrequest_spawner
        .as_ref()
        .ok_or_else(|| GatewayError::Internal("subrequests are not available".into()))?;
    // The subrequest starts without a body (Pingora then clears its
    // framing headers) and `request_body_filter` injects the judged bytes
    // on every attempt, so fallbacks and retries resend the whole body.
    let content_type = session
        .req_header()
        .headers
        .get(http::header::CONTENT_TYPE)
        .cloned();
    let report = Arc::new(Mutex::new(None));
    let sub_ctx = SubrequestCtx::builder()
        .body_mode(BodyMode::NoBody)
        .user_ctx(Box::new(LargeBody {
            admission,
            call: ctx.call.clone(),
            body,
            content_type,
            report: report.clone(),
        }))
        .build();
    let (prepared, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
    ctx.role = Role::Forwarded;
    let mut held = HeldAnswer::new(hold);
    let intake = &mut ctx.intake;
    let piped = pipe_subrequest(
        session,
        prepared,
        handle,
        |task| Ok(held.take(task, intake)),
        InputBodyType::Preset(InputBody::NoBody),
    )
    .await;
    let failed = match piped {
        Ok(mut state) => {
            // Its `logging`, which reports, has run once this returns.
            if let Some(join) = state.join_handle.take() {
                let _ = join.await;
            }
            None
        }
        // A subrequest reports its failure after its `logging`.
        Err(err) => Some(err),
    };
    // What the subrequest learned belongs to this request's log and limits.
    let sub = report.lock().ok().and_then(|mut r| r.take());
    if let Some(r) = sub {
        ctx.sub_reported = true;
        ctx.reported_relayed = r.relayed;
        ctx.served_by = r.served_by;
        ctx.sent_to = r.sent_to;
        ctx.fallback.from = r.fallback_from;
        ctx.upstream_status = r.upstream_status;
        ctx.ttfb = r.ttfb;
        ctx.fallback.attempts = r.attempts;
        ctx.reported_usage = r.usage;
        ctx.breaker_key = r.breaker_key;
        if ctx.error_code.is_none() {
            ctx.error_code = r.error_code;
        }
        if let Some(t) = r.upstream_time {
            ctx.upstream_first_at = Some(Instant::now() - t);
            ctx.upstream_done_at = Some(Instant::now());
        }
    }
    let cost = held.holding.then(|| ctx.cost_picos()).flatten();
    // A held answer that never ended was never sent: on a failure the
    // agent gets the failure's own answer, not a cut body.
    let unfinished = held.holding && !held.ended();
    let tasks = held.finish(cost, &mut ctx.intake);
    match failed {
        None => {
            if !tasks.is_empty() {
                if let Err(e) = session.write_response_tasks(tasks).await {
                    log::debug!(
                        "request {}: could not write the answer: {e}",
                        ctx.request_id
                    );
                }
            }
            Ok(())
        }
        Some(err) => {
            let served = ctx.served_by.as_deref();
            let held = HeldTasks {
                tasks,
                unsent: unfinished,
            };
            settle_failure(session, err, held, &ctx.request_id, served).await
        }
    }
}

/// What the main request held of a failed subrequest's answer: its tasks,
/// and whether they are an unfinished answer never sent (dropped, with
/// what the pipe still holds, for the failure's own answer).
struct HeldTasks {
    tasks: Vec<HttpTask>,
    unsent: bool,
}

/// A piped answer held whole (see the module docs), or passed on as it
/// arrives. Held bytes are charged to the request's body memory; past
/// [`HOLD_LIMIT`], or when the charge is refused, the answer is released:
/// what was held goes first and the rest follows as it comes, so nothing
/// is lost and nothing is refused for the sake of a header.
struct HeldAnswer {
    holding: bool,
    /// Tasks taken from the pipe and not yet passed on, in order.
    queue: VecDeque<HttpTask>,
    /// Body bytes held (and charged).
    bytes: u64,
}

impl HeldAnswer {
    fn new(hold: bool) -> Self {
        HeldAnswer {
            holding: hold,
            queue: VecDeque::new(),
            bytes: 0,
        }
    }

    /// The pipe's filter: the task to write now, if any. The pipe writes
    /// at most one per task it takes, so after a release the queue drains
    /// by merging body pieces; [`HeldAnswer::finish`] gives what is left.
    fn take(&mut self, task: HttpTask, intake: &mut BodyIntake) -> Option<HttpTask> {
        if self.holding {
            let n = body_len(&task);
            if self.bytes + n <= HOLD_LIMIT && intake.grow(n).is_ok() {
                self.bytes += n;
                self.queue.push_back(task);
                return None;
            }
            self.holding = false;
            self.queue = coalesce(std::mem::take(&mut self.queue));
        }
        if self.queue.is_empty() {
            return Some(task);
        }
        self.queue.push_back(task);
        if let (Some(HttpTask::Body(_, false)), Some(HttpTask::Body(..))) =
            (self.queue.front(), self.queue.get(1))
        {
            let (Some(a), Some(b)) = (self.queue.pop_front(), self.queue.pop_front()) else {
                return None;
            };
            let merged = coalesce(VecDeque::from([a, b]));
            self.queue = merged.into_iter().chain(self.queue.drain(..)).collect();
        }
        self.queue.pop_front()
    }

    /// Whether what is held ends the answer (a failed exchange may stop
    /// halfway through its body).
    fn ended(&self) -> bool {
        matches!(
            self.queue.back(),
            Some(HttpTask::Body(_, true) | HttpTask::Header(_, true) | HttpTask::Done)
                | Some(HttpTask::Trailer(_))
        )
    }

    /// What is left to write once the pipe is done; a still held answer
    /// gets its `cost` (pico-dollars) on its header. Gives the charge back.
    fn finish(&mut self, cost: Option<u128>, intake: &mut BodyIntake) -> Vec<HttpTask> {
        intake.shrink(self.bytes);
        self.bytes = 0;
        let mut tasks = coalesce(std::mem::take(&mut self.queue));
        if let (Some(picos), Some(HttpTask::Header(head, _))) = (cost, tasks.front_mut()) {
            let usd = loopgate_policy::price::usd_exact(picos);
            if let Err(e) = head.insert_header(respond::COST_HEADER, usd) {
                log::debug!("cost header: {e}");
            }
        }
        tasks.into()
    }
}

fn body_len(task: &HttpTask) -> u64 {
    match task {
        HttpTask::Body(Some(b), _) | HttpTask::UpgradedBody(Some(b), _) => b.len() as u64,
        _ => 0,
    }
}

/// `tasks` with each run of body pieces merged into one (the run ends
/// where a piece ends the body).
fn coalesce(tasks: VecDeque<HttpTask>) -> VecDeque<HttpTask> {
    let mut out = VecDeque::with_capacity(tasks.len());
    let mut run: Option<BytesMut> = None;
    for t in tasks {
        match t {
            HttpTask::Body(data, end) => {
                let buf = run.get_or_insert_with(BytesMut::new);
                if let Some(d) = data {
                    buf.extend_from_slice(&d);
                }
                if end {
                    let buf = run.take().unwrap_or_default();
                    out.push_back(HttpTask::Body(Some(buf.freeze()), true));
                }
            }
            other => {
                if let Some(buf) = run.take() {
                    out.push_back(HttpTask::Body(Some(buf.freeze()), false));
                }
                out.push_back(other);
            }
        }
    }
    if let Some(buf) = run.take() {
        out.push_back(HttpTask::Body(Some(buf.freeze()), false));
    }
    out
}

/// A pipe that ended in an error. The subrequest answers its own failures
/// (`fail_to_proxy` runs there) and only then reports the error, but the
/// pipe may see the report before the answer it wrote (two ready
/// channels, polled in random order): the answer is still in the pipe, so
/// it is written out here, as the pipe would have. A small body refused
/// the same way gets the same answer (for example 503 `circuit_open` with
/// `Retry-After`). `Err`: nothing was answered, and this is the answer.
async fn settle_failure(
    session: &mut Session,
    mut err: PipeSubrequestError,
    held: HeldTasks,
    request_id: &str,
    served_by: Option<&str>,
) -> Result<(), GatewayError> {
    if held.unsent {
        // Nothing of it went out: the failure answers.
        log::debug!("request {request_id}: an unfinished held answer is dropped");
        return match respond::response_started(session) {
            true => Ok(()),
            false => Err(failure_of(&err, served_by)),
        };
    }
    // What was held came first.
    let mut left = held.tasks;
    if err.from_subreq {
        if let Some(rx) = err.state.pipe_rx.as_mut() {
            while let Ok(task) = rx.try_recv() {
                left.push(task);
            }
        }
    }
    let answered =
        err.state.header_received || left.iter().any(|t| matches!(t, HttpTask::Header(..)));
    if !left.is_empty() && (answered || respond::response_started(session)) {
        if let Err(e) = session.write_response_tasks(left).await {
            log::debug!("request {request_id}: could not write the subrequest's answer: {e}");
        }
    }
    if answered || respond::response_started(session) {
        log::debug!(
            "request {request_id}: large-body stream ended: {}",
            err.error
        );
        return Ok(());
    }
    // Nothing written: the failure's own answer, as a small body gets it.
    Err(failure_of(&err, served_by))
}

/// The answer a failed subrequest's error calls for.
fn failure_of(err: &PipeSubrequestError, served_by: Option<&str>) -> GatewayError {
    GatewayError::cause_of(&err.error)
        .cloned()
        .unwrap_or_else(|| map_transport_error(&err.error, served_by.unwrap_or("?")))
}

/// In a subrequest's `request_filter`: takes over the main request's
/// admission and body. `Err` for a subrequest that carries none (it is
/// refused: nothing without an admission goes upstream).
pub fn adopt(session: &Session, ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    let large = session
        .subrequest_ctx
        .as_ref()
        .and_then(|s| s.user_ctx())
        .and_then(|u| u.downcast_ref::<LargeBody>())
        .ok_or_else(|| GatewayError::Internal("subrequest without admission".into()))?;
    let a = large.admission.clone();
    ctx.request_id = a.request_id.clone();
    ctx.agent = Some(a.agent.clone());
    ctx.call = large.call.clone();
    ctx.features = super::features::Features::arm(&a);
    ctx.admitted = Some(a);
    ctx.role = Role::Sub {
        body: large.body.clone(),
        content_type: large.content_type.clone(),
        report: large.report.clone(),
    };
    Ok(())
}

/// The judged body a subrequest sends on every attempt.
pub fn injected(ctx: &RequestCtx) -> Option<&Bytes> {
    match &ctx.role {
        Role::Sub { body, .. } => Some(body),
        _ => None,
    }
}

/// The content type a subrequest restores (its framing was cleared).
pub fn content_type(ctx: &RequestCtx) -> Option<&http::HeaderValue> {
    match &ctx.role {
        Role::Sub { content_type, .. } => content_type.as_ref(),
        _ => None,
    }
}

/// In a subrequest's `logging`: what it learned, for its main request.
/// `true` when this context is a subrequest (the main request logs).
pub fn report(ctx: &RequestCtx) -> bool {
    let Role::Sub { report, .. } = &ctx.role else {
        return false;
    };
    if let Ok(mut r) = report.lock() {
        *r = Some(SubReport {
            served_by: ctx.served_by.clone(),
            sent_to: ctx.sent_to.clone(),
            fallback_from: ctx.fallback.from.clone(),
            upstream_status: ctx.upstream_status,
            ttfb: ctx.ttfb,
            upstream_time: ctx.upstream_first_at.map(|t| {
                ctx.upstream_done_at
                    .unwrap_or_else(Instant::now)
                    .duration_since(t)
            }),
            attempts: ctx.fallback.attempts,
            usage: ctx.usage(),
            relayed: ctx.relayed_output(),
            breaker_key: ctx.breaker_key.clone(),
            error_code: ctx.error_code,
        });
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::ResponseHeader;
    use pingora_proxy::subrequest::pipe::PipeSubrequestState;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A main session reading `POST /` from a client; the client's end.
    async fn session() -> (Session, tokio::io::DuplexStream) {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            )
            .await
            .unwrap();
        let mut session = Session::new_h1(Box::new(server));
        session.downstream_session.read_request().await.unwrap();
        (session, client)
    }

    fn circuit_open() -> GatewayError {
        GatewayError::CircuitOpen {
            provider: "p".into(),
            retry_after: std::time::Duration::from_secs(7),
        }
    }

    /// The subrequest's failure as the pipe reports it, with `tasks` (its
    /// answer) still in the pipe.
    fn failure(tasks: Vec<HttpTask>) -> PipeSubrequestError {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for t in tasks {
            tx.try_send(t).unwrap();
        }
        let state = PipeSubrequestState {
            pipe_rx: Some(rx),
            ..PipeSubrequestState::default()
        };
        let e = super::super::failure::answer(super::super::failure::REFUSED, circuit_open());
        PipeSubrequestError::new(e, true, state)
    }

    #[tokio::test]
    async fn an_answer_still_in_the_pipe_is_written_out() {
        let (mut session, mut client) = session().await;
        let body = br#"{"error":{"code":"circuit_open"}}"#;
        let mut head = ResponseHeader::build(503, None).unwrap();
        head.insert_header("retry-after", "7").unwrap();
        head.insert_header("content-length", body.len().to_string())
            .unwrap();
        let err = failure(vec![
            HttpTask::Header(Box::new(head), false),
            HttpTask::Body(Some(Bytes::from_static(body)), true),
        ]);
        assert!(settle_failure(
            &mut session,
            err,
            HeldTasks {
                tasks: Vec::new(),
                unsent: false
            },
            "r",
            None
        )
        .await
        .is_ok());
        drop(session);
        let mut seen = Vec::new();
        client.read_to_end(&mut seen).await.unwrap();
        let seen = String::from_utf8_lossy(&seen);
        assert!(seen.starts_with("HTTP/1.1 503"), "{seen}");
        assert!(
            seen.to_ascii_lowercase().contains("retry-after: 7"),
            "{seen}"
        );
        assert!(seen.ends_with(std::str::from_utf8(body).unwrap()), "{seen}");
    }

    fn head() -> HttpTask {
        HttpTask::Header(Box::new(ResponseHeader::build(200, None).unwrap()), false)
    }

    fn piece(s: &'static str, end: bool) -> HttpTask {
        HttpTask::Body(Some(Bytes::from_static(s.as_bytes())), end)
    }

    /// The body bytes of `tasks`, in order, and whether the last ends it.
    fn bytes_of(tasks: &[HttpTask]) -> (String, bool) {
        let mut text = String::new();
        let mut end = false;
        for t in tasks {
            match t {
                HttpTask::Body(b, e) => {
                    text.push_str(std::str::from_utf8(b.as_deref().unwrap_or(b"")).unwrap());
                    end = *e;
                }
                HttpTask::Done => end = true,
                _ => {}
            }
        }
        (text, end)
    }

    #[test]
    fn a_held_answer_is_written_whole_with_its_cost() {
        let mut intake = BodyIntake::default();
        let mut held = HeldAnswer::new(true);
        for t in [
            head(),
            piece("{\"a\":", false),
            piece("1}", false),
            piece("", true),
        ] {
            assert!(held.take(t, &mut intake).is_none());
        }
        let tasks = held.finish(Some(2_800_000_000), &mut intake);
        assert_eq!(tasks.len(), 2);
        let HttpTask::Header(h, _) = &tasks[0] else {
            panic!("header first")
        };
        assert_eq!(h.headers.get(respond::COST_HEADER).unwrap(), "0.0028");
        assert_eq!(bytes_of(&tasks), ("{\"a\":1}".to_string(), true));
    }

    #[test]
    fn a_released_answer_keeps_every_byte_in_order() {
        let mut intake = BodyIntake::default();
        let mut held = HeldAnswer::new(true);
        let mut out = Vec::new();
        let big = "x".repeat(HOLD_LIMIT as usize);
        let big: &'static str = Box::leak(big.into_boxed_str());
        let input = [
            head(),
            piece("ab", false),
            piece(big, false),
            piece("cd", false),
        ];
        for t in input {
            out.extend(held.take(t, &mut intake));
        }
        // Released at the piece that did not fit: the header went out.
        assert!(!held.holding);
        assert!(matches!(out.first(), Some(HttpTask::Header(..))));
        for t in [piece("ef", false), piece("", true), HttpTask::Done] {
            out.extend(held.take(t, &mut intake));
        }
        let rest = held.finish(Some(1), &mut intake);
        let HttpTask::Header(h, _) = &out[0] else {
            panic!()
        };
        assert!(h.headers.get(respond::COST_HEADER).is_none());
        out.extend(rest);
        let (text, end) = bytes_of(&out);
        assert_eq!(text, format!("ab{big}cdef"));
        assert!(end);
        assert_eq!(
            out.iter()
                .filter(|t| matches!(t, HttpTask::Header(..)))
                .count(),
            1
        );
    }

    #[test]
    fn an_answer_not_held_passes_straight_through() {
        let mut intake = BodyIntake::default();
        let mut held = HeldAnswer::new(false);
        assert!(matches!(
            held.take(head(), &mut intake),
            Some(HttpTask::Header(..))
        ));
        assert!(matches!(
            held.take(piece("x", true), &mut intake),
            Some(HttpTask::Body(..))
        ));
        assert!(held.finish(Some(5), &mut intake).is_empty());
    }

    #[tokio::test]
    async fn with_nothing_in_the_pipe_the_failure_is_its_own_answer() {
        let (mut session, _client) = session().await;
        let answer = settle_failure(
            &mut session,
            failure(vec![]),
            HeldTasks {
                tasks: Vec::new(),
                unsent: false,
            },
            "r",
            None,
        )
        .await;
        let e = answer.unwrap_err();
        assert_eq!(e.code(), "circuit_open");
        assert_eq!(e.status(), 503);
        assert_eq!(e.retry_after_secs(), Some(7));
    }
}
