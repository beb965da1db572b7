//! The [`StateStore`] conformance suite: what every store implementation
//! (the embedded memory store, Redis) must do, written once and run against
//! each of them (feature `conformance`), so the two can never drift apart.
//!
//! Every check takes a fresh key `prefix` (a networked store may hold keys
//! from earlier runs) and a base time `t0`; time moves only through the
//! `now` argument, so stores must judge by it, not by their own clocks.

use crate::clock::ManualClock;
use crate::store::{
    slice_end, slice_of, step_record, window_sums, AdmitOutcome, IdemBegin, IdemOutcome,
    IdemRecord, Refusal, SlotTake, StateStore, WindowTake, MAX_COST, MAX_SUM,
};
use crate::streak::{Streak, IDLE};
use std::sync::Arc;
use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);
const MS: Duration = Duration::from_millis(1);

fn window(key: String, limit: u64, cost: u64) -> WindowTake {
    WindowTake {
        key: key.into(),
        limit,
        window: MIN,
        cost,
        enforce: true,
    }
}

fn slot(key: String, limit: u64) -> SlotTake {
    SlotTake {
        key: key.into(),
        limit,
        enforce: true,
    }
}

async fn taken(store: &dyn StateStore, now: Duration, w: &[WindowTake], s: &[SlotTake]) -> bool {
    matches!(
        store.admit(now, w, s).await.expect("store answers"),
        AdmitOutcome::Taken { .. }
    )
}

/// Runs every check in turn; panics (with the check's name) on the first
/// violation.
pub async fn run_all(store: Arc<dyn StateStore>, prefix: &str, t0: Duration) {
    windows_admit_up_to_the_limit_and_say_when(&*store, &format!("{prefix}w1:"), t0).await;
    all_or_nothing(&*store, &format!("{prefix}w2:"), t0).await;
    a_cost_above_the_limit_never_fits(&*store, &format!("{prefix}w3:"), t0).await;
    dry_run_takes_and_reports(&*store, &format!("{prefix}w4:"), t0).await;
    slots_are_held_until_released(&*store, &format!("{prefix}s1:"), t0).await;
    settle_replaces_the_estimate(&*store, &format!("{prefix}w5:"), t0).await;
    a_busy_budget_settles_each_lease_once(&*store, &format!("{prefix}w6:"), t0).await;
    money_windows_settle_down_and_up(&*store, &format!("{prefix}m1:"), t0).await;
    absurd_costs_are_clamped_and_never_go_back(&*store, &format!("{prefix}m2:"), t0).await;
    idempotency_records(&*store, &format!("{prefix}i1:"), t0).await;
    concurrent_admissions_never_exceed(store.clone(), &format!("{prefix}c1:"), t0).await;
    records_swap_only_from_the_version_read(&*store, &format!("{prefix}r1:"), t0).await;
    streaks_count_every_failure_once(&*store, &format!("{prefix}r2:"), t0).await;
}

/// One answer of a task's tool, stepped into its streak record as the
/// gateway does it; whether it isolated the tool.
async fn streak_answer(
    store: &dyn StateStore,
    clock: &ManualClock,
    key: &str,
    failure: Option<u64>,
    threshold: u32,
    cooldown: Duration,
) -> bool {
    let step = |s, now| {
        let (next, isolated) = Streak::step(s, failure, threshold, cooldown, now);
        (next.map(|s| s.encode()), isolated)
    };
    let ttl = Streak::ttl(cooldown);
    step_record(store, clock, key, ttl, Streak::decode, step)
        .await
        .expect("store answers")
}

async fn streak_of(store: &dyn StateStore, key: &str, now: Duration) -> Option<Streak> {
    let record = store.record_get(now, key).await.expect("store answers");
    record.and_then(|(_, bytes)| Streak::decode(&bytes))
}

