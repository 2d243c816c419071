//! The decision as a value: one call per request on a memory store and a manual clock, no sockets.

use super::*;
use crate::clock::ManualClock;

/// 2026-01-01T00:00:20Z: 20 s into a minute.
const T0: Nanos = 1_767_225_620_000_000_000;

struct Fixture {
    snap: Arc<Snapshot>,
    store: Arc<Store>,
    clock: SharedClock,
    metrics: Metrics,
}

impl Fixture {
    fn new(yaml: &str) -> Fixture {
        let config = crate::config::parse(yaml).unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::default();
        Fixture {
            snap: Arc::new(Snapshot::build(config, 1, None, &metrics)),
            store: Arc::new(Store::memory()),
            clock: ManualClock::at(T0),
            metrics,
        }
    }

    fn gate(&self) -> Gate<'_> {
        Gate {
            store: &self.store,
            clock: &self.clock,
            metrics: &self.metrics,
        }
    }

    async fn decide(&self, route: usize, ip: &str) -> Verdict {
        let client = client(ip);
        let headers = HeaderMap::new();
        let facts = RequestFacts {
            sender_only: false,
            route,
            client: &client,
            headers: &headers,
            now: self.clock.now(),
        };
        self.gate().decide(&self.snap, &facts).await
    }

    fn limiter(&self, name: &str) -> usize {
        let found = self.snap.limiters.iter().position(|l| *l.name == *name);
        found.expect("limiter")
    }

    /// The quota `ip` has left on `limiter` now, without counting.
    async fn remaining(&self, limiter: &str, ip: &str) -> u64 {
        let l = &self.snap.limiters[self.limiter(limiter)];
        let key = l.store_key(&format!("ip:{ip}"));
        let quota = self.store.peek(&key, &l.algorithm, self.clock.now());
        quota.await.expect("peek").remaining
    }
}

fn client(ip: &str) -> Client {
    Client {
        ip: ip.parse().expect("ip"),
        ip_key: format!("ip:{ip}").into(),
        api_key: None,
        key_verified: false,
        peer_trusted: false,
        exempt: false,
        pass: None,
        network: Default::default(),
    }
}

fn refusal(v: Verdict) -> Refusal {
    match v {
        Verdict::Refuse(r) => r,
        Verdict::Pass(p) => panic!("passed as {:?}", p.decision),
        Verdict::StoreUnavailable => panic!("store unavailable"),
    }
}

fn pass(v: Verdict) -> Clearance {
    match v {
        Verdict::Pass(p) => p,
        Verdict::Refuse(r) => panic!("refused by limiter {}", r.limiter),
        Verdict::StoreUnavailable => panic!("store unavailable"),
    }
}

const TWO_LIMITERS: &str = "
limiters:
  minute: { algorithm: fixed_window, limit: 1, window: 60s, key: ip }
  hour: { algorithm: fixed_window, limit: 1, window: 1h, key: ip }
  open: { algorithm: fixed_window, limit: 100, window: 60s, key: ip }
routes:
  - { name: free, match: { path: /free }, respond: { status: 200, body: ok } }
  - { name: both, match: { path: / }, respond: { status: 200, body: ok }, limiters: [open, minute, hour] }
";

#[tokio::test]
async fn a_refusal_names_its_route_and_the_limiter_with_the_longest_wait() {
    let f = Fixture::new(TWO_LIMITERS);
    let first = pass(f.decide(1, "203.0.113.9").await);
    assert_eq!(first.decision, Decision::Allowed);
    let refused = refusal(f.decide(1, "203.0.113.9").await);
    assert_eq!(refused.route, 1);
    assert_eq!(refused.limiter, f.limiter("hour"));
    let Reason::Limited { denial, .. } = &refused.reason else {
        panic!("a ban");
    };
    assert_eq!(denial.violated, [Arc::from("minute"), Arc::from("hour")]);
    // The headers follow every limiter the request was counted on.
    let views = refused.views(&f.snap);
    let names: Vec<&str> = views.iter().map(|v| v.name).collect();
    assert_eq!(names, ["open", "minute", "hour"]);
    assert!(refused.limit_headers(&f.snap, &views).is_some());
}

#[tokio::test]
async fn a_route_without_limiters_and_an_exempt_client_pass_without_asking_the_store() {
    let f = Fixture::new(TWO_LIMITERS);
    for _ in 0..3 {
        assert_eq!(
            pass(f.decide(0, "203.0.113.9").await).decision,
            Decision::Allowed
        );
    }
    let mut exempt = client("203.0.113.9");
    exempt.exempt = true;
    let headers = HeaderMap::new();
    let facts = RequestFacts {
        sender_only: false,
        route: 1,
        client: &exempt,
        headers: &headers,
        now: T0,
    };
    for _ in 0..3 {
        let v = f.gate().decide(&f.snap, &facts).await;
        assert_eq!(pass(v).decision, Decision::Exempt);
    }
    assert_eq!(f.store.tracked_keys(), 0);
}

const LOGIN: &str = "
limiters:
  login:
    algorithm: fixed_window
    limit: 2
    window: 60s
    key: ip
    count: { status: [401] }
    ban: { after: 2, for: 1h, status: 403 }
