//! The Redis store against a real `redis-server` on a free loopback port:
//! the shared conformance suite, failure handling, lease expiry.

use loopgate_policy::{conformance, AdmitOutcome, SlotTake, StateStore, WindowTake};
use loopgate_state::{FallbackStore, RedisConfig, RedisStore, SharedFlags};
use loopgate_tests::{free_port, Redis};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn cfg(url: &str, prefix: &str) -> RedisConfig {
    RedisConfig {
        url: url.to_string(),
        key_prefix: prefix.to_string(),
        timeout: Duration::from_millis(200),
        slot_lease: Duration::from_secs(30),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

async fn connected(url: &str, prefix: &str) -> RedisStore {
    let s = RedisStore::start(cfg(url, prefix)).unwrap();
    assert!(s.wait_available(Duration::from_secs(5)).await, "connects");
    s
}

/// A plain connection to look at the keys a test's store wrote.
fn inspect(redis: &Redis) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn the_redis_store_conforms() {
    let redis = Redis::start();
    rt().block_on(async {
        let s = connected(&redis.url(), "t1:").await;
        // A time base far from the real clock: the store must judge by `now`.
        conformance::run_all(Arc::new(s), "conf:", Duration::from_secs(1_700_000_000)).await;
    });
}

#[test]
fn two_clients_share_one_limit_exactly() {
    let redis = Redis::start();
    rt().block_on(async {
        let a: Arc<dyn StateStore> = Arc::new(connected(&redis.url(), "t2:").await);
        let b: Arc<dyn StateStore> = Arc::new(connected(&redis.url(), "t2:").await);
        let w = WindowTake {
            key: "agent:rpm".into(),
            limit: 40,
            window: Duration::from_secs(60),
            cost: 1,
            enforce: true,
        };
        let now = epoch();
        let mut tasks = Vec::new();
        for i in 0..160 {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            let w = w.clone();
            tasks.push(tokio::spawn(async move { s.admit(now, &[w], &[]).await }));
        }
        let mut admitted = 0;
        for t in tasks {
            if let AdmitOutcome::Taken { .. } = t.await.unwrap().unwrap() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 40);
    });
}

#[test]
fn an_unreachable_redis_fails_fast_and_the_fallback_admits_locally() {
    // A port nobody listens on.
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    rt().block_on(async {
        let s = RedisStore::start(cfg(&url, "t3:")).unwrap();
        let w = WindowTake {
            key: "a:rpm".into(),
            limit: 10,
            window: Duration::from_secs(60),
            cost: 1,
            enforce: true,
        };
        let t = Instant::now();
        let err = s
            .admit(epoch(), std::slice::from_ref(&w), &[])
            .await
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(1), "fails fast");
        assert!(err.0.contains("not connected"), "{err}");
        assert!(!s.health().available);

        // Local fallback with 2 replicas: 10 / 2 = 5 per instance.
        let f = FallbackStore::new(s, 2);
        let mut admitted = 0;
        for _ in 0..10 {
            if let AdmitOutcome::Taken { lease, .. } = f
                .admit(epoch(), std::slice::from_ref(&w), &[])
                .await
                .unwrap()
            {
                assert!(lease.degraded);
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5);
        assert_eq!(f.degraded_admissions(), 10);
    });
}

#[test]
fn the_store_comes_back_when_redis_does() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    rt().block_on(async {
        let redis = Redis::start_on(port);
        let s = connected(&url, "t4:").await;
        let w = [WindowTake {
            key: "a:rpm".into(),
            limit: 1000,
            window: Duration::from_secs(60),
            cost: 1,
            enforce: true,
        }];
        assert!(s.admit(epoch(), &w, &[]).await.is_ok());
        drop(redis);
        // Every call fails, fast, while it is away.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let t = Instant::now();
            let r = s.admit(epoch(), &w, &[]).await;
            assert!(
                t.elapsed() < Duration::from_millis(600),
                "bounded by the timeout"
            );
            if r.is_err() {
                break;
            }
            assert!(Instant::now() < deadline, "notices redis is gone");
        }
        for _ in 0..5 {
            assert!(s.admit(epoch(), &w, &[]).await.is_err());
        }
        let _redis = Redis::start_on(port);
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.admit(epoch(), &w, &[]).await.is_err() {
            assert!(Instant::now() < deadline, "reconnects on its own");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(s.health().available);
    });
}

#[test]
fn slots_of_a_dead_instance_come_back_after_the_lease() {
    let redis = Redis::start();
    rt().block_on(async {
        let mut c = cfg(&redis.url(), "t5:");
        c.slot_lease = Duration::from_millis(600);
        let live = RedisStore::start(c.clone()).unwrap();
        assert!(live.wait_available(Duration::from_secs(5)).await);
        let slot = [SlotTake {
            key: "a:inflight".into(),
            limit: 1,
            enforce: true,
        }];
        // `live` holds its slot past several lease periods: renewed.
        let AdmitOutcome::Taken { lease, .. } = live.admit(epoch(), &[], &slot).await.unwrap()
        else {
            panic!("first slot refused");
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            matches!(
                live.admit(epoch(), &[], &slot).await.unwrap(),
                AdmitOutcome::Refused(_)
            ),
            "a live lease is renewed, not lost"
        );
        live.release(&lease).await.unwrap();

        // A "dead" instance: takes a slot with a raw script call nobody renews.
        let dead = RedisStore::start(c).unwrap();
        assert!(dead.wait_available(Duration::from_secs(5)).await);
        let AdmitOutcome::Taken { .. } = dead.admit(epoch(), &[], &slot).await.unwrap() else {
            panic!("slot refused");
        };
        assert!(matches!(
            live.admit(epoch(), &[], &slot).await.unwrap(),
            AdmitOutcome::Refused(_)
        ));
        dead.forget_leases_for_tests();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            matches!(
                live.admit(epoch(), &[], &slot).await.unwrap(),
                AdmitOutcome::Taken { .. }
            ),
            "the dead instance's slot came back"
        );
    });
}