/// Tool failure streaks stepped through the store as replicas step them:
/// concurrent failures of one task's tool each count once, so the row
/// isolates at exactly its threshold and every reader sees it; a success
/// without a streak writes nothing; a streak is kept for its TTL, and an
/// isolation longer than the idle time for all of it.
pub async fn streaks_count_every_failure_once(store: &dyn StateStore, p: &str, t0: Duration) {
    // Each writer loses at most one race to each other: within STEP_TRIES.
    const WRITERS: u32 = 5;
    let cooldown = Duration::from_secs(30);
    let clock = ManualClock::default();
    clock.set(t0);
    let key = format!("{p}streak:ag/t1/tool");
    let answers = (0..WRITERS)
        .map(|_| streak_answer(store, &clock, &key, Some(503), WRITERS, cooldown))
        .collect();
    let isolated = join_all(answers).await;
    assert_eq!(
        isolated.iter().filter(|i| **i).count(),
        1,
        "the threshold-th failure isolates, once: {isolated:?}"
    );
    let streak = streak_of(store, &key, t0).await.expect("written");
    assert_eq!(streak.isolated(t0), Some(cooldown));
    // Another tool, another task: no streak at all.
    assert_eq!(
        streak_of(store, &format!("{p}streak:ag/t1/other"), t0).await,
        None
    );
    let fresh = format!("{p}streak:ag/t2/tool");
    assert!(!streak_answer(store, &clock, &fresh, None, WRITERS, cooldown).await);
    assert_eq!(
        store.record_get(t0, &fresh).await.unwrap(),
        None,
        "no write"
    );
    // After the cool-down the row starts again from one.
    let later = t0 + cooldown;
    clock.set(later);
    assert_eq!(
        streak_of(store, &key, later).await.unwrap().isolated(later),
        None
    );
    assert!(!streak_answer(store, &clock, &key, Some(503), WRITERS, cooldown).await);
    assert_eq!(streak_of(store, &key, later).await.unwrap().count(), 1);
    // Idle for the TTL: forgotten.
    assert_eq!(Streak::ttl(cooldown), IDLE);
    assert_eq!(streak_of(store, &key, later + IDLE).await, None);
    // An isolation longer than the idle time is kept through it.
    let held = format!("{p}streak:ag/t3/tool");
    let long = 2 * IDLE;
    assert!(streak_answer(store, &clock, &held, Some(500), 1, long).await);
    let past_idle = later + IDLE + Duration::from_secs(1);
    let streak = streak_of(store, &held, past_idle).await.expect("kept");
    assert_eq!(
        streak.isolated(past_idle),
        Some(IDLE - Duration::from_secs(1))
    );
    assert_eq!(streak_of(store, &held, later + long).await, None);
}

/// Versioned records: a swap from a stale version fails, expiry forgets.
pub async fn records_swap_only_from_the_version_read(
    store: &dyn StateStore,
    p: &str,
    t0: Duration,
) {
    let key = format!("{p}task");
    let ttl = Duration::from_secs(60);
    assert_eq!(store.record_get(t0, &key).await.unwrap(), None);
    assert!(store
        .record_swap(t0, &key, None, b"one".to_vec(), ttl)
        .await
        .unwrap());
    // A second creator lost the race.
    assert!(!store
        .record_swap(t0, &key, None, b"two".to_vec(), ttl)
        .await
        .unwrap());
    let (v, value) = store.record_get(t0, &key).await.unwrap().unwrap();
    assert_eq!(value, b"one");
    assert!(store
        .record_swap(t0, &key, Some(v), b"\x00\xff".to_vec(), ttl)
        .await
        .unwrap());
    // The old version is stale now.
    assert!(!store
        .record_swap(t0, &key, Some(v), b"x".to_vec(), ttl)
        .await
        .unwrap());
    let (v2, value) = store.record_get(t0, &key).await.unwrap().unwrap();
    assert_ne!(v2, v);
    assert_eq!(value, b"\x00\xff");
    // Gone after its TTL, and creatable again.
    assert_eq!(store.record_get(t0 + ttl, &key).await.unwrap(), None);
    assert!(store
        .record_swap(t0 + ttl, &key, None, b"new".to_vec(), ttl)
        .await
        .unwrap());
}

