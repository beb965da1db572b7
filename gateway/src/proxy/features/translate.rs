//! Provider families (issue 24): the answer of a provider of the other
//! API family, translated back into the agent's (`loopgate-translate`).
//! Armed only on chat calls whose route has a target of the other family; told
//! which family answers when an attempt's answer is relayed
//! ([`Translate::serve`]), and idle when it is the agent's own.
//!
//! A stream is translated event by event as it passes (bounded state);
//! a JSON answer (at most [`MAX_ANSWER_BYTES`]) and an error body are read
//! whole and written at their end, the error in the agent's family with
//! the provider's status. The JSON answer gathered is charged against the
//! gateway's body memory as it grows (its declared length before the
//! header goes on, then the trees its translation builds) and given back
//! once written: refused, the agent gets 503 `gateway_overloaded` in its
//! family when its header is still to be sent (a declared length, or
//! header and body read together), else the answer is cut as any JSON
//! answer that fails after its header. Usage is read from the provider's own bytes
//! before this (the usage feature reads the upstream body), so budgets
//! and metrics see what the provider reported.
//!
//! An answer that cannot be translated ends the exchange as the
//! provider's failure: a stream with an error event in the agent's family
//! (`respond::write_failure`), a JSON answer cut.

use super::{Admission, Env, Feature};
use crate::config::ProviderKind;
use crate::error::GatewayError;
use crate::proxy::buffers::{Held, Room};
use crate::proxy::failure::{answer, GATEWAY_FAULT, UNREADABLE};
use bytes::Bytes;
use loopgate_policy::Endpoint;
use loopgate_translate::stream::{StreamOptions, StreamTranslator};
use loopgate_translate::{error, response, Family};
use pingora::http::ResponseHeader;

/// Largest JSON answer translated whole. Pingora's body filters are
/// synchronous, so the translation of a gathered answer runs on the
/// runtime's thread (about 8 ms per MB): this bounds that stall at about
/// 32 ms. The largest answer a chat model gives (128k output tokens, one
/// choice: translation refuses `n` > 1 and audio) is about 0.5-1 MB.
const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Of an error body, what is kept to read its message.
const MAX_ERROR_BYTES: usize = 64 << 10;

#[derive(Debug)]
pub struct Translate {
    agent: Family,
    /// The OpenAI agent asked for the final usage chunk.
    usage_chunk: bool,
    /// The family of the provider answering, when it is not the agent's.
    upstream: Option<Family>,
    /// The agent's room in the body memory, where a JSON answer is held.
    room: Option<Room>,
    mode: Mode,
    /// A broken stream's translated events that came before the event
    /// that broke it in the same read: sent before the error event.
    unsent: Option<Bytes>,
}

#[derive(Debug)]
enum Mode {
    /// Nothing to translate (the agent's own family answers, or a 1xx/3xx).
    Idle,
    Json(Gathered),
    Error { status: u16, body: Vec<u8> },
    Stream(Box<StreamTranslator>),
}

/// A JSON answer gathered to be translated whole, its capacity charged
/// before it grows.
#[derive(Debug)]
struct Gathered {
    kept: Vec<u8>,
    /// What `kept` (and, at the end, translating it) is charged for.
    held: Option<Held>,
}

impl Gathered {
    fn new(room: Option<&Room>) -> Self {
        Gathered {
            kept: Vec::new(),
            held: room.map(Room::hold),
        }
    }

    /// Room for `more` bytes, charged before they are kept.
    fn reserve(&mut self, more: usize) -> pingora::Result<()> {
        let need = self.kept.len().saturating_add(more);
        if need > MAX_ANSWER_BYTES {
            return Err(unreadable(format!(
                "the provider's answer exceeds {MAX_ANSWER_BYTES} bytes to translate"
            )));
        }
        let cap = self.kept.capacity();
        if need <= cap {
            return Ok(());
        }
        let grown = need.max(cap.saturating_mul(2)).min(MAX_ANSWER_BYTES);
        self.charge((grown - cap) as u64)?;
        self.kept.reserve_exact(grown - self.kept.len());
        Ok(())
    }

    fn charge(&mut self, more: u64) -> pingora::Result<()> {
        match self.held.as_mut() {
            Some(h) => h
                .grow_beside(more, "translating the provider's answer")
                .map_err(|e| answer(GATEWAY_FAULT, e)),
            None => Ok(()),
        }
    }

    /// The answer is written: what it held goes back.
    fn release(&mut self) {
        self.kept = Vec::new();
        self.held = None;
    }
}

