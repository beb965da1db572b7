//! One circuit breaker: closed, open, half-open.
//!
//! - Closed: requests pass. It trips on `consecutive_failures` failures in a
//!   row, or when, over the last `window`, at least `min_requests` outcomes
//!   were seen and the failure rate reached `failure_rate` (or the timeout
//!   rate reached `timeout_rate`), whichever comes first.
//! - Open: every request is rejected at once with the time left until
//!   half-open. The open time doubles with each consecutive trip
//!   (`open_for`, 2x, 4x ... up to `max_open_for`); the count of consecutive
//!   trips resets once the breaker stayed closed for `healthy_after`.
//! - Half-open: at most `half_open_probes` requests at a time are let
//!   through; a success closes the breaker, a failure opens it again. With
//!   `active_probe`, live traffic is never the probe: it stays rejected while
//!   the gateway sends its own read-only probe (see [`Breaker::start_probe`]).
//!
//! Failures are 5xx, 429, connect errors, timeouts and streams that break;
//! any other answer from the upstream (2xx-4xx) is a success for the
//! breaker. Requests the gateway itself denied never reach a breaker.

use std::collections::VecDeque;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub timeout_rate: f64,
    pub min_requests: u32,
    pub window: Duration,
    pub open_for: Duration,
    pub max_open_for: Duration,
    pub half_open_probes: u32,
    pub healthy_after: Duration,
    /// Half-open is tested only by the gateway's own probe request.
    pub active_probe: bool,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            timeout_rate: 0.5,
            min_requests: 10,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(600),
            half_open_probes: 1,
            healthy_after: Duration::from_secs(300),
            active_probe: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A 5xx answer.
    ServerError,
    /// A 429 answer.
    RateLimited,
    /// No connection (refused, unreachable, TLS).
    Connect,
    /// No answer in time (first byte or total).
    Timeout,
    /// The response started and then broke or stalled.
    StreamBroken,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::ServerError => "server_error",
            FailureKind::RateLimited => "rate_limited",
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::StreamBroken => "stream_broken",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure(FailureKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// Permission to send one request; report its outcome exactly once
/// ([`Breaker::record`]) or give it back ([`Breaker::abandon`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Ticket {
    pub probe: bool,
    /// Which opening of the breaker this ticket belongs to, so that a late
    /// outcome from before a trip cannot close a breaker opened since.
    generation: u64,
}

/// The breaker refused: try again after `retry_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    pub retry_after: Duration,
}

/// A state change, for logs and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub reason: String,
    /// With `to == Open`: for how long.
    pub open_for: Option<Duration>,
}

impl std::fmt::Display for Transition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} ({}",
            self.from.as_str(),
            self.to.as_str(),
            self.reason
        )?;
        if let Some(d) = self.open_for {
            write!(f, ", open for {} s", d.as_secs_f64())?;
        }
        f.write_str(")")
    }
}

/// What an operator sees of a breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: State,
    pub consecutive_failures: u32,
    pub window_requests: u32,
    pub window_failures: u32,
    pub window_timeouts: u32,
    /// Time left until half-open, when open.
    pub open_remaining: Option<Duration>,
    pub trips: u32,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    failure: bool,
    timeout: bool,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: State,
    consecutive: u32,
    samples: VecDeque<Sample>,
    failures: u32,
    timeouts: u32,
    open_until: Duration,
    /// Consecutive trips, for the backoff.
    trips: u32,
    closed_since: Duration,
    probes_in_flight: u32,
    generation: u64,
}

/// Bound on remembered outcomes; the window also bounds them by time.
const MAX_SAMPLES: usize = 4096;

