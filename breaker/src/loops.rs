//! Agent-loop detection: per task, a bounded ring of request fingerprints;
//! a request that would complete a repeated cycle is refused, and the task
//! cools down with a doubling back-off.
//!
//! A fingerprint is a digest of what makes a call the same call: endpoint,
//! model, the last `last_turns` messages, tools and tool arguments (they
//! live in the messages). Noise is left out: any key named in
//! `ignore_fields` at any depth (ids, timestamps, retry counters), key
//! order and whitespace (JSON layout, and runs of whitespace inside
//! strings). It is computed from the body's tokens as the one pass that
//! judges the body reads them ([`Fingerprinter`]), in memory bounded by
//! the nesting depth, never from a parsed tree.
//!
//! A loop is the ring's tail being one block of 1..=window/repeats
//! fingerprints repeated `repeats` times in a row, counting the incoming
//! request (the look-ahead: the request that would complete the third
//! repeat is the one refused, so the provider sees only the allowed ones).
//! Two calls of the same search tool in a 12-step task are two repeats, not
//! three, and the steps between them break the run.
//!
//! A task's ring, trips and cool-down are a [`TaskState`]: a pure step
//! with the time passed in, encoded to bytes. The gateway keeps one per
//! task in its state store (`loop:<agent>/<task>`), so replicas sharing a
//! store judge a task on one ring; nothing here holds tasks itself.

use loopgate_policy::tokens::{Token, TokenSink};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::time::Duration;

pub type Fingerprint = [u8; 32];

#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    pub window: usize,
    pub repeats: usize,
    pub last_turns: usize,
    pub ignore_fields: Vec<String>,
    pub cooldown: Duration,
    pub max_cooldown: Duration,
    /// Clean requests in a row that clear a task's trip history.
    pub clear_after: u32,
    /// The trip that stops the task instead of cooling it down (default
    /// 2: a task that loops again after its cool-down is stopped, not
    /// slowed). 0 never stops: every trip cools down, backing off.
    pub stop_after_trips: u32,
    /// Idle tasks are forgotten after this long.
    pub idle_ttl: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            window: 10,
            repeats: 3,
            last_turns: 2,
            ignore_fields: [
                "user",
                "metadata",
                "request_id",
                "timestamp",
                "created",
                "retry",
                "retry_count",
                "seed",
                "stream",
                "stream_options",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(600),
            clear_after: 5,
            stop_after_trips: 2,
            idle_ttl: Duration::from_secs(3600),
        }
    }
}

/// The most messages [`LoopConfig::last_turns`] may count (the
/// configuration refuses more): each is held as a digest while the body
/// is read.
pub const MAX_LAST_TURNS: usize = 1000;

/// The fingerprint of a request to `endpoint` with JSON `body` (the
/// tokens of `body` through a [`Fingerprinter`]).
pub fn fingerprint(endpoint: &str, body: &Value, cfg: &LoopConfig) -> Fingerprint {
    let mut f = Fingerprinter::new(endpoint, cfg);
    loopgate_policy::tokens::replay(body, &mut f);
    f.finish()
}

/// Computes a request's fingerprint from the tokens of its body
/// ([`TokenSink`]), as they are read.
///
/// What it digests is the canonical form of the call: `{"endpoint":
/// endpoint, ...body}` (a body key `endpoint` replacing the first), with
/// ignored keys dropped at every depth, runs of whitespace in strings
/// collapsed (none at either end), and of a top-level `messages` array
/// only the last `last_turns` entries. Two bodies with one canonical form
/// have one fingerprint; any other difference makes another (but for
/// SHA-256 collisions).
///
/// Key order must not matter, and sorting keys would mean holding the
/// body; so an object is digested as the sum (per 64-bit limb, wrapping)
/// of the SHA-256 digests of its entries (key and value), with their
/// count: the same for any order. Values are written into the stream of
/// the entry (or kept message) that holds them as they come: a tag byte
/// and the value (a string's bytes end with 0xFF, which UTF-8 never
/// holds; numbers as `serde_json` reads them, an integer never equal to a
/// float; an object its count and sum). An entry's stream is kept as
/// bytes until it passes [`RAW_LIMIT`], then fed to a running SHA-256;
/// an object whose one entry stayed that small is written as that entry
/// instead of a sum (nested single-key objects cost no digest each). What
/// is held is at most [`RAW_LIMIT`] bytes or one running SHA-256 per open
/// entry, a sum per open object (the nesting depth bounds both), and the
/// digests of the kept messages.
///
/// A key that appears twice in one object is counted twice (a parsed
/// tree would keep the last); the body walk refuses duplicated judged
/// fields at the top level, and a duplicate elsewhere only makes another
/// fingerprint.
pub struct Fingerprinter<'c> {
    cfg: &'c LoopConfig,
    /// The digest of the `endpoint` entry the top-level object starts
    /// with, unless ignored.
    endpoint: Option<[u8; 32]>,
    frames: Vec<Frame>,
    /// Where values are written: one per open entry and kept message,
    /// innermost last; none: the root.
    sinks: Vec<Sink>,
    /// The streams of the open entries and messages still kept as bytes,
    /// innermost last.
    raw: Vec<u8>,
    root: Sha256,
    /// Inside a value left out (an ignored key's, or a body that is not
    /// an object): how many of its containers are open.
    skip: Option<usize>,
    /// The top-level object has ended.
    done: bool,
}

/// An entry's or a message's stream is kept as bytes up to this long.
pub const RAW_LIMIT: usize = 1024;