/// N fit in a window, the N+1st is refused with the exact wait (until the
/// oldest admission's slice has aged out), and fits exactly then.
pub async fn windows_admit_up_to_the_limit_and_say_when(
    store: &dyn StateStore,
    p: &str,
    t0: Duration,
) {
    let w = [window(format!("{p}rpm"), 3, 1)];
    for i in 0..3u64 {
        let out = store
            .admit(t0 + MS * (i as u32) * 1000, &w, &[])
            .await
            .unwrap();
        let AdmitOutcome::Taken { remaining, .. } = out else {
            panic!("windows: request {i} of 3 refused: {out:?}");
        };
        assert_eq!(remaining, vec![2 - i], "windows: remaining after {i}");
    }
    let now = t0 + 2500 * MS;
    let leaves = slice_end(t0, MIN) + MIN;
    let out = store.admit(now, &w, &[]).await.unwrap();
    assert_eq!(
        out,
        AdmitOutcome::Refused(Refusal::Window {
            index: 0,
            retry_after: Some(leaves - now)
        }),
        "windows: the 4th waits until the first ages out"
    );
    assert!(
        leaves - t0 > MIN && leaves - t0 <= MIN + slice_of(MIN),
        "windows: at most one slice (100 ms) past the exact time"
    );
    // One millisecond early: still full; exactly then: fits.
    assert!(!taken(store, leaves - MS, &w, &[]).await, "windows: early");
    assert!(taken(store, leaves, &w, &[]).await, "windows: on time");
}

/// A busy window does not keep one entry per admission: after a day's worth
/// of admissions (one a minute) the wait it reports still reaches back at
/// most a day and a slice, and finished leases cannot be settled again.
pub async fn a_busy_budget_settles_each_lease_once(store: &dyn StateStore, p: &str, t0: Duration) {
    let key = format!("{p}day");
    let day = Duration::from_secs(86_400);
    let take = |cost| WindowTake {
        window: day,
        ..window(key.clone(), 10_000, cost)
    };
    let mut last = None;
    for i in 0..1440u32 {
        let now = t0 + MIN * i;
        let AdmitOutcome::Taken { lease, .. } = store.admit(now, &[take(6)], &[]).await.unwrap()
        else {
            panic!("busy: refused at {i}");
        };
        store
            .finish(now, &lease, &[(key.as_str(), 5)])
            .await
            .unwrap();
        last = Some(lease);
    }
    // 1,440 x 5 = 7,200 of 10,000; a settle of a finished lease changes nothing.
    let now = t0 + MIN * 1440;
    store
        .settle(now, last.as_ref().unwrap(), &key, 0)
        .await
        .unwrap();
    let out = store.admit(now, &[take(2_800)], &[]).await.unwrap();
    let AdmitOutcome::Taken { remaining, .. } = out else {
        panic!("busy: 7,200 + 2,800 of 10,000 refused: {out:?}");
    };
    assert_eq!(remaining, vec![0]);
    // Full: 5 more fit once the first admission's slice has aged out.
    let out = store.admit(now, &[take(5)], &[]).await.unwrap();
    let leaves = slice_end(t0, day) + day;
    assert_eq!(
        out,
        AdmitOutcome::Refused(Refusal::Window {
            index: 0,
            retry_after: Some(leaves - now)
        }),
        "busy: waits for the oldest slice"
    );
}

/// A refusal by one limit takes nothing from the others.
pub async fn all_or_nothing(store: &dyn StateStore, p: &str, t0: Duration) {
    let roomy = window(format!("{p}roomy"), 10, 1);
    let full = window(format!("{p}full"), 1, 1);
    assert!(taken(store, t0, std::slice::from_ref(&full), &[]).await);
    for _ in 0..5 {
        assert!(!taken(store, t0, &[roomy.clone(), full.clone()], &[]).await);
    }
    let out = store.admit(t0, &[roomy], &[]).await.unwrap();
    let AdmitOutcome::Taken { remaining, .. } = out else {
        panic!("all_or_nothing: refused {out:?}");
    };
    assert_eq!(remaining, vec![9], "all_or_nothing: refusals took nothing");
    // Slots too: a full slot refuses, and the window is not taken.
    let s = slot(format!("{p}slot"), 1);
    let w = window(format!("{p}w"), 2, 1);
    assert!(taken(store, t0, &[], std::slice::from_ref(&s)).await);
    assert_eq!(
        store
            .admit(t0, std::slice::from_ref(&w), &[s])
            .await
            .unwrap(),
        AdmitOutcome::Refused(Refusal::Slot { index: 0 })
    );
    let AdmitOutcome::Taken { remaining, .. } = store.admit(t0, &[w], &[]).await.unwrap() else {
        panic!("all_or_nothing: window refused");
    };
    assert_eq!(remaining, vec![1]);
}