impl Breaker {
    pub fn new(cfg: BreakerConfig, now: Duration) -> Breaker {
        Breaker {
            cfg,
            state: State::Closed,
            consecutive: 0,
            samples: VecDeque::new(),
            failures: 0,
            timeouts: 0,
            open_until: Duration::ZERO,
            trips: 0,
            closed_since: now,
            probes_in_flight: 0,
            generation: 0,
        }
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Applies a new config (reload) without losing the state.
    pub fn reconfigure(&mut self, cfg: BreakerConfig) {
        self.cfg = cfg;
    }

    /// The state at `now` (an expired open period reads as half-open).
    pub fn state(&mut self, now: Duration) -> State {
        self.advance(now);
        self.state
    }

    /// The state at `now` without applying the open -> half-open change, so
    /// that the caller who acts on it (acquire) is the one to report it.
    pub fn state_at(&self, now: Duration) -> State {
        if self.state == State::Open && now >= self.open_until {
            State::HalfOpen
        } else {
            self.state
        }
    }

    /// When open at `now`: until when.
    pub fn open_until_at(&self, now: Duration) -> Option<Duration> {
        (self.state == State::Open && now < self.open_until).then_some(self.open_until)
    }

    fn advance(&mut self, now: Duration) -> Option<Transition> {
        if self.state == State::Open && now >= self.open_until {
            self.state = State::HalfOpen;
            self.probes_in_flight = 0;
            return Some(Transition {
                from: State::Open,
                to: State::HalfOpen,
                reason: "open period over".into(),
                open_for: None,
            });
        }
        None
    }

    /// Asks to send one live request.
    pub fn try_acquire(&mut self, now: Duration) -> (Result<Ticket, Rejected>, Option<Transition>) {
        let t = self.advance(now);
        let r = match self.state {
            State::Closed => Ok(Ticket {
                probe: false,
                generation: self.generation,
            }),
            State::Open => Err(Rejected {
                retry_after: self.open_until - now,
            }),
            State::HalfOpen => {
                if !self.cfg.active_probe && self.probes_in_flight < self.cfg.half_open_probes {
                    self.probes_in_flight += 1;
                    Ok(Ticket {
                        probe: true,
                        generation: self.generation,
                    })
                } else {
                    // A probe is under way; its result decides soon.
                    Err(Rejected {
                        retry_after: Duration::from_secs(1),
                    })
                }
            }
        };
        (r, t)
    }

    /// With `active_probe`: whether the gateway should send its probe now.
    /// Marks the probe in flight; report it with [`Breaker::record`].
    pub fn start_probe(&mut self, now: Duration) -> (Option<Ticket>, Option<Transition>) {
        let t = self.advance(now);
        if self.state == State::HalfOpen && self.probes_in_flight == 0 {
            self.probes_in_flight = 1;
            return (
                Some(Ticket {
                    probe: true,
                    generation: self.generation,
                }),
                t,
            );
        }
        (None, t)
    }

    /// Gives back a ticket whose request never produced an outcome (the
    /// client went away, or the gateway chose not to send it).
    pub fn abandon(&mut self, ticket: Ticket) {
        if ticket.probe && ticket.generation == self.generation && self.probes_in_flight > 0 {
            self.probes_in_flight -= 1;
        }
    }

    /// Reports the outcome of a ticket.
    pub fn record(
        &mut self,
        now: Duration,
        ticket: Ticket,
        outcome: Outcome,
    ) -> Option<Transition> {
        self.advance(now);
        if ticket.generation != self.generation {
            // The breaker tripped (or was reset) since this ticket was issued:
            // its outcome belongs to a past period.
            return None;
        }
        match self.state {
            State::HalfOpen if ticket.probe => {
                self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
                match outcome {
                    Outcome::Success => Some(self.close(now, "probe succeeded")),
                    Outcome::Failure(kind) => {
                        Some(self.trip(now, format!("probe failed ({})", kind.as_str())))
                    }
                }
            }
            State::Closed => {
                self.push(now, outcome);
                match outcome {
                    Outcome::Success => {
                        self.consecutive = 0;
                        None
                    }
                    Outcome::Failure(_) => {
                        self.consecutive += 1;
                        self.should_trip().map(|reason| self.trip(now, reason))
                    }
                }
            }
            // Late results of live requests while open or half-open: the
            // probe decides, not these.
            _ => None,
        }
    }

    /// Opens the breaker for at least `duration` (a provider's 429 with
    /// `Retry-After` takes it out of rotation that long).
    pub fn hold_open(
        &mut self,
        now: Duration,
        duration: Duration,
        reason: &str,
    ) -> Option<Transition> {
        let until = now + duration;
        if self.state == State::Open && self.open_until >= until {
            return None;
        }
        let from = self.state;
        self.state = State::Open;
        self.open_until = until;
        self.generation += 1;
        self.probes_in_flight = 0;
        Some(Transition {
            from,
            to: State::Open,
            reason: reason.to_string(),
            open_for: Some(duration),
        })
    }

    /// Operator reset: closed, counts cleared, backoff forgotten.
    pub fn reset(&mut self, now: Duration) -> Option<Transition> {
        self.trips = 0;
        if self.state == State::Closed {
            self.clear_window();
            return None;
        }
        Some(self.close(now, "reset by operator"))
    }

    pub fn snapshot(&mut self, now: Duration) -> Snapshot {
        self.advance(now);
        self.expire(now);
        Snapshot {
            state: self.state,
            consecutive_failures: self.consecutive,
            window_requests: self.samples.len() as u32,
            window_failures: self.failures,
            window_timeouts: self.timeouts,
            open_remaining: (self.state == State::Open)
                .then(|| self.open_until.saturating_sub(now)),
            trips: self.trips,
        }
    }

    fn should_trip(&self) -> Option<String> {
        if self.consecutive >= self.cfg.consecutive_failures {
            return Some(format!("{} consecutive failures", self.consecutive));
        }
        let n = self.samples.len() as u32;
        if n >= self.cfg.min_requests && n > 0 {
            let rate = self.failures as f64 / n as f64;
            if rate >= self.cfg.failure_rate {
                return Some(format!(
                    "failure rate {:.0}% over {} requests",
                    rate * 100.0,
                    n
                ));
            }
            let trate = self.timeouts as f64 / n as f64;
            if trate >= self.cfg.timeout_rate {
                return Some(format!(
                    "timeout rate {:.0}% over {} requests",
                    trate * 100.0,
                    n
                ));
            }
        }
        None
    }

    fn trip(&mut self, now: Duration, reason: String) -> Transition {
        let from = self.state;
        if from == State::Closed && now.saturating_sub(self.closed_since) >= self.cfg.healthy_after
        {
            self.trips = 0;
        }
        self.trips += 1;
        let factor = 1u32.checked_shl(self.trips - 1).unwrap_or(u32::MAX);
        let open_for = self
            .cfg
            .open_for
            .checked_mul(factor)
            .unwrap_or(self.cfg.max_open_for)
            .min(self.cfg.max_open_for);
        self.state = State::Open;
        self.open_until = now + open_for;
        self.generation += 1;
        self.probes_in_flight = 0;
        Transition {
            from,
            to: State::Open,
            reason,
            open_for: Some(open_for),
        }
    }

    fn close(&mut self, now: Duration, reason: &str) -> Transition {
        let from = self.state;
        self.state = State::Closed;
        self.closed_since = now;
        self.generation += 1;
        self.probes_in_flight = 0;
        self.clear_window();
        Transition {
            from,
            to: State::Closed,
            reason: reason.into(),
            open_for: None,
        }
    }

    fn clear_window(&mut self) {
        self.consecutive = 0;
        self.samples.clear();
        self.failures = 0;
        self.timeouts = 0;
    }

    fn push(&mut self, now: Duration, outcome: Outcome) {
        self.expire(now);
        if self.samples.len() == MAX_SAMPLES {
            self.pop();
        }
        let (failure, timeout) = match outcome {
            Outcome::Success => (false, false),
            Outcome::Failure(k) => (true, k == FailureKind::Timeout),
        };
        self.failures += failure as u32;
        self.timeouts += timeout as u32;
        self.samples.push_back(Sample {
            at: now,
            failure,
            timeout,
        });
    }

    fn expire(&mut self, now: Duration) {
        while self
            .samples
            .front()
            .is_some_and(|s| s.at + self.cfg.window <= now)
        {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some(s) = self.samples.pop_front() {
            self.failures -= s.failure as u32;
            self.timeouts -= s.timeout as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 3,
            failure_rate: 0.5,
            timeout_rate: 0.3,
            min_requests: 10,
            window: 30 * S,
            open_for: 30 * S,
            max_open_for: 120 * S,
            half_open_probes: 1,
            healthy_after: 300 * S,
            active_probe: false,
        }
    }

    fn fail(b: &mut Breaker, now: Duration, kind: FailureKind) -> Option<Transition> {
        let (t, _) = b.try_acquire(now);
        b.record(now, t.expect("admitted"), Outcome::Failure(kind))
    }

    fn ok(b: &mut Breaker, now: Duration) -> Option<Transition> {
        let (t, _) = b.try_acquire(now);
        b.record(now, t.expect("admitted"), Outcome::Success)
    }

    #[test]
    fn consecutive_failures_trip_and_open_rejects_with_time_left() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        assert!(fail(&mut b, S, FailureKind::ServerError).is_none());
        assert!(fail(&mut b, S, FailureKind::Connect).is_none());
        let t = fail(&mut b, 2 * S, FailureKind::RateLimited).unwrap();
        assert_eq!(
            (t.from, t.to, t.open_for),
            (State::Closed, State::Open, Some(30 * S))
        );
        assert_eq!(t.reason, "3 consecutive failures");
        assert_eq!(
            b.try_acquire(12 * S).0,
            Err(Rejected {
                retry_after: 20 * S
            })
        );
        assert_eq!(b.state(31 * S), State::Open);
        assert_eq!(b.state(32 * S), State::HalfOpen);
    }

    #[test]
    fn a_success_resets_the_consecutive_count() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        fail(&mut b, S, FailureKind::ServerError);
        fail(&mut b, S, FailureKind::ServerError);
        ok(&mut b, S);
        fail(&mut b, S, FailureKind::ServerError);
        fail(&mut b, S, FailureKind::ServerError);
        assert_eq!(b.state(S), State::Closed);
    }