enum Sink {
    /// The stream so far is `raw[start..]`.
    Raw(usize),
    Hash(Box<Sha256>),
}

enum Frame {
    /// An open object: its entries' digests summed, their count;
    /// `placeholder`: where in `raw` its tag was put (its container's
    /// stream is kept as bytes); `pending`: its first entry, kept as
    /// bytes from there, not digested while it may be the only one.
    Object {
        sum: [u64; 4],
        count: u64,
        top: bool,
        placeholder: Option<usize>,
        pending: Option<usize>,
    },
    /// An entry whose value is being read; `messages`: the top-level
    /// `messages`.
    Entry {
        messages: bool,
    },
    Array,
    /// The top-level `messages` array: its last entries' digests.
    Messages(VecDeque<[u8; 32]>),
    /// An entry of `messages` being read.
    Message,
}

/// Written first into every fingerprint: another scheme, another digest.
const VERSION: &[u8] = b"loopgate loop fingerprint 2\0";

impl<'c> Fingerprinter<'c> {
    pub fn new(endpoint: &str, cfg: &'c LoopConfig) -> Fingerprinter<'c> {
        let mut root = Sha256::new();
        root.update(VERSION);
        let ignored = cfg.ignore_fields.iter().any(|f| f == "endpoint");
        let endpoint = (!ignored).then(|| {
            let mut b = Vec::with_capacity(endpoint.len() + 16);
            key(&mut b, "endpoint");
            string(&mut |p| b.extend_from_slice(p), endpoint);
            Sha256::digest(&b).into()
        });
        Fingerprinter {
            cfg,
            endpoint,
            frames: Vec::new(),
            sinks: Vec::new(),
            raw: Vec::new(),
            root,
            skip: None,
            done: false,
        }
    }

    /// The fingerprint of the tokens seen. A body that was not one object
    /// counts as `{}`.
    pub fn finish(mut self) -> Fingerprint {
        if !self.done {
            let (sum, count) = match self.endpoint {
                Some(e) => (add([0; 4], &e, false), 1),
                None => ([0; 4], 0),
            };
            self.root.update(object_repr(sum, count));
        }
        self.root.finalize().into()
    }

    /// Writes into the innermost stream; one kept as bytes that would
    /// pass [`RAW_LIMIT`] goes to a running digest first.
    fn write(&mut self, bytes: &[u8]) {
        match self.sinks.last_mut() {
            None => self.root.update(bytes),
            Some(Sink::Hash(h)) => h.update(bytes),
            Some(sink @ Sink::Raw(_)) => {
                let Sink::Raw(start) = *sink else { return };
                if self.raw.len() - start + bytes.len() > RAW_LIMIT {
                    let mut h = Box::new(Sha256::new());
                    h.update(&self.raw[start..]);
                    h.update(bytes);
                    self.raw.truncate(start);
                    *sink = Sink::Hash(h);
                } else {
                    self.raw.extend_from_slice(bytes);
                }
            }
        }
    }

    /// The innermost stream is complete: its digest.
    fn close_sink(&mut self) -> [u8; 32] {
        match self.sinks.pop() {
            Some(Sink::Hash(h)) => h.finalize().into(),
            Some(Sink::Raw(start)) => {
                let d = digest(&self.raw[start..]);
                self.raw.truncate(start);
                d
            }
            None => [0; 32],
        }
    }

    /// A value starts: an entry of `messages` gets its own stream.
    fn value_starts(&mut self) {
        if let Some(Frame::Messages(_)) = self.frames.last() {
            self.sinks.push(Sink::Raw(self.raw.len()));
            self.frames.push(Frame::Message);
        }
    }

    /// A value ended: its entry goes into its object (digested, or kept
    /// as bytes while it may be the only one), a message's digest among
    /// those kept.
    fn value_ends(&mut self) {
        match self.frames.last() {
            Some(Frame::Entry { .. }) => {
                self.frames.pop();
                let Some(Frame::Object {
                    top,
                    count,
                    pending,
                    ..
                }) = self.frames.last()
                else {
                    return;
                };
                if let (false, 0, None, Some(Sink::Raw(start))) =
                    (*top, *count, pending, self.sinks.last())
                {
                    let start = *start;
                    self.sinks.pop();
                    if let Some(Frame::Object { count, pending, .. }) = self.frames.last_mut() {
                        *count = 1;
                        *pending = Some(start);
                    }
                    return;
                }
                let digest = self.close_sink();
                if let Some(Frame::Object { sum, count, .. }) = self.frames.last_mut() {
                    *sum = add(*sum, &digest, false);
                    *count += 1;
                }
            }
            Some(Frame::Message) => {
                self.frames.pop();
                let digest = self.close_sink();
                let keep = self.cfg.last_turns.min(MAX_LAST_TURNS);
                if let Some(Frame::Messages(kept)) = self.frames.last_mut() {
                    kept.push_back(digest);
                    while kept.len() > keep {
                        kept.pop_front();
                    }
                }
            }
            _ => {}
        }
    }

    /// An object ended: written into its container's stream as its one
    /// entry (kept as bytes) or as its count and sum.
    fn object_ends(
        &mut self,
        sum: [u64; 4],
        count: u64,
        placeholder: Option<usize>,
        pending: Option<usize>,
    ) {
        match (pending, placeholder) {
            (Some(_), Some(_)) => {
                // `o` and the entry are in place in the container's bytes;
                // the container may have grown past the limit.
                self.write(b"");
            }
            (Some(start), None) => {
                let entry = self.raw.split_off(start);
                self.write(b"o");
                self.write(&entry);
            }
            (None, _) => {
                if let Some(p) = placeholder {
                    self.raw.truncate(p);
                }
                self.write(&object_repr(sum, count));
            }
        }
    }

    fn scalar(&mut self, tag: u8, bytes: [u8; 8]) {
        self.value_starts();
        let mut b = [tag, 0, 0, 0, 0, 0, 0, 0, 0];
        b[1..].copy_from_slice(&bytes);
        self.write(&b);
        self.value_ends();
    }
}

impl TokenSink for Fingerprinter<'_> {
    fn token(&mut self, t: Token<'_>) {
        if let Some(open) = &mut self.skip {
            match t {
                Token::ObjectStart | Token::ArrayStart => *open += 1,
                Token::ObjectEnd | Token::ArrayEnd => *open = open.saturating_sub(1),
                _ => {}
            }
            if *open == 0 && !matches!(t, Token::Key(_)) {
                self.skip = None;
            }
            return;
        }
        if self.done {
            return;
        }
        if self.frames.is_empty() && t != Token::ObjectStart {
            // Not an object: the body is left out.
            self.skip = Some(0);
            return self.token(t);
        }
        match t {
            Token::ObjectStart => {
                let top = self.frames.is_empty();
                self.value_starts();
                let (sum, count) = match (top, self.endpoint) {
                    (true, Some(e)) => (add([0; 4], &e, false), 1),
                    _ => ([0; 4], 0),
                };
                let placeholder = match self.sinks.last() {
                    Some(Sink::Raw(_)) => {
                        self.raw.push(b'o');
                        Some(self.raw.len() - 1)
                    }
                    _ => None,
                };
                self.frames.push(Frame::Object {
                    sum,
                    count,
                    top,
                    placeholder,
                    pending: None,
                });
            }
            Token::Key(k) => {
                if self.cfg.ignore_fields.iter().any(|f| f == k) {
                    self.skip = Some(0);
                    return;
                }
                let Some(Frame::Object {
                    sum,
                    count,
                    top,
                    pending,
                    ..
                }) = self.frames.last_mut()
                else {
                    return;
                };
                let top = *top;
                if let Some(start) = pending.take() {
                    // A second entry: the first is digested after all.
                    *sum = add(*sum, &digest(&self.raw[start..]), false);
                    self.raw.truncate(start);
                }
                if top && k == "endpoint" {
                    // The body's `endpoint` replaces the request's.
                    if let Some(e) = self.endpoint.take() {
                        *sum = add(*sum, &e, true);
                        *count -= 1;
                    }
                }
                self.sinks.push(Sink::Raw(self.raw.len()));
                if k.len() + 2 <= RAW_LIMIT {
                    key(&mut self.raw, k);
                } else {
                    let mut b = Vec::with_capacity(k.len() + 2);
                    key(&mut b, k);
                    self.write(&b);
                }
                self.frames.push(Frame::Entry {
                    messages: top && k == "messages",
                });
            }
            Token::ObjectEnd => {
                if let Some(Frame::Object {
                    sum,
                    count,
                    top,
                    placeholder,
                    pending,
                }) = self.frames.pop()
                {
                    self.object_ends(sum, count, placeholder, pending);
                    self.done = top;
                }
                self.value_ends();
            }
            Token::ArrayStart => match self.frames.last() {
                Some(Frame::Entry { messages: true }) => {
                    self.frames.push(Frame::Messages(VecDeque::new()));
                }
                _ => {
                    self.value_starts();
                    self.write(b"[");
                    self.frames.push(Frame::Array);
                }
            },
            Token::ArrayEnd => {
                match self.frames.pop() {
                    Some(Frame::Messages(kept)) => {
                        self.write(b"M");
                        self.write(&(kept.len() as u64).to_le_bytes());
                        for d in &kept {
                            self.write(d);
                        }
                    }
                    _ => self.write(b"]"),
                }
                self.value_ends();
            }
            Token::Str(s) => {
                self.value_starts();
                string(&mut |p| self.write(p), s);
                self.value_ends();
            }
            Token::U64(n) => self.scalar(b'u', n.to_le_bytes()),
            // A non-negative integer reads as U64 (as a `Value` holds it).
            Token::I64(n) if n >= 0 => self.scalar(b'u', (n as u64).to_le_bytes()),
            Token::I64(n) => self.scalar(b'i', n.to_le_bytes()),
            Token::F64(n) => self.scalar(b'f', n.to_bits().to_le_bytes()),
            Token::Bool(b) => self.scalar(if b { b'T' } else { b'F' }, [0; 8]),
            Token::Null => self.scalar(b'n', [0; 8]),
        }
    }
}