pub async fn a_cost_above_the_limit_never_fits(store: &dyn StateStore, p: &str, t0: Duration) {
    let out = store
        .admit(t0, &[window(format!("{p}tpm"), 100, 101)], &[])
        .await
        .unwrap();
    assert_eq!(
        out,
        AdmitOutcome::Refused(Refusal::Window {
            index: 0,
            retry_after: None
        })
    );
}

pub async fn dry_run_takes_and_reports(store: &dyn StateStore, p: &str, t0: Duration) {
    let mut w = window(format!("{p}dry"), 1, 1);
    w.enforce = false;
    assert!(taken(store, t0, &[w.clone()], &[]).await);
    let out = store.admit(t0, &[w], &[]).await.unwrap();
    let AdmitOutcome::Taken {
        would_refuse,
        remaining,
        ..
    } = out
    else {
        panic!("dry run refused: {out:?}");
    };
    assert!(
        matches!(would_refuse, Some(Refusal::Window { index: 0, .. })),
        "dry run reports {would_refuse:?}"
    );
    assert_eq!(remaining, vec![0]);
    let mut s = slot(format!("{p}dryslot"), 1);
    s.enforce = false;
    assert!(taken(store, t0, &[], &[s.clone()]).await);
    let AdmitOutcome::Taken { would_refuse, .. } = store.admit(t0, &[], &[s]).await.unwrap() else {
        panic!("dry-run slot refused");
    };
    assert_eq!(would_refuse, Some(Refusal::Slot { index: 0 }));
}

pub async fn slots_are_held_until_released(store: &dyn StateStore, p: &str, t0: Duration) {
    let s = [slot(format!("{p}inflight"), 2)];
    let a = store.admit(t0, &[], &s).await.unwrap();
    let b = store.admit(t0, &[], &s).await.unwrap();
    let (AdmitOutcome::Taken { lease: la, .. }, AdmitOutcome::Taken { lease: lb, .. }) = (a, b)
    else {
        panic!("slots: two of two refused");
    };
    assert_ne!(la.id, lb.id, "slots: lease ids are unique");
    assert!(!taken(store, t0, &[], &s).await, "slots: third refused");
    store.release(&la).await.unwrap();
    let c = store.admit(t0, &[], &s).await.unwrap();
    assert!(matches!(c, AdmitOutcome::Taken { .. }), "slots: freed");
    assert!(!taken(store, t0, &[], &s).await, "slots: full again");
    store.release(&lb).await.unwrap();
    assert!(taken(store, t0, &[], &s).await);
}

