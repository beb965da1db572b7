//! The MCP list filter: `*/list` results are filtered to the agent's grant
//! as the answer passes, so an agent never sees a tool, prompt or resource
//! it may not use. A JSON body is held whole (it is one message); an SSE
//! stream passes event by event, and only an event answering a list
//! request is held and rewritten. A message to filter that outgrows
//! [`MAX_LIST_BYTES`] ends the answer: it is never passed on unfiltered.

use super::{Admission, Env, Feature};
use crate::config::runtime::McpAccess;
use crate::proxy::ctx::Plan;
use crate::proxy::failure::UNREADABLE;
use crate::proxy::respond;
use bytes::Bytes;
use loopgate_policy::mcp::ListFilter as Filter;
use pingora::http::ResponseHeader;
use pingora::Error;
use serde_json::Value;
use std::sync::Arc;

/// Largest MCP message held to filter it (a JSON body, or one SSE event).
pub const MAX_LIST_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug)]
pub struct ListFilter {
    /// By JSON-RPC id (its JSON text, so `1` and `"1"` stay apart): one
    /// lookup per answered message, not a scan of every list request.
    lists: std::collections::HashMap<String, Filter>,
    access: Arc<McpAccess>,
    /// Filtering: the answer is a 2xx JSON body or SSE stream.
    active: bool,
    sse: bool,
    pending: Vec<u8>,
    pub removed: usize,
}

impl Feature for ListFilter {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Mcp(m) if !m.call.lists.is_empty() => {
                Some(ListFilter::new(&m.call.lists, m.call.access.clone()))
            }
            _ => None,
        }
    }

    async fn response_header(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        resp: &mut ResponseHeader,
    ) -> pingora::Result<()> {
        let json = respond::has_media_type(resp, "application/json");
        let sse = respond::is_event_stream(resp);
        if !(200..300).contains(&resp.status.as_u16()) || !(json || sse) {
            return Ok(());
        }
        self.active = true;
        self.sse = sse;
        // Filtering changes the length.
        super::rewritten_length(resp)
    }

    fn response_body(
        &mut self,
        adm: &Admission,
        body: &mut Option<Bytes>,
        end: bool,
    ) -> pingora::Result<()> {
        if !self.active {
            return Ok(());
        }
        let chunk = body.take().unwrap_or_default();
        match self.feed(&chunk, end) {
            Ok(out) => *body = (!out.is_empty()).then_some(out),
            Err(why) => {
                log::warn!("request {}: {why}; answer cut", adm.request_id);
                return Err(Error::explain(UNREADABLE, why));
            }
        }
        Ok(())
    }
}

impl ListFilter {
    pub fn new(lists: &[Filter], access: Arc<McpAccess>) -> ListFilter {
        ListFilter {
            lists: lists.iter().map(|f| (f.id.to_string(), f.clone())).collect(),
            access,
            active: false,
            sse: false,
            pending: Vec::new(),
            removed: 0,
        }
    }

    /// Rewrites one message if it answers a list request.
    fn rewrite_message(&mut self, v: &mut Value) -> bool {
        let mut changed = false;
        let mut one = |m: &mut Value, this: &mut ListFilter| {
            let Some(id) = m.get("id").map(Value::to_string) else {
                return;
            };
            if let Some(f) = this.lists.get(&id) {
                if let Some(result) = m.get_mut("result") {
                    this.removed += this.access.grant.filter_list(f, result);
                    changed = true;
                }
            }
        };
        match v {
            Value::Array(items) => items.iter_mut().for_each(|m| one(m, self)),
            m => one(m, self),
        }
        changed
    }

    /// Takes the next body chunk; returns what to send now, or `Err` when
    /// the message to filter outgrew [`MAX_LIST_BYTES`].
    fn feed(&mut self, chunk: &[u8], end: bool) -> Result<Bytes, String> {
        if self.pending.len() + chunk.len() > MAX_LIST_BYTES {
            self.pending = Vec::new();
            return Err(format!(
                "an MCP answer to filter exceeds {MAX_LIST_BYTES} bytes"
            ));
        }
        self.pending.extend_from_slice(chunk);
        Ok(self.feed_held(end))
    }