routes:
  - { name: login, match: { path: / }, respond: { status: 200, body: ok }, limiters: [login] }
";

#[tokio::test]
async fn a_refused_request_gets_its_count_unit_back_and_an_uncounted_answer_gives_its_own_back() {
    let f = Fixture::new(LOGIN);
    let ip = "203.0.113.9";
    let mut ok = pass(f.decide(0, ip).await);
    assert_eq!(f.remaining("login", ip).await, 1);
    let mut headers = HeaderMap::new();
    f.gate()
        .settle(&f.snap, &mut ok, StatusCode::OK, &mut headers)
        .await;
    assert_eq!(f.remaining("login", ip).await, 2, "a 200 does not count");
    assert_eq!(
        headers["x-ratelimit-remaining"], "2",
        "and its headers say so"
    );

    for _ in 0..2 {
        let mut failed = pass(f.decide(0, ip).await);
        let mut headers = HeaderMap::new();
        let status = StatusCode::UNAUTHORIZED;
        f.gate()
            .settle(&f.snap, &mut failed, status, &mut headers)
            .await;
    }
    assert_eq!(f.remaining("login", ip).await, 0);
    let refused = refusal(f.decide(0, ip).await);
    assert!(matches!(refused.reason, Reason::Limited { .. }));
    // The refused request's unit came back before the verdict did: two
    // units given back, the 200's and the refusal's (the 401s count).
    let l = &f.snap.limiters[f.limiter("login")];
    let not_counted = &l.metrics.not_counted;
    assert_eq!(not_counted.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[tokio::test]
async fn the_refusal_that_reaches_ban_after_bans_the_key_and_the_next_request_is_refused_by_the_ban(
) {
    let f = Fixture::new(LOGIN);
    let ip = "203.0.113.9";
    for _ in 0..2 {
        let mut failed = pass(f.decide(0, ip).await);
        let mut headers = HeaderMap::new();
        let status = StatusCode::UNAUTHORIZED;
        f.gate()
            .settle(&f.snap, &mut failed, status, &mut headers)
            .await;
    }
    for strike in 1..=2 {
        let r = refusal(f.decide(0, ip).await);
        assert!(
            matches!(r.reason, Reason::Limited { .. }),
            "strike {strike}"
        );
    }
    let l = &f.snap.limiters[f.limiter("login")];
    assert_eq!(
        l.metrics
            .bans_started
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // A new window does not lift the ban.
    let clock = ManualClock::at(T0 + 120 * 1_000_000_000);
    let later = Gate {
        clock: &(clock as SharedClock),
        ..f.gate()
    };
    let client = client(ip);
    let headers = HeaderMap::new();
    let facts = RequestFacts {
        sender_only: false,
        route: 0,
        client: &client,
        headers: &headers,
        now: T0 + 120 * 1_000_000_000,
    };
    let banned = refusal(later.decide(&f.snap, &facts).await);
    assert_eq!(banned.limiter, f.limiter("login"));
    let Reason::Banned(ban) = &banned.reason else {
        panic!("refused by the limiter, not the ban");
    };
    assert_eq!(ban.status, StatusCode::FORBIDDEN);
    assert!(banned
        .limit_headers(&f.snap, &banned.views(&f.snap))
        .is_none());
    // Another client is not banned.
    assert_eq!(
        pass(f.decide(0, "198.51.100.1").await).decision,
        Decision::Allowed
    );
}

const SHAPED: &str = "
limiters:
  queue: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 1, key: ip }
  slots: { algorithm: concurrency, max_in_flight: 1, key: ip }
routes:
  - { name: shaped, match: { path: / }, respond: { status: 200, body: ok }, limiters: [queue] }
  - { name: slots, match: { path: /slots }, respond: { status: 200, body: ok }, limiters: [slots] }
";

#[tokio::test]
async fn a_queued_place_goes_back_if_the_client_leaves_before_its_turn_and_is_kept_once_waited() {
    let f = Fixture::new(SHAPED);
    for (ip, waits) in [("203.0.113.9", true), ("198.51.100.1", false)] {
        let _first = pass(f.decide(0, ip).await);
        let mut second = pass(f.decide(0, ip).await);
        assert!(second.delay > 0, "{ip}: the second waits its turn");
        if waits {
            // Started long enough ago that its turn has come: no waiting here.
            let started = tokio::time::Instant::now() - Duration::from_secs(2);
            second.wait_turn(started).await;
        }
        drop(second);
        let third = f.decide(0, ip).await;
        assert_eq!(matches!(third, Verdict::Pass(_)), !waits, "{ip}");
    }
}

#[tokio::test]
async fn a_concurrency_slot_is_held_by_the_pass_and_freed_when_it_is_dropped() {
    let f = Fixture::new(SHAPED);
    let ip = "203.0.113.9";
    let mut holder = pass(f.decide(1, ip).await);
    assert!(matches!(f.decide(1, ip).await, Verdict::Refuse(_)));
    let slots = holder.take_slots();
    assert!(!slots.is_empty());
    drop(holder);
    assert!(
        matches!(f.decide(1, ip).await, Verdict::Refuse(_)),
        "the body still holds it"
    );
    drop(slots);
    assert!(matches!(f.decide(1, ip).await, Verdict::Pass(_)));
}