/// Money budgets are windows in micro-dollars (large numbers) over a day
/// and 30 days: a call settles down to what it cost, or up past its
/// reservation (and past the limit) when the answer cost more; then
/// nothing fits until the month's slice leaves, and the store says when.
pub async fn money_windows_settle_down_and_up(store: &dyn StateStore, p: &str, t0: Duration) {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    const MONTH: Duration = Duration::from_secs(30 * 24 * 3600);
    let (day, month) = (format!("{p}usd:day"), format!("{p}usd:month"));
    // $5,000 a day, $40,000 a month, in micro-dollars.
    let takes = |cost: u64| {
        [
            WindowTake {
                key: day.clone().into(),
                limit: 5_000_000_000,
                window: DAY,
                cost,
                enforce: true,
            },
            WindowTake {
                key: month.clone().into(),
                limit: 40_000_000_000,
                window: MONTH,
                cost,
                enforce: true,
            },
        ]
    };
    let AdmitOutcome::Taken {
        lease, remaining, ..
    } = store.admit(t0, &takes(3_000_000_000), &[]).await.unwrap()
    else {
        panic!("money: refused");
    };
    assert_eq!(remaining, vec![2_000_000_000, 37_000_000_000]);
    // Settled down: $3,000 reserved, $1,234.567891 spent.
    store
        .finish(
            t0,
            &lease,
            &[
                (day.as_str(), 1_234_567_891),
                (month.as_str(), 1_234_567_891),
            ],
        )
        .await
        .unwrap();
    let AdmitOutcome::Taken {
        lease, remaining, ..
    } = store.admit(t0, &takes(3_000_000_000), &[]).await.unwrap()
    else {
        panic!("money: the refund did not free room");
    };
    assert_eq!(remaining, vec![765_432_109, 35_765_432_109]);
    // Settled up: the answer cost $39,000, more than reserved and than the
    // day allows; the windows hold it all.
    store
        .finish(
            t0,
            &lease,
            &[
                (day.as_str(), 39_000_000_000),
                (month.as_str(), 39_000_000_000),
            ],
        )
        .await
        .unwrap();
    let out = store.admit(t0, &takes(1), &[]).await.unwrap();
    let AdmitOutcome::Refused(Refusal::Window {
        index: 0,
        retry_after: Some(after),
    }) = out
    else {
        panic!("money: over the day after settling up: {out:?}");
    };
    assert_eq!(after, slice_end(t0, DAY) + DAY - t0, "money: the day frees");
    // A day later the month is still full, until its slice leaves.
    let later = slice_end(t0, DAY) + DAY;
    let out = store
        .admit(later, &takes(1_000_000_000), &[])
        .await
        .unwrap();
    let AdmitOutcome::Refused(Refusal::Window {
        index: 1,
        retry_after: Some(after),
    }) = out
    else {
        panic!("money: the month still holds it: {out:?}");
    };
    assert_eq!(after, slice_end(t0, MONTH) + MONTH - later);
    assert!(taken(store, later + after, &takes(1_000_000_000), &[]).await);
    // What the windows hold is read without changing them.
    let keys = [
        (Arc::from(day.as_str()), DAY),
        (Arc::from(month.as_str()), MONTH),
    ];
    let at = later + after;
    let sums = crate::store::window_sums(store, at, &keys).await.unwrap();
    assert_eq!(sums, vec![1_000_000_000, 1_000_000_000], "money: read");
    let again = crate::store::window_sums(store, at, &keys).await.unwrap();
    assert_eq!(again, sums, "money: a read takes nothing");
}

/// Costs are the agents' and upstreams' to inflate: an admission or a
/// settle of 2^64-1 is taken at [`MAX_COST`], sums saturate at
/// [`MAX_SUM`], nothing wraps (recorded spend never goes down), and the
/// window keeps admitting, settling and reading (Redis once wrote such a
/// sum as a float and refused every later admission of the window).
pub async fn absurd_costs_are_clamped_and_never_go_back(
    store: &dyn StateStore,
    p: &str,
    t0: Duration,
) {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let key: Arc<str> = format!("{p}usd:day").into();
    let take = |cost: u64, enforce: bool| WindowTake {
        key: key.clone(),
        limit: 10_000,
        window: DAY,
        cost,
        enforce,
    };
    let sum = || async {
        window_sums(store, t0, &[(key.clone(), DAY)])
            .await
            .expect("clamp: read")[0]
    };
    // 5,000 spent.
    let AdmitOutcome::Taken { lease, .. } = store.admit(t0, &[take(100, true)], &[]).await.unwrap()
    else {
        panic!("clamp: refused");
    };
    store.finish(t0, &lease, &[(&*key, 5_000)]).await.unwrap();
    assert_eq!(sum().await, 5_000, "clamp: spent");
    // An absurd reservation never fits, and takes nothing.
    let out = store.admit(t0, &[take(u64::MAX, true)], &[]).await.unwrap();
    assert!(
        matches!(
            out,
            AdmitOutcome::Refused(Refusal::Window {
                index: 0,
                retry_after: None
            })
        ),
        "clamp: an absurd reservation: {out:?}"
    );
    assert_eq!(sum().await, 5_000, "clamp: refused, nothing taken");
    // An absurd settle is taken at the ceiling: up, never down.
    let AdmitOutcome::Taken { lease, .. } = store.admit(t0, &[take(1, true)], &[]).await.unwrap()
    else {
        panic!("clamp: refused");
    };
    store.settle(t0, &lease, &key, u64::MAX).await.unwrap();
    assert_eq!(
        sum().await,
        5_000 + MAX_COST,
        "clamp: settled at the ceiling"
    );
    store
        .finish(t0, &lease, &[(&*key, u64::MAX)])
        .await
        .unwrap();
    assert_eq!(
        sum().await,
        5_000 + MAX_COST,
        "clamp: a repeat changes nothing"
    );
    // Dry-run takes of 2^64-1 saturate the sum at MAX_SUM, no further.
    for _ in 0..8 {
        let out = store
            .admit(t0, &[take(u64::MAX, false)], &[])
            .await
            .unwrap();
        let AdmitOutcome::Taken {
            lease, remaining, ..
        } = out
        else {
            panic!("clamp: dry-run refused: {out:?}");
        };
        assert_eq!(remaining, vec![0], "clamp: nothing left");
        store
            .finish(t0, &lease, &[(&*key, u64::MAX)])
            .await
            .unwrap();
    }
    assert_eq!(sum().await, MAX_SUM, "clamp: saturated");
    // The window still reads, refuses and, once its slice leaves, admits.
    assert!(!taken(store, t0, &[take(1, true)], &[]).await);
    let later = slice_end(t0, DAY) + DAY;
    assert!(
        taken(store, later, &[take(1, true)], &[]).await,
        "clamp: frees"
    );
}