    fn feed_held(&mut self, end: bool) -> Bytes {
        if !self.sse {
            if !end {
                return Bytes::new();
            }
            let raw = std::mem::take(&mut self.pending);
            let Ok(mut v) = serde_json::from_slice::<Value>(&raw) else {
                return Bytes::from(raw);
            };
            if !self.rewrite_message(&mut v) {
                return Bytes::from(raw);
            }
            return Bytes::from(serde_json::to_vec(&v).unwrap_or(raw));
        }
        let mut out = Vec::new();
        while let Some(pos) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..pos).collect();
            out.extend_from_slice(&self.rewrite_event(event));
        }
        if end && !self.pending.is_empty() {
            out.append(&mut self.pending);
        }
        Bytes::from(out)
    }

    /// One SSE event (with its blank-line terminator).
    fn rewrite_event(&mut self, event: Vec<u8>) -> Vec<u8> {
        let Ok(text) = std::str::from_utf8(&event) else {
            return event;
        };
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return event;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&data.join("\n")) else {
            return event;
        };
        if !self.rewrite_message(&mut v) {
            return event;
        }
        let mut out = String::new();
        for l in text
            .lines()
            .filter(|l| !l.starts_with("data:") && !l.is_empty())
        {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
        out.into_bytes()
    }
}

/// The end (exclusive, blank line included) of the first complete event.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopgate_policy::mcp::{Kind, McpGrant};
    use loopgate_policy::PatternList;
    use serde_json::json;

    fn filter(sse: bool) -> ListFilter {
        let access = Arc::new(McpAccess {
            grant: McpGrant {
                tools: PatternList::parse(&["read*"]).unwrap(),
                prompts: PatternList::default(),
                resources: PatternList::default(),
            },
            calls_per_minute: 1,
            write_calls_per_minute: 1,
        });
        let lists = [Filter {
            id: json!(2),
            kind: Kind::Tool,
            templates: false,
        }];
        let mut f = ListFilter::new(&lists, access);
        f.active = true;
        f.sse = sse;
        f
    }

    fn list_result() -> Value {
        json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": "read_file"}, {"name": "delete_file"}], "nextCursor": "c2"}})
    }

    #[test]
    fn json_list_results_are_filtered_whole() {
        let mut r = filter(false);
        let body = list_result().to_string();
        let (a, b) = body.as_bytes().split_at(10);
        assert!(r.feed(a, false).unwrap().is_empty());
        let out: Value = serde_json::from_slice(&r.feed(b, true).unwrap()).unwrap();
        assert_eq!(out["result"]["tools"], json!([{"name": "read_file"}]));
        assert_eq!(out["result"]["nextCursor"], "c2");
        assert_eq!(r.removed, 1);
    }

    #[test]
    fn sse_passes_other_events_and_rewrites_the_list_event() {
        let mut r = filter(true);
        let progress =
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n";
        let list = format!("event: message\nid: 9\ndata: {}\n\n", list_result());
        let stream = format!("{progress}{list}");
        let mut out = Vec::new();
        for chunk in stream.as_bytes().chunks(7) {
            out.extend_from_slice(&r.feed(chunk, false).unwrap());
        }
        out.extend_from_slice(&r.feed(b"", true).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(progress), "{text}");
        assert!(text.contains("id: 9\n"));
        assert!(!text.contains("delete_file"));
        assert!(text.contains("read_file"));
        assert_eq!(r.removed, 1);
    }

    #[test]
    fn an_oversized_message_is_refused_not_passed() {
        let mut r = filter(false);
        let big = vec![b' '; MAX_LIST_BYTES + 1];
        assert!(r.feed(&big, false).is_err());
    }
}