/// The `Content-Length` an answer declares.
fn declared_length(resp: &ResponseHeader) -> Option<usize> {
    resp.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The family an endpoint speaks, for the two chat endpoints.
pub fn endpoint_family(endpoint: Endpoint) -> Option<Family> {
    match endpoint {
        Endpoint::ChatCompletions => Some(Family::OpenAi),
        Endpoint::Messages => Some(Family::Anthropic),
        _ => None,
    }
}

/// The family a provider kind speaks.
pub fn kind_family(kind: ProviderKind) -> Family {
    match kind {
        ProviderKind::Anthropic => Family::Anthropic,
        ProviderKind::Openai | ProviderKind::OpenaiCompatible => Family::OpenAi,
    }
}

impl Translate {
    /// The attempt whose answer is relayed is served by a provider of
    /// `kind`.
    pub fn serve(&mut self, kind: ProviderKind) {
        let family = kind_family(kind);
        self.upstream = (family != self.agent).then_some(family);
        self.mode = Mode::Idle;
        self.unsent = None;
    }

    /// What a broken stream translated before the event that broke it
    /// (once): `respond::write_failure` sends it before the error event,
    /// so the agent loses none of the answer it could read.
    pub fn take_unsent(&mut self) -> Option<Bytes> {
        self.unsent.take()
    }

    /// The family that answered, when it was not the agent's.
    pub fn translated_from(&self) -> Option<Family> {
        self.upstream
    }

    /// The agent's provider kind while the answer is translated: error
    /// events at the end of a stream are written in its family.
    pub fn agent_kind(&self) -> Option<ProviderKind> {
        self.upstream.map(|_| match self.agent {
            Family::Anthropic => ProviderKind::Anthropic,
            Family::OpenAi => ProviderKind::Openai,
        })
    }
}

fn unreadable(why: String) -> Box<pingora::Error> {
    answer(UNREADABLE, GatewayError::UpstreamFailed(why))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Feature for Translate {
    fn arm(adm: &Admission) -> Option<Self> {
        let m = adm.model()?;
        if !adm.route.translates(m.endpoint) {
            return None;
        }
        Some(Translate {
            agent: endpoint_family(m.endpoint)?,
            usage_chunk: m.usage_chunk,
            upstream: None,
            room: m.translated.room.clone(),
            mode: Mode::Idle,
            unsent: None,
        })
    }

    async fn response_header(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        resp: &mut ResponseHeader,
    ) -> pingora::Result<()> {
        let Some(upstream) = self.upstream else {
            return Ok(());
        };
        let status = resp.status.as_u16();
        let sse = crate::proxy::respond::is_event_stream(resp);
        self.mode = match status {
            400.. => Mode::Error {
                status,
                body: Vec::new(),
            },
            200..=299 if sse => Mode::Stream(Box::new(StreamTranslator::new(
                upstream,
                StreamOptions {
                    created: now_secs(),
                    usage_chunk: self.usage_chunk,
                    ..StreamOptions::default()
                },
            ))),
            200..=299 => {
                let mut gathered = Gathered::new(self.room.as_ref());
                // Charged before the header goes on: refused, the agent
                // gets the gateway's error whole.
                if let Some(n) = declared_length(resp) {
                    gathered.reserve(n)?;
                }
                Mode::Json(gathered)
            }
            _ => return Ok(()),
        };
        if !sse {
            resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        }
        // Translation changes the length.
        super::rewritten_length(resp)
    }

    fn response_body(
        &mut self,
        adm: &Admission,
        body: &mut Option<Bytes>,
        end: bool,
    ) -> pingora::Result<()> {
        match &mut self.mode {
            Mode::Idle => Ok(()),
            Mode::Stream(t) => {
                // The agent's events run about as long as the provider's
                // (within 2x): one allocation per read, not a regrowth.
                let mut out = Vec::with_capacity(body.as_ref().map_or(0, |b| b.len() * 2));
                if let Some(b) = body.take() {
                    if let Err(e) = t.feed(&b, &mut out) {
                        log::warn!(
                            "request {}: the provider's stream cannot be translated: {e}",
                            adm.request_id
                        );
                        self.unsent = (!out.is_empty()).then(|| Bytes::from(out));
                        return Err(unreadable(format!(
                            "the provider's stream cannot be translated: {e}"
                        )));
                    }
                }
                if end {
                    t.finish().map_err(|_| {
                        unreadable("the provider's stream ended before its answer did".into())
                    })?;
                }
                *body = (!out.is_empty()).then(|| Bytes::from(out));
                Ok(())
            }
            Mode::Json(g) => {
                let refused = |e: Box<pingora::Error>| {
                    log::warn!(
                        "request {}: the provider's answer is not translated: {e}",
                        adm.request_id
                    );
                    e
                };
                if let Some(b) = body.take() {
                    g.reserve(b.len()).map_err(refused)?;
                    g.kept.extend_from_slice(&b);
                }
                if end {
                    // Translating parses the answer into a tree and builds
                    // the agent's: charged like judging while it runs.
                    let trees = loopgate_policy::json::parse_cost(&g.kept).saturating_mul(2);
                    g.charge(trees).map_err(refused)?;
                    let upstream = self.upstream.unwrap_or(self.agent);
                    let out = response::translate(upstream, &g.kept, now_secs()).map_err(|e| {
                        log::warn!(
                            "request {}: the provider's answer cannot be translated: {e}",
                            adm.request_id
                        );
                        unreadable(format!("the provider's answer cannot be translated: {e}"))
                    })?;
                    g.release();
                    *body = Some(Bytes::from(out));
                }
                Ok(())
            }
            Mode::Error { status, body: kept } => {
                if let Some(b) = body.take() {
                    let room = MAX_ERROR_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(b.get(..room.min(b.len())).unwrap_or_default());
                }
                if end {
                    *body = Some(Bytes::from(error::render(self.agent, *status, kept)));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_past_the_cap_is_refused_before_it_is_kept() {
        let mut g = Gathered::new(None);
        assert!(g.reserve(MAX_ANSWER_BYTES + 1).is_err());
        assert_eq!(g.kept.capacity(), 0, "nothing was allocated for it");
        assert!(g.reserve(1024).is_ok());
        g.kept.extend_from_slice(&[b' '; 1024]);
        assert!(g.reserve(MAX_ANSWER_BYTES - 1024).is_ok());
        assert!(g.reserve(MAX_ANSWER_BYTES - 1023).is_err());
    }
}