/// SHA-256 of `bytes`; one that fits one block (most entries) padded here
/// and compressed once, without the hasher's buffering.
fn digest(bytes: &[u8]) -> [u8; 32] {
    const IV: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    if bytes.len() > 55 {
        return Sha256::digest(bytes).into();
    }
    let mut block = [0u8; 64];
    block[..bytes.len()].copy_from_slice(bytes);
    block[bytes.len()] = 0x80;
    block[56..].copy_from_slice(&(bytes.len() as u64 * 8).to_be_bytes());
    let mut state = IV;
    sha2::compress256(&mut state, &[block.into()]);
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// An object of more than one entry (or one too long to keep as bytes):
/// its count and sum.
fn object_repr(sum: [u64; 4], count: u64) -> [u8; 42] {
    let mut repr = [0u8; 42];
    repr[0] = b'{';
    repr[1..9].copy_from_slice(&count.to_le_bytes());
    for (i, limb) in sum.iter().enumerate() {
        repr[9 + 8 * i..17 + 8 * i].copy_from_slice(&limb.to_le_bytes());
    }
    repr[41] = b'}';
    repr
}

/// `sum` plus (or minus) a digest, per 64-bit limb.
fn add(mut sum: [u64; 4], digest: &[u8; 32], minus: bool) -> [u64; 4] {
    for (i, limb) in sum.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[8 * i..8 * i + 8]);
        let d = u64::from_le_bytes(b);
        *limb = if minus {
            limb.wrapping_sub(d)
        } else {
            limb.wrapping_add(d)
        };
    }
    sum
}