pub async fn settle_replaces_the_estimate(store: &dyn StateStore, p: &str, t0: Duration) {
    let key = format!("{p}budget");
    let w = [window(key.clone(), 1000, 600)];
    let AdmitOutcome::Taken { lease, .. } = store.admit(t0, &w, &[]).await.unwrap() else {
        panic!("settle: refused");
    };
    // 600 reserved: another 600 does not fit.
    assert!(!taken(store, t0, &w, &[]).await);
    store.settle(t0, &lease, &key, 100).await.unwrap();
    // Settling again (a retried settle) changes nothing: it sets, never adds.
    store.settle(t0, &lease, &key, 100).await.unwrap();
    let out = store
        .admit(t0, &[window(key.clone(), 1000, 900)], &[])
        .await
        .unwrap();
    let AdmitOutcome::Taken { remaining, .. } = out else {
        panic!("settle: the refund did not free room: {out:?}");
    };
    assert_eq!(remaining, vec![0], "settle: 100 + 900 of 1000");
    // finish: settle and release in one call.
    let fkey = format!("{p}fin");
    let slot_key = format!("{p}fin-slot");
    let AdmitOutcome::Taken { lease, .. } = store
        .admit(
            t0,
            &[window(fkey.clone(), 1000, 700)],
            &[slot(slot_key.clone(), 1)],
        )
        .await
        .unwrap()
    else {
        panic!("finish: refused");
    };
    store
        .finish(t0, &lease, &[(fkey.as_str(), 50)])
        .await
        .unwrap();
    let out = store
        .admit(t0, &[window(fkey.clone(), 1000, 950)], &[slot(slot_key, 1)])
        .await
        .unwrap();
    assert!(
        matches!(out, AdmitOutcome::Taken { .. }),
        "finish settled 700 -> 50 and freed the slot: {out:?}"
    );
    // A key the lease never took is left alone.
    store
        .settle(t0, &lease, &format!("{p}other"), 5)
        .await
        .unwrap();
}

