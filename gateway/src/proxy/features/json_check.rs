//! "200 but unusable": a tool (or MCP server) whose 2xx answers must be
//! JSON is failed, for its breaker, when one is not. The body is kept up
//! to a bound while it passes and parsed once at the end; a larger one is
//! not judged.

use super::{Admission, Env, Feature};
use crate::proxy::ctx::Plan;
use bytes::Bytes;
use pingora::http::ResponseHeader;

/// Largest 2xx body checked; larger ones pass unjudged.
const LIMIT: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct JsonCheck {
    /// The answer so far, once a 2xx that must be JSON started; `None`
    /// before, or once it outgrew [`LIMIT`].
    kept: Option<Vec<u8>>,
}

impl JsonCheck {
    /// Whether the answer kept is not JSON (consumes what was kept).
    pub fn unusable(&mut self) -> bool {
        self.kept
            .take()
            .is_some_and(|b| serde_json::from_slice::<serde::de::IgnoredAny>(&b).is_err())
    }
}

impl Feature for JsonCheck {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Tool(t) if t.expect_json => Some(JsonCheck::default()),
            Plan::Mcp(_) => Some(JsonCheck::default()),
            _ => None,
        }
    }

    fn upstream_header(&mut self, _env: &Env<'_>, adm: &Admission, resp: &ResponseHeader) {
        let status = resp.status.as_u16();
        // An MCP server may answer with an SSE stream (JSON-RPC events,
        // not one JSON body) or 202 to a notification.
        let sse = crate::proxy::respond::is_event_stream(resp);
        let mcp = matches!(adm.plan, Plan::Mcp(_));
        if (200..300).contains(&status) && !(mcp && (sse || status == 202)) {
            self.kept = Some(Vec::new());
        }
    }

    fn upstream_body(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        body: Option<&Bytes>,
        _end: bool,
    ) -> pingora::Result<()> {
        if let (Some(buf), Some(b)) = (self.kept.as_mut(), body) {
            if buf.len() + b.len() > LIMIT {
                self.kept = None;
            } else {
                buf.extend_from_slice(b);
            }
        }
        Ok(())
    }
}