#[test]
fn an_open_breaker_is_shared() {
    let redis = Redis::start();
    rt().block_on(async {
        let a = SharedFlags::new(connected(&redis.url(), "t6:").await, "t6:");
        let b = SharedFlags::new(connected(&redis.url(), "t6:").await, "t6:");
        let now = epoch().as_millis() as u64;
        assert!(b.sync_breakers(now, &[]).await.unwrap().is_empty());
        a.sync_breakers(now, &[("mock".into(), now + 5000)])
            .await
            .unwrap();
        assert_eq!(
            b.sync_breakers(now, &[]).await.unwrap(),
            vec![("mock".into(), now + 5000)]
        );
        // The later of two wins; expired entries go.
        b.sync_breakers(now, &[("mock".into(), now + 3000)])
            .await
            .unwrap();
        assert_eq!(
            a.sync_breakers(now + 4000, &[]).await.unwrap(),
            vec![("mock".into(), now + 5000)]
        );
        assert!(a.sync_breakers(now + 5000, &[]).await.unwrap().is_empty());
        a.sync_breakers(now, &[("tool".into(), now + 5000)])
            .await
            .unwrap();
        a.clear_breaker("tool").await.unwrap();
        assert!(b.sync_breakers(now, &[]).await.unwrap().is_empty());
    });
}

/// A daily budget kept in Redis holds ~600 slices however many requests a
/// day brings, not one member per admission, and finished leases leave no
/// field behind: 20,000 admissions over ~22 hours of store time.
#[test]
fn a_busy_daily_budget_stays_small_in_redis() {
    let redis = Redis::start();
    rt().block_on(async {
        let s = connected(&redis.url(), "t7:").await;
        let w = [WindowTake {
            key: "agent:budget:day".into(),
            limit: u64::MAX / 2,
            window: Duration::from_secs(86_400),
            cost: 300,
            enforce: true,
        }];
        let t0 = Duration::from_secs(1_700_000_000);
        for i in 0..20_000u32 {
            let now = t0 + Duration::from_secs(4) * i;
            let AdmitOutcome::Taken { lease, .. } = s.admit(now, &w, &[]).await.unwrap() else {
                panic!("refused");
            };
            s.finish(now, &lease, &[("agent:budget:day", 250)])
                .await
                .unwrap();
        }
        let mut c = inspect(&redis);
        let slices: u64 = redis::cmd("ZCARD")
            .arg("t7:w:agent:budget:day")
            .query(&mut c)
            .unwrap();
        let fields: u64 = redis::cmd("HLEN")
            .arg("t7:wc:agent:budget:day")
            .query(&mut c)
            .unwrap();
        let sum: u64 = redis::cmd("HGET")
            .arg("t7:wc:agent:budget:day")
            .arg("_sum")
            .query(&mut c)
            .unwrap();
        let open: u64 = redis::cmd("ZCARD")
            .arg("t7:wo:agent:budget:day")
            .query(&mut c)
            .unwrap();
        assert!((550..=601).contains(&slices), "{slices} slices");
        assert_eq!(open, 0, "no open lease left");
        assert_eq!(
            fields,
            slices + 1,
            "a cost per slice and the sum, no lease left"
        );
        assert_eq!(
            sum,
            20_000 * 250,
            "every admission settled to its actual cost"
        );
    });
}

/// A lease whose instance died before finishing is forgotten once its slice
/// has aged out of the window: its cost leaves with the slice, and neither
/// its field nor its open-lease entry piles up.
#[test]
fn a_dead_instances_open_lease_is_forgotten_with_its_slice() {
    let redis = Redis::start();
    rt().block_on(async {
        let s = connected(&redis.url(), "t8:").await;
        let w = [WindowTake {
            key: "agent:tpm".into(),
            limit: 1000,
            window: Duration::from_secs(60),
            cost: 600,
            enforce: true,
        }];
        let t0 = Duration::from_secs(1_700_000_000);
        let AdmitOutcome::Taken { lease, .. } = s.admit(t0, &w, &[]).await.unwrap() else {
            panic!("refused");
        };
        let mut c = inspect(&redis);
        let field = format!("l{}", lease.id);
        let has = |c: &mut redis::Connection| -> (bool, u64) {
            let f: bool = redis::cmd("HEXISTS")
                .arg("t8:wc:agent:tpm")
                .arg(&field)
                .query(c)
                .unwrap();
            let o: u64 = redis::cmd("ZCARD").arg("t8:wo:agent:tpm").query(c).unwrap();
            (f, o)
        };
        assert_eq!(has(&mut c), (true, 1), "open while in flight");
        // Never finished. Two minutes on, its slice has aged out.
        let later = t0 + Duration::from_secs(120);
        let AdmitOutcome::Taken { remaining, .. } = s.admit(later, &w, &[]).await.unwrap() else {
            panic!("the dead lease's 600 did not leave with its slice");
        };
        assert_eq!(remaining, vec![400]);
        assert_eq!(has(&mut c), (false, 1), "only the new lease is open");
    });
}