/// A key: its bytes as they are.
fn key(out: &mut Vec<u8>, k: &str) {
    out.push(b'k');
    out.extend_from_slice(k.as_bytes());
    out.push(0xFF);
}

/// A string with its runs of whitespace collapsed to one space and none
/// at either end, written in as few pieces as the text allows.
fn string(write: &mut dyn FnMut(&[u8]), s: &str) {
    write(b"s");
    let base = s.as_ptr() as usize;
    let mut run: Option<(usize, usize)> = None;
    for word in s.split_whitespace() {
        let from = word.as_ptr() as usize - base;
        let to = from + word.len();
        run = Some(match run {
            // One space between: the run goes on as written.
            Some((a, b)) if from == b + 1 && s.as_bytes()[b] == b' ' => (a, to),
            Some((a, b)) => {
                write(&s.as_bytes()[a..b]);
                write(b" ");
                (from, to)
            }
            None => (from, to),
        });
    }
    if let Some((a, b)) = run {
        write(&s.as_bytes()[a..b]);
    }
    write(&[0xFF]);
}

/// Whether the ring's tail, with `next` appended, is a block repeated
/// `repeats` times. Returns the block length.
pub fn detect(
    ring: &VecDeque<Fingerprint>,
    next: &Fingerprint,
    window: usize,
    repeats: usize,
) -> Option<usize> {
    let mut seq: Vec<&Fingerprint> = ring.iter().collect();
    seq.push(next);
    let start = seq.len().saturating_sub(window);
    let seq = &seq[start..];
    let repeats = repeats.max(2);
    for len in 1..=seq.len() / repeats {
        let tail = &seq[seq.len() - len * repeats..];
        let block = &tail[..len];
        if tail.chunks(len).all(|c| c == block) {
            return Some(len);
        }
    }
    None
}

/// What the guard decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum LoopVerdict {
    Allow,
    /// The task is cooling down from an earlier trip.
    CoolingDown {
        retry_after: Duration,
    },
    /// This request completes a loop: the task trips now (and is stopped
    /// when [`Trip::stopped`]).
    Tripped(Trip),
    /// The task was stopped by an earlier trip: it stays stopped until it
    /// has been idle for [`LoopConfig::idle_ttl`].
    Stopped,
}

/// Evidence of a trip, for the snapshot file.
#[derive(Debug, Clone, PartialEq)]
pub struct Trip {
    pub block_len: usize,
    pub trail: Vec<String>,
    pub trips: u32,
    pub cooldown: Duration,
    /// This trip stops the task ([`LoopConfig::stop_after_trips`]).
    pub stopped: bool,
}

/// One task's loop state: what [`TaskState::step`] reads and writes. It
/// travels through the state store as bytes ([`TaskState::encode`]), so
/// every replica judges a task on the same ring.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TaskState {
    ring: VecDeque<Fingerprint>,
    blocked_until: Option<Duration>,
    /// Stopped by a trip: refused until forgotten (idle for `idle_ttl`).
    stopped: bool,
    trips: u32,
    clean: u32,
    last_seen: Duration,
}

impl TaskState {
    /// Judges the task's next request, fingerprint `fp`, at `now`.
    pub fn step(&mut self, fp: Fingerprint, cfg: &LoopConfig, now: Duration) -> LoopVerdict {
        if now.saturating_sub(self.last_seen) >= cfg.idle_ttl {
            *self = TaskState::default();
        }
        self.last_seen = now;
        if self.stopped {
            return LoopVerdict::Stopped;
        }
        if let Some(until) = self.blocked_until {
            if now < until {
                return LoopVerdict::CoolingDown {
                    retry_after: until - now,
                };
            }
            // Cool-down over: this is the trial request. The ring is kept,
            // so a trial that repeats the cycle trips again at once: an
            // agent whose client retries after `Retry-After` (the official
            // SDKs do) must not get one more repeat through per cool-down.
            self.blocked_until = None;
        }
        if let Some(block_len) = detect(&self.ring, &fp, cfg.window, cfg.repeats) {
            self.trips = self.trips.saturating_add(1);
            self.clean = 0;
            let stopped = cfg.stop_after_trips > 0 && self.trips >= cfg.stop_after_trips;
            let factor = 1u32.checked_shl(self.trips - 1).unwrap_or(u32::MAX);
            let cooldown = cfg
                .cooldown
                .checked_mul(factor)
                .unwrap_or(cfg.max_cooldown)
                .min(cfg.max_cooldown);
            if stopped {
                self.stopped = true;
            } else {
                self.blocked_until = Some(now + cooldown);
            }
            let mut trail: Vec<String> = self.ring.iter().map(hex8).collect();
            trail.push(hex8(&fp));
            return LoopVerdict::Tripped(Trip {
                block_len,
                trail,
                trips: self.trips,
                cooldown,
                stopped,
            });
        }
        while self.ring.len() >= cfg.window.max(1) {
            self.ring.pop_front();
        }
        self.ring.push_back(fp);
        self.clean += 1;
        if self.clean >= cfg.clear_after {
            self.trips = 0;
        }
        LoopVerdict::Allow
    }