    #[test]
    fn failure_rate_over_the_window_trips() {
        let mut c = cfg();
        c.consecutive_failures = 100;
        let mut b = Breaker::new(c, Duration::ZERO);
        // Alternate: never 3 in a row, but 50% over 10 requests.
        for i in 0..9 {
            if i % 2 == 0 {
                assert!(fail(&mut b, S, FailureKind::ServerError).is_none());
            } else {
                ok(&mut b, S);
            }
        }
        let t = ok(&mut b, S);
        assert!(
            t.is_none(),
            "9 outcomes are below min_requests; 10th is a success: 5/10"
        );
        let t = fail(&mut b, S, FailureKind::ServerError).unwrap();
        assert!(t.reason.starts_with("failure rate 55%"), "{}", t.reason);
    }

    #[test]
    fn old_outcomes_leave_the_window() {
        let mut c = cfg();
        c.consecutive_failures = 100;
        let mut b = Breaker::new(c, Duration::ZERO);
        for _ in 0..6 {
            fail(&mut b, S, FailureKind::ServerError);
            ok(&mut b, S);
            ok(&mut b, S);
        }
        assert_eq!(b.snapshot(S).window_failures, 6);
        // 40 s later the 18 old outcomes are gone: 1 failure of 1 is below min_requests.
        assert!(fail(&mut b, 40 * S, FailureKind::ServerError).is_none());
        assert_eq!(b.snapshot(40 * S).window_requests, 1);
    }

