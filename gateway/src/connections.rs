//! Connection admission on the agent listener: how many connections one
//! client address may hold, and how many the gateway holds in all.
//!
//! Pingora reads a request's headers with a per-read timeout only, so a
//! client that never finishes them holds its connection (and a descriptor)
//! as long as it trickles a byte now and then: 1,100 such connections took a
//! 1,024-descriptor gateway down for everyone. Each connection is counted
//! here from accept to close, across its keep-alive requests, and a new
//! connection's first request header must arrive whole within
//! [`HEADER_DEADLINE`] (408 and closed otherwise); past the
//! client's share or the total it is answered `503` and closed before any
//! request is read. The total keeps half the descriptors the process may
//! open, less a reserve, so every admitted connection can still open its
//! upstream connection, and the admin listener (health, metrics) keeps
//! working.

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connections one client address may hold at once.
pub const PER_CLIENT: usize = 256;
/// A new connection's first request header arrives whole within this.
/// Later requests on a kept-alive connection are bounded by Pingora's own
/// keep-alive timeout.
pub const HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(15);
/// Header bytes read ahead at most; Pingora refuses larger headers itself.
const HEADER_READ_AHEAD: usize = 64 * 1024;

/// Descriptors kept out of the agents' share (admin, logs, store, DNS).
const RESERVE_FDS: usize = 128;

/// The agent listener's app: Pingora's proxy behind the connection limits.
pub struct Limited<A> {
    inner: Arc<A>,
    per_client: usize,
    total_cap: usize,
    total: AtomicUsize,
    clients: Mutex<HashMap<IpAddr, usize>>,
}

impl<A> Limited<A> {
    pub fn new(inner: A, per_client: usize, total_cap: usize) -> Limited<A> {
        Limited {
            inner: Arc::new(inner),
            per_client,
            total_cap,
            total: AtomicUsize::new(0),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a place for a connection from `ip`, or `None` when its share or
    /// the total is used up.
    fn admit(&self, ip: Option<IpAddr>) -> Option<Place<'_, A>> {
        if self.total.fetch_add(1, Ordering::Relaxed) >= self.total_cap {
            self.total.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if let Some(ip) = ip {
            let Ok(mut map) = self.clients.lock() else {
                self.total.fetch_sub(1, Ordering::Relaxed);
                return None;
            };
            let n = map.entry(ip).or_insert(0);
            if *n >= self.per_client {
                drop(map);
                self.total.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
            *n += 1;
        }
        Some(Place { app: self, ip })
    }
}

/// One admitted connection's place; given back on drop.
struct Place<'a, A> {
    app: &'a Limited<A>,
    ip: Option<IpAddr>,
}

impl<A> Drop for Place<'_, A> {
    fn drop(&mut self) {
        self.app.total.fetch_sub(1, Ordering::Relaxed);
        if let Some(ip) = self.ip {
            if let Ok(mut map) = self.app.clients.lock() {
                if let Some(n) = map.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        map.remove(&ip);
                    }
                }
            }
        }
    }
}

const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nx-loopgate-error: gateway_overloaded\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 155\r\n\r\n{\"error\":{\"code\":\"gateway_overloaded\",\"type\":\"gateway_error\",\"message\":\"too many connections from this client or in all; retry shortly\",\"retryable\":true}}\n";

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Limited<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let ip = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let Some(_place) = self.admit(ip) else {
            let _ = stream.write_all(REFUSED).await;
            let _ = stream.shutdown().await;
            return None;
        };
        let stream = first_header_in_time(stream).await?;
        // The place is held across the connection's keep-alive requests:
        // they are served here, not handed back to the accept loop.
        let mut next = self.inner.process_new(stream, shutdown).await;
        while let Some(s) = next {
            if *shutdown.borrow() {
                return None;
            }
            next = self.inner.process_new(s, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}

const TIMED_OUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nx-loopgate-error: request_timeout\r\nconnection: close\r\ncontent-length: 138\r\n\r\n{\"error\":{\"code\":\"request_timeout\",\"type\":\"invalid_request_error\",\"message\":\"the request header did not arrive in time\",\"retryable\":true}}";

/// Reads ahead until the first request header is complete, within
/// [`HEADER_DEADLINE`], and puts what it read back for Pingora to parse.
/// `None`: the client was too slow (answered 408) or went away.
async fn first_header_in_time(stream: Stream) -> Option<Stream> {
    use pingora::protocols::l4::stream::Stream as Tcp;
    if !stream.as_any().is::<Tcp>() {
        return Some(stream); // not plain TCP (none today): Pingora's own timeouts
    }
    let mut tcp: Box<Tcp> = stream.into_any().downcast().ok()?;
    let deadline = tokio::time::Instant::now() + HEADER_DEADLINE;
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut chunk)).await {
            Err(_) => {
                let _ = tcp.write_all(TIMED_OUT).await;
                let _ = tcp.shutdown().await;
                return None;
            }
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => {
                // A header's end may straddle two reads.
                let from = seen.len().saturating_sub(3);
                seen.extend_from_slice(&chunk[..n]);
                if seen[from..].windows(4).any(|w| w == b"\r\n\r\n")
                    || seen.len() >= HEADER_READ_AHEAD
                {
                    break;
                }
            }
        }
    }
    tcp.rewind(&seen);
    Some(tcp)
}

/// The total for a process that may open `nofile` descriptors: each agent
/// connection needs one more upstream.
pub fn total_for(nofile: u64) -> usize {
    (nofile as usize).saturating_sub(RESERVE_FDS).max(2) / 2
}

/// The process's soft open-file limit.
pub fn nofile() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[test]
    fn shares_and_the_total_are_taken_and_given_back() {
        let app = Limited::new(Nothing, 2, 3);
        let a: IpAddr = [127, 0, 0, 2].into();
        let b: IpAddr = [127, 0, 0, 3].into();
        let p1 = app.admit(Some(a)).unwrap();
        let p2 = app.admit(Some(a)).unwrap();
        assert!(app.admit(Some(a)).is_none(), "a's share is used");
        let p3 = app.admit(Some(b)).unwrap();
        assert!(app.admit(Some(b)).is_none(), "the total is used");
        drop(p1);
        let _p4 = app.admit(Some(b)).unwrap();
        drop((p2, p3));
        assert_eq!(app.total.load(Ordering::Relaxed), 1);
        assert_eq!(app.clients.lock().unwrap().len(), 1);
        for answer in [REFUSED, TIMED_OUT] {
            let head = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let text = std::str::from_utf8(&answer[..head]).unwrap();
            let len: usize = text
                .rsplit("content-length: ")
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(answer.len() - head - 4, len, "{text}");
            let body: serde_json::Value = serde_json::from_slice(&answer[head + 4..]).unwrap();
            assert!(body["error"]["code"].is_string());
        }
    }

    #[test]
    fn the_total_leaves_a_reserve_and_an_upstream_descriptor_each() {
        assert_eq!(total_for(1024), 448);
        assert_eq!(total_for(100), 1);
    }
}