    /// Fixed little-endian layout: trips, clean (u32), blocked-until
    /// (u64 ns + 1, 0 for none, `u64::MAX` for stopped: a replica that
    /// predates stopping reads it as blocked for centuries, still a
    /// refusal), last-seen (u64 ns), then the ring.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 32 * self.ring.len());
        out.extend_from_slice(&self.trips.to_le_bytes());
        out.extend_from_slice(&self.clean.to_le_bytes());
        let blocked = if self.stopped {
            STOPPED
        } else {
            self.blocked_until.map_or(0, |d| {
                (d.as_nanos() as u64).saturating_add(1).min(STOPPED - 1)
            })
        };
        out.extend_from_slice(&blocked.to_le_bytes());
        out.extend_from_slice(&(self.last_seen.as_nanos() as u64).to_le_bytes());
        for fp in &self.ring {
            out.extend_from_slice(fp);
        }
        out
    }

    /// `None` for bytes that are not an encoded state.
    pub fn decode(b: &[u8]) -> Option<TaskState> {
        if b.len() < 24 || !(b.len() - 24).is_multiple_of(32) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let blocked = u64_at(8);
        Some(TaskState {
            trips: u32_at(0),
            clean: u32_at(4),
            blocked_until: (blocked > 0 && blocked != STOPPED)
                .then(|| Duration::from_nanos(blocked - 1)),
            stopped: blocked == STOPPED,
            last_seen: Duration::from_nanos(u64_at(16)),
            ring: b[24..]
                .chunks_exact(32)
                .map(|c| c.try_into().expect("32 bytes"))
                .collect(),
        })
    }
}

/// The blocked-until word of a stopped task.
const STOPPED: u64 = u64::MAX;