    #[test]
    fn timeout_rate_trips_on_its_own_threshold() {
        let mut c = cfg();
        c.consecutive_failures = 100;
        let mut b = Breaker::new(c, Duration::ZERO);
        for _ in 0..7 {
            ok(&mut b, S);
        }
        fail(&mut b, S, FailureKind::Timeout);
        fail(&mut b, S, FailureKind::Timeout);
        let t = fail(&mut b, S, FailureKind::Timeout).unwrap();
        assert!(t.reason.starts_with("timeout rate 30%"), "{}", t.reason);
    }

    #[test]
    fn half_open_admits_one_probe_and_success_closes() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, S, FailureKind::ServerError);
        }
        let (probe, t) = b.try_acquire(31 * S);
        assert_eq!(t.unwrap().to, State::HalfOpen);
        let probe = probe.unwrap();
        assert!(probe.probe);
        assert!(b.try_acquire(31 * S).0.is_err(), "only one probe at a time");
        let t = b.record(32 * S, probe, Outcome::Success).unwrap();
        assert_eq!((t.from, t.to), (State::HalfOpen, State::Closed));
        assert!(b.try_acquire(32 * S).0.is_ok());
    }

    #[test]
    fn failed_probes_back_off_exponentially_up_to_the_max() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, Duration::ZERO, FailureKind::ServerError);
        }
        let mut now = Duration::ZERO;
        let mut opens = vec![];
        for open in [30, 60, 120, 120] {
            now += open * S;
            let (probe, _) = b.try_acquire(now);
            let t = b
                .record(now, probe.unwrap(), Outcome::Failure(FailureKind::Timeout))
                .unwrap();
            assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
            opens.push(t.open_for.unwrap().as_secs());
        }
        assert_eq!(opens, [60, 120, 120, 120]);
    }

    #[test]
    fn backoff_resets_after_a_healthy_period() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, Duration::ZERO, FailureKind::ServerError);
        }
        let (p, _) = b.try_acquire(30 * S);
        b.record(30 * S, p.unwrap(), Outcome::Success);
        // Trips again soon: doubled.
        for _ in 0..3 {
            fail(&mut b, 40 * S, FailureKind::ServerError);
        }
        assert_eq!(b.snapshot(40 * S).trips, 2);
        let (p, _) = b.try_acquire(100 * S);
        b.record(100 * S, p.unwrap(), Outcome::Success);
        // Healthy for 300 s: the next trip starts from 30 s again.
        let mut last = None;
        for _ in 0..3 {
            last = fail(&mut b, 401 * S, FailureKind::ServerError);
        }
        assert_eq!(last.unwrap().open_for, Some(30 * S));
    }

    #[test]
    fn abandoned_probe_frees_the_slot_and_stale_tickets_are_ignored() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        let (old, _) = b.try_acquire(Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, Duration::ZERO, FailureKind::ServerError);
        }
        let (probe, _) = b.try_acquire(30 * S);
        b.abandon(probe.unwrap());
        let (probe, _) = b.try_acquire(30 * S);
        assert!(probe.is_ok(), "the abandoned probe's slot came back");
        // A success from before the trip does not close the breaker.
        assert!(b.record(30 * S, old.unwrap(), Outcome::Success).is_none());
        assert_eq!(b.state(30 * S), State::HalfOpen);
    }

    #[test]
    fn active_probe_keeps_live_traffic_out_of_half_open() {
        let mut c = cfg();
        c.active_probe = true;
        let mut b = Breaker::new(c, Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, Duration::ZERO, FailureKind::ServerError);
        }
        assert!(b.start_probe(10 * S).0.is_none(), "still open");
        assert!(
            b.try_acquire(31 * S).0.is_err(),
            "live traffic is never the probe"
        );
        let (probe, _) = b.start_probe(31 * S);
        let probe = probe.unwrap();
        assert!(b.start_probe(31 * S).0.is_none(), "one probe at a time");
        assert_eq!(
            b.record(32 * S, probe, Outcome::Success).unwrap().to,
            State::Closed
        );
    }

    #[test]
    fn hold_open_takes_the_target_out_for_retry_after() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        let t = b
            .hold_open(S, 7 * S, "provider 429 with Retry-After: 7")
            .unwrap();
        assert_eq!((t.to, t.open_for), (State::Open, Some(7 * S)));
        assert_eq!(b.try_acquire(3 * S).0, Err(Rejected { retry_after: 5 * S }));
        assert!(b.hold_open(2 * S, S, "shorter").is_none(), "never shortens");
        assert_eq!(b.state(8 * S), State::HalfOpen);
    }

    #[test]
    fn reset_closes_and_forgets() {
        let mut b = Breaker::new(cfg(), Duration::ZERO);
        for _ in 0..3 {
            fail(&mut b, Duration::ZERO, FailureKind::ServerError);
        }
        assert_eq!(b.reset(S).unwrap().to, State::Closed);
        let s = b.snapshot(S);
        assert_eq!(
            (s.state, s.trips, s.consecutive_failures),
            (State::Closed, 0, 0)
        );
    }

    proptest::proptest! {
        /// Whatever happens, an open breaker never lets a live request
        /// through, and a half-open one never more than the probe limit.
        #[test]
        fn never_admits_while_open_or_beyond_probes(
            events in proptest::collection::vec((0u64..5_000, 0u8..4), 1..300),
        ) {
            let mut b = Breaker::new(cfg(), Duration::ZERO);
            let mut now = Duration::ZERO;
            let mut outstanding: Vec<Ticket> = vec![];
            for (gap, ev) in events {
                now += Duration::from_millis(gap);
                let before = b.state(now);
                match ev {
                    0 | 1 => {
                        let (t, _) = b.try_acquire(now);
                        if let Ok(t) = t {
                            proptest::prop_assert!(before != State::Open);
                            outstanding.push(t);
                        }
                        let probes = outstanding.iter().filter(|t| t.probe && t.generation == b.generation).count();
                        proptest::prop_assert!(probes as u32 <= b.cfg.half_open_probes);
                    }
                    2 => if let Some(t) = outstanding.pop() {
                        b.record(now, t, Outcome::Failure(FailureKind::ServerError));
                    },
                    _ => if let Some(t) = outstanding.pop() {
                        b.record(now, t, Outcome::Success);
                    },
                }
            }
        }
    }
}