pub async fn idempotency_records(store: &dyn StateStore, p: &str, t0: Duration) {
    let ttl = Duration::from_secs(600);
    let sha = [7u8; 32];
    let key = format!("{p}k1");
    assert_eq!(
        store.idem_begin(t0, &key, sha, ttl, false).await.unwrap(),
        IdemBegin::Fresh
    );
    assert_eq!(
        store.idem_begin(t0, &key, sha, ttl, false).await.unwrap(),
        IdemBegin::InFlight
    );
    assert_eq!(
        store
            .idem_begin(t0, &key, [8u8; 32], ttl, false)
            .await
            .unwrap(),
        IdemBegin::Mismatch
    );
    let rec = IdemRecord {
        status: 201,
        content_type: Some("application/json".into()),
        body: b"{\"order\":42}\x00\xff".to_vec(),
    };
    store
        .idem_finish(t0, &key, Some(IdemOutcome::Done(rec.clone())))
        .await
        .unwrap();
    assert_eq!(
        store.idem_begin(t0, &key, sha, ttl, false).await.unwrap(),
        IdemBegin::Ended(IdemOutcome::Done(rec))
    );
    let no_ct = IdemRecord {
        status: 204,
        content_type: None,
        body: Vec::new(),
    };
    let k_ct = format!("{p}k-noct");
    store.idem_begin(t0, &k_ct, sha, ttl, false).await.unwrap();
    store
        .idem_finish(t0, &k_ct, Some(IdemOutcome::Done(no_ct.clone())))
        .await
        .unwrap();
    assert_eq!(
        store.idem_begin(t0, &k_ct, sha, ttl, false).await.unwrap(),
        IdemBegin::Ended(IdemOutcome::Done(no_ct))
    );
    // Expired after the TTL: fresh again.
    assert_eq!(
        store
            .idem_begin(t0 + ttl, &key, sha, ttl, false)
            .await
            .unwrap(),
        IdemBegin::Fresh
    );
    // A failed first request: outcome_unknown unless retries are safe.
    let k2 = format!("{p}k2");
    store.idem_begin(t0, &k2, sha, ttl, false).await.unwrap();
    store
        .idem_finish(t0, &k2, Some(IdemOutcome::Failed))
        .await
        .unwrap();
    assert_eq!(
        store.idem_begin(t0, &k2, sha, ttl, false).await.unwrap(),
        IdemBegin::Ended(IdemOutcome::Failed)
    );
    assert_eq!(
        store.idem_begin(t0, &k2, sha, ttl, true).await.unwrap(),
        IdemBegin::Fresh
    );
    assert_eq!(
        store.idem_begin(t0, &k2, sha, ttl, true).await.unwrap(),
        IdemBegin::InFlight
    );
    // Unrecorded (too large) is remembered as such.
    store
        .idem_finish(t0, &k2, Some(IdemOutcome::Unrecorded))
        .await
        .unwrap();
    assert_eq!(
        store.idem_begin(t0, &k2, sha, ttl, true).await.unwrap(),
        IdemBegin::Ended(IdemOutcome::Unrecorded)
    );
    // Forgetting (never reached the tool) frees the key at once.
    let k3 = format!("{p}k3");
    store.idem_begin(t0, &k3, sha, ttl, false).await.unwrap();
    store.idem_finish(t0, &k3, None).await.unwrap();
    assert_eq!(
        store
            .idem_begin(t0, &k3, [1u8; 32], ttl, false)
            .await
            .unwrap(),
        IdemBegin::Fresh
    );
}

/// Many admissions at once against one window and one slot limit: exactly
/// the limit is taken, never more.
pub async fn concurrent_admissions_never_exceed(store: Arc<dyn StateStore>, p: &str, t0: Duration) {
    let w = window(format!("{p}rpm"), 25, 1);
    let s = slot(format!("{p}slots"), 1000);
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (store, w, s) = (store.clone(), w.clone(), s.clone());
        tasks.push(async move { store.admit(t0, &[w], &[s]).await });
    }
    let mut admitted = 0;
    for out in join_all(tasks).await {
        if let AdmitOutcome::Taken { .. } = out.expect("store answers") {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 25, "concurrent: admitted exactly the limit");
}

/// Polls all futures together (no runtime dependency in this crate).
async fn join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    use std::pin::Pin;
    use std::task::Poll;
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..futs.len()).map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(out.iter_mut().map(|o| o.take().unwrap()).collect())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn the_memory_store_conforms() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(run_all(
            Arc::new(MemoryStore::new()),
            "conf:",
            Duration::from_secs(1_796_000_000),
        ));
    }
}