fn hex8(fp: &Fingerprint) -> String {
    fp[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The canonical form as first written (the tree the fingerprint
    /// used to hash the serialisation of): two bodies must have one
    /// fingerprint exactly when they have one canonical form.
    fn reference(endpoint: &str, body: &Value, cfg: &LoopConfig) -> Vec<u8> {
        fn canonicalize(v: Value, ignore: &[String]) -> Value {
            match v {
                Value::Object(map) => Value::Object(
                    map.into_iter()
                        .filter(|(k, _)| !ignore.iter().any(|f| f == k))
                        .map(|(k, v)| (k, canonicalize(v, ignore)))
                        .collect(),
                ),
                Value::Array(a) => {
                    Value::Array(a.into_iter().map(|v| canonicalize(v, ignore)).collect())
                }
                Value::String(s) => {
                    Value::String(s.split_whitespace().collect::<Vec<_>>().join(" "))
                }
                other => other,
            }
        }
        let mut meaningful = serde_json::Map::new();
        meaningful.insert("endpoint".into(), Value::String(endpoint.into()));
        if let Value::Object(map) = body {
            for (k, v) in map {
                if cfg.ignore_fields.iter().any(|f| f == k) {
                    continue;
                }
                let v = match (k.as_str(), v) {
                    ("messages", Value::Array(msgs)) => {
                        let skip = msgs.len().saturating_sub(cfg.last_turns);
                        Value::Array(msgs[skip..].to_vec())
                    }
                    _ => v.clone(),
                };
                meaningful.insert(k.clone(), v);
            }
        }
        let canonical = canonicalize(Value::Object(meaningful), &cfg.ignore_fields);
        serde_json::to_vec(&canonical).unwrap()
    }

    /// The fingerprint of JSON text, from its tokens as a reader meets
    /// them (keys in the text's order).
    fn streamed(endpoint: &str, text: &[u8], cfg: &LoopConfig) -> Fingerprint {
        let mut f = Fingerprinter::new(endpoint, cfg);
        loopgate_policy::tokens::read(text, &mut f).unwrap();
        f.finish()
    }

    /// `v` written with its keys in reverse order, ignored fields added
    /// to every object and whitespace runs in strings lengthened.
    fn noisy(v: &Value) -> String {
        match v {
            Value::Object(map) => {
                let mut parts: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), noisy(v)))
                    .collect();
                parts.push(r#""request_id": {"at": [1, "x"]}"#.into());
                parts.insert(0, r#""seed" : 7"#.into());
                format!("{{ {} }}", parts.join(" ,\n "))
            }
            Value::Array(a) => {
                let items: Vec<String> = a.iter().map(noisy).collect();
                format!("[ {} ]", items.join(", "))
            }
            Value::String(s) => {
                let spaced: String = s
                    .chars()
                    .flat_map(|c| match c {
                        ' ' => vec![' ', '\t', ' '],
                        c => vec![c],
                    })
                    .collect();
                Value::String(format!("  {spaced}\n")).to_string()
            }
            other => other.to_string(),
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            "model", "messages", "user", "content", "role", "endpoint", "a b", "é\"q", "seed",
            "tools",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[ a-z\\t\\n\"\\\\é]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    proptest! {
        /// One fingerprint exactly for one canonical form: for any two
        /// bodies, and for a body and the same call written with other
        /// key order, layout, whitespace and ignored fields; read from
        /// text as from a tree.
        #[test]
        fn fingerprints_agree_with_the_canonical_form(
            a in json_value(),
            b in json_value(),
            turns in 0usize..4,
        ) {
            let cfg = LoopConfig { last_turns: turns, ..LoopConfig::default() };
            let e = "/v1/chat/completions";
            prop_assert_eq!(
                fingerprint(e, &a, &cfg) == fingerprint(e, &b, &cfg),
                reference(e, &a, &cfg) == reference(e, &b, &cfg)
            );
            // Read back from text (a float may come back an ulp apart:
            // the gateway reads every body from text).
            let text = serde_json::to_vec(&a).unwrap();
            let parsed: Value = serde_json::from_slice(&text).unwrap();
            let fp = fingerprint(e, &parsed, &cfg);
            prop_assert_eq!(streamed(e, &text, &cfg), fp);
            let noisy = noisy(&parsed);
            let again: Value = serde_json::from_str(&noisy).unwrap();
            prop_assert_eq!(reference(e, &again, &cfg), reference(e, &parsed, &cfg));
            prop_assert_eq!(fingerprint(e, &again, &cfg), fp);
            prop_assert_eq!(streamed(e, noisy.as_bytes(), &cfg), fp);
        }
    }

    #[test]
    fn small_digests_are_sha256() {
        for n in 0..130 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            assert_eq!(
                digest(&bytes),
                <[u8; 32]>::from(Sha256::digest(&bytes)),
                "{n}"
            );
        }
    }

    #[test]
    fn endpoint_key_rules_match_the_reference() {
        let mut cfg = LoopConfig::default();
        let body = json!({"endpoint": "x", "model": "m"});
        let same = |a: (&str, &Value), b: (&str, &Value), cfg: &LoopConfig| {
            let by_fp = fingerprint(a.0, a.1, cfg) == fingerprint(b.0, b.1, cfg);
            assert_eq!(by_fp, reference(a.0, a.1, cfg) == reference(b.0, b.1, cfg));
            by_fp
        };
        // The body's `endpoint` replaces the request's.
        assert!(same(("/e", &body), ("x", &json!({"model": "m"})), &cfg));
        assert!(same(("/e", &body), ("/f", &body), &cfg));
        assert!(!same(
            ("/e", &json!({"model": "m"})),
            ("/f", &json!({"model": "m"})),
            &cfg
        ));
        cfg.ignore_fields.push("endpoint".into());
        assert!(same(("/e", &body), ("/f", &json!({"model": "m"})), &cfg));
        // A body that is not an object counts as `{}`.
        let not_object = json!([1, 2]);
        assert!(same(("/e", &not_object), ("/e", &json!({})), &cfg));
        assert!(same(("/e", &not_object), ("/e", &json!("text")), &cfg));
    }

    #[test]
    fn fingerprinting_holds_digests_not_the_body() {
        // 2,000 chains of 60 nested objects and 100,000 keys in one
        // object: what is held is one digest per open container, and
        // the kept messages' digests, whatever the body's size.
        let chain = format!("{}1{}", r#"{"a":"#.repeat(60), "}".repeat(60));
        let chains = format!(
            r#"{{"model":"m","messages":[{}]}}"#,
            vec![chain.as_str(); 2000].join(",")
        );
        let keys: Vec<String> = (0..100_000).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let wide = format!(r#"{{"model":"m","x":{{{}}}}}"#, keys.join(","));
        let cfg = LoopConfig::default();
        for text in [chains, wide] {
            let mut f = Fingerprinter::new("/e", &cfg);
            let mut most = (0, 0);
            struct Watch<'a, 'c>(&'a mut Fingerprinter<'c>, &'a mut (usize, usize));
            impl TokenSink for Watch<'_, '_> {
                fn token(&mut self, t: Token<'_>) {
                    self.0.token(t);
                    self.1 .0 = self.1 .0.max(self.0.frames.len());
                    self.1 .1 = self.1 .1.max(self.0.raw.len());
                }
            }
            loopgate_policy::tokens::read(text.as_bytes(), &mut Watch(&mut f, &mut most)).unwrap();
            assert!(most.0 <= 2 * 64 && most.1 <= 64 * RAW_LIMIT, "{most:?}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(f.finish(), fingerprint("/e", &v, &cfg));
        }
    }

    const S: Duration = Duration::from_secs(1);

    fn fp(v: Value) -> Fingerprint {
        fingerprint("/v1/chat/completions", &v, &LoopConfig::default())
    }

    #[test]
    fn noise_key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "find  the\norder"}], "user": "u1", "metadata": {"ts": 1}}),
        );
        let b = fp(
            json!({"messages": [{"content": " find the order ", "role": "user", "request_id": "r9"}], "model": "m", "user": "u2", "stream": true}),
        );
        assert_eq!(a, b);
        let c = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "find the invoice"}]}),
        );
        assert_ne!(a, c);
        let d = fp(
            json!({"model": "other", "messages": [{"role": "user", "content": "find the order"}]}),
        );
        assert_ne!(a, d);
    }

    #[test]
    fn only_the_last_turns_count_and_tool_arguments_matter() {
        let call = |args: &str| json!({"role": "assistant", "tool_calls": [{"function": {"name": "search", "arguments": args}}]});
        let a = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "long history 1"}, call("{\"q\":\"x\"}"), {"role": "tool", "content": "none"}]}),
        );
        let b = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "other history"}, {"role": "user", "content": "more"}, call("{\"q\":\"x\"}"), {"role": "tool", "content": "none"}]}),
        );
        assert_eq!(
            a, b,
            "history before the last 2 turns is not part of the call"
        );
        let c = fp(
            json!({"model": "m", "messages": [call("{\"q\":\"y\"}"), {"role": "tool", "content": "none"}]}),
        );
        assert_ne!(a, c);
    }

    fn ring(ids: &[u8]) -> VecDeque<Fingerprint> {
        ids.iter().map(|i| [*i; 32]).collect()
    }

    #[test]
    fn detection() {
        assert_eq!(detect(&ring(&[1, 1]), &[1; 32], 10, 3), Some(1));
        assert_eq!(detect(&ring(&[1]), &[1; 32], 10, 3), None);
        assert_eq!(
            detect(&ring(&[1, 2, 1, 2, 1]), &[2; 32], 10, 3),
            Some(2),
            "A,B,A,B,A,B trips"
        );
        assert_eq!(
            detect(&ring(&[1, 2, 3, 1, 2, 3, 1, 2]), &[3; 32], 10, 3),
            Some(3)
        );
        assert_eq!(detect(&ring(&[1, 2, 1, 3, 1]), &[2; 32], 10, 3), None);
        // Outside the window does not count.
        assert_eq!(
            detect(&ring(&[1, 1, 2, 3, 4, 5, 6, 7, 8, 9]), &[1; 32], 10, 3),
            None
        );
    }

    /// Tasks' loop states by key, each stepped by the pure
    /// [`TaskState::step`] (as the store holds them, without its bounds).
    #[derive(Default)]
    struct Tasks(std::collections::HashMap<String, TaskState>);

    impl Tasks {
        fn check(
            &mut self,
            key: &str,
            fp: Fingerprint,
            cfg: &LoopConfig,
            now: Duration,
        ) -> LoopVerdict {
            self.0
                .entry(key.to_string())
                .or_default()
                .step(fp, cfg, now)
        }
    }

    /// Loop rings kept in a memory store as the gateway keeps them: a
    /// `loop:<agent>/<task>` record each, stepped by `step_record`.
    struct Stored {
        store: loopgate_policy::MemoryStore,
    }

    impl Stored {
        fn check(
            &self,
            key: &str,
            fp: Fingerprint,
            cfg: &LoopConfig,
            now: Duration,
        ) -> LoopVerdict {
            let clock = loopgate_policy::ManualClock::default();
            clock.set(now);
            let step = |task: Option<TaskState>, now| {
                let mut task = task.unwrap_or_default();
                let verdict = task.step(fp, cfg, now);
                (Some(task.encode()), verdict)
            };
            let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
            let key = format!("loop:{key}");
            let stepped = loopgate_policy::step_record(
                &self.store,
                &clock,
                &key,
                ttl,
                TaskState::decode,
                step,
            );
            ready(stepped).expect("the memory store answers")
        }

        fn len(&self) -> usize {
            self.store.records_len().unwrap()
        }
    }

    /// The output of `f`, ready at its first poll (the memory store never
    /// waits).
    fn ready<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the future waited"),
        }
    }

    #[test]
    fn stored_rings_stay_within_the_agents_bound_in_constant_time_per_task() {
        const CAPACITY: usize = 100_000;
        let g = Stored {
            store: loopgate_policy::MemoryStore::with_record_capacity(CAPACITY),
        };
        let cfg = LoopConfig::default();
        let t0 = std::time::Instant::now();
        for i in 0..(3 * CAPACITY) as u32 {
            g.check(&format!("agent/task-{i}"), [1; 32], &cfg, S);
        }
        // Printed, not judged: a full map costs no more per new task than an
        // empty one (the old map scanned every task once full).
        println!(
            "loop guard: {} new tasks in {:?}",
            3 * CAPACITY,
            t0.elapsed()
        );
        assert_eq!(g.len(), CAPACITY);
        // The most recent task kept its ring: its second repeat is counted.
        let last = format!("agent/task-{}", 3 * CAPACITY - 1);
        g.check(&last, [1; 32], &cfg, S);
        assert!(matches!(
            g.check(&last, [1; 32], &cfg, S),
            LoopVerdict::Tripped(_)
        ));
    }

    #[test]
    fn idle_tasks_are_dropped_lazily_and_start_over() {
        let g = Stored {
            store: loopgate_policy::MemoryStore::with_record_capacity(10),
        };
        let cfg = LoopConfig::default();
        let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
        for i in 0..5 {
            g.check(&format!("ag/t{i}"), [1; 32], &cfg, S);
        }
        g.check("ag/late", [1; 32], &cfg, ttl + S);
        assert_eq!(g.len(), 1);
        // Idle past idle_ttl, a ring is forgotten even where it is still
        // kept: two repeats before the gap and one after are no loop.
        let mut t = TaskState::default();
        t.step([1; 32], &cfg, S);
        t.step([1; 32], &cfg, 2 * S);
        assert_eq!(
            t.step([1; 32], &cfg, cfg.idle_ttl + 2 * S),
            LoopVerdict::Allow
        );
    }

    #[test]
    fn a_twelve_step_task_calling_one_tool_twice_is_not_a_loop() {
        let mut g = Tasks::default();
        let cfg = LoopConfig::default();
        let steps = [1u8, 2, 3, 4, 5, 4, 6, 7, 8, 9, 10, 11];
        for (i, s) in steps.iter().enumerate() {
            assert_eq!(
                g.check("t", [*s; 32], &cfg, S * i as u32),
                LoopVerdict::Allow,
                "step {i}"
            );
        }
    }

    #[test]
    fn trips_on_the_third_repeat_then_cools_down_with_backoff_and_recovers() {
        let mut g = Tasks::default();
        // Never stopped: every trip cools down, doubling.
        let cfg = LoopConfig {
            stop_after_trips: 0,
            ..LoopConfig::default()
        };
        assert_eq!(g.check("t", [7; 32], &cfg, S), LoopVerdict::Allow);
        assert_eq!(g.check("t", [7; 32], &cfg, 2 * S), LoopVerdict::Allow);
        let LoopVerdict::Tripped(trip) = g.check("t", [7; 32], &cfg, 3 * S) else {
            panic!()
        };
        assert_eq!(
            (trip.block_len, trip.trips, trip.cooldown, trip.trail.len()),
            (1, 1, 30 * S, 3)
        );
        assert!(!trip.stopped);
        assert_eq!(
            g.check("t", [8; 32], &cfg, 10 * S),
            LoopVerdict::CoolingDown {
                retry_after: 23 * S
            }
        );
        // Other tasks are unaffected.
        assert_eq!(g.check("u", [7; 32], &cfg, 10 * S), LoopVerdict::Allow);
        // After the cool-down, a trial that repeats the cycle trips at once
        // (what an SDK retrying after Retry-After sends); the cool-down doubles.
        let LoopVerdict::Tripped(trip) = g.check("t", [7; 32], &cfg, 33 * S) else {
            panic!()
        };
        assert_eq!(
            (trip.trips, trip.cooldown, trip.stopped),
            (2, 60 * S, false)
        );
        // After that cool-down, a new call passes, and clear_after clean
        // requests reset the back-off.
        for i in 0..5u8 {
            assert_eq!(
                g.check("t", [20 + i; 32], &cfg, 100 * S),
                LoopVerdict::Allow
            );
        }
        for _ in 0..2 {
            g.check("t", [9; 32], &cfg, 101 * S);
        }
        let LoopVerdict::Tripped(trip) = g.check("t", [9; 32], &cfg, 102 * S) else {
            panic!()
        };
        assert_eq!((trip.trips, trip.cooldown), (1, 30 * S));
    }

    #[test]
    fn a_task_that_loops_again_after_its_cool_down_is_stopped() {
        let mut g = Tasks::default();
        let cfg = LoopConfig::default();
        assert_eq!(cfg.stop_after_trips, 2);
        g.check("t", [7; 32], &cfg, S);
        g.check("t", [7; 32], &cfg, 2 * S);
        let LoopVerdict::Tripped(first) = g.check("t", [7; 32], &cfg, 3 * S) else {
            panic!()
        };
        assert!(!first.stopped);
        // The same call once the cool-down is over: stopped, not slowed.
        let LoopVerdict::Tripped(second) = g.check("t", [7; 32], &cfg, 34 * S) else {
            panic!()
        };
        assert_eq!((second.trips, second.stopped), (2, true));
        // Stopped for every call, however long it waits, until it is idle
        // for idle_ttl; other tasks are unaffected.
        for (fp, at) in [([7; 32], 35 * S), ([8; 32], 40 * S), ([9; 32], 3000 * S)] {
            assert_eq!(g.check("t", fp, &cfg, at), LoopVerdict::Stopped);
        }
        assert_eq!(g.check("u", [7; 32], &cfg, 41 * S), LoopVerdict::Allow);
        assert_eq!(
            g.check("t", [7; 32], &cfg, 3000 * S + cfg.idle_ttl),
            LoopVerdict::Allow
        );
        // A trial after the cool-down that is a new call goes on as before.
        let mut h = Tasks::default();
        for i in 1..=3 {
            h.check("t", [1; 32], &cfg, i * S);
        }
        assert_eq!(h.check("t", [2; 32], &cfg, 40 * S), LoopVerdict::Allow);
        assert_eq!(h.check("t", [3; 32], &cfg, 41 * S), LoopVerdict::Allow);
    }

    #[test]
    fn a_stopped_task_survives_encoding() {
        let cfg = LoopConfig::default();
        let mut t = TaskState::default();
        for i in 0..3 {
            t.step([5; 32], &cfg, i * S);
        }
        t.step([5; 32], &cfg, 40 * S);
        let mut back = TaskState::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.step([6; 32], &cfg, 41 * S), LoopVerdict::Stopped);
    }

    #[test]
    fn task_state_survives_encoding() {
        let cfg = LoopConfig::default();
        let mut t = TaskState::default();
        for (i, fp) in [[1u8; 32], [2; 32], [1; 32], [2; 32]]
            .into_iter()
            .enumerate()
        {
            t.step(fp, &cfg, S * i as u32);
        }
        let mut back = TaskState::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        // The decoded state judges the same: the next [1],[2] completes the loop.
        back.step([1; 32], &cfg, 10 * S);
        assert!(matches!(
            back.step([2; 32], &cfg, 11 * S),
            LoopVerdict::Tripped(_)
        ));
        assert_eq!(TaskState::decode(b"short"), None);
        assert_eq!(TaskState::decode(&[0u8; 25]), None);
    }

    #[test]
    fn backoff_is_capped() {
        let mut g = Tasks::default();
        let cfg = LoopConfig {
            cooldown: 30 * S,
            max_cooldown: 100 * S,
            stop_after_trips: 0,
            ..LoopConfig::default()
        };
        let mut now = Duration::ZERO;
        let mut last = Duration::ZERO;
        let mut trips = 0;
        for _ in 0..15 {
            if let LoopVerdict::Tripped(t) = g.check("t", [1; 32], &cfg, now) {
                trips += 1;
                last = t.cooldown;
                now += t.cooldown;
            }
        }
        // The first trip takes three calls; every later one trips at once
        // when the cool-down ends (30, 60, then capped at 100).
        assert!(trips >= 5, "{trips}");
        assert_eq!(last, 100 * S);
    }
}
