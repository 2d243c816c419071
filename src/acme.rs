//! Automatic HTTPS: one background task per managed name that loads its certificate from storage, orders one when it is missing or due for renewal, and puts it in force — with backoff on failure and a lock so instances sharing the storage order a name once.
//!
//! The lifecycle of a name (`domain_loop`):
//!
//! 1. its stored certificate, if any, is served at once (restart: no order;
//!    [`load_stored`] has put it in force before the TLS listeners accept);
//! 2. when none is stored or it is due (two thirds of its lifetime, or
//!    `renew_before` before expiry), the name's lock is taken without
//!    waiting — a file lock in the storage, or with the Redis store a lock
//!    in Redis ([`fleet`]); an instance that finds it held waits a second and
//!    reads the storage (and the fleet's record) again: the holder's
//!    certificate is what it will serve, and meanwhile it answers the
//!    holder's challenge too;
//! 3. under the lock the storage is read once more (another instance may
//!    just have finished), then the order runs ([`order::obtain`]);
//! 4. success: served from the next handshake on, saved (0600) and, in a
//!    fleet, shared sealed through Redis; a certificate that cannot be saved
//!    is served from memory all the same (and reported); failure:
//!    retried after a jittered, doubling delay — from 2 s for a CA that
//!    cannot be reached, from 1 min for a failed validation, and at least
//!    1 h when the CA says `rateLimited` — capped at 1 h.
//!
//! A stored certificate that cannot be used (damaged, its key not the
//! certificate's, expired) is logged, never served, and ordered again.
//!
//! Until a name has its first certificate its handshakes fail (see
//! [`state::Managed::lookup`]); every other name is served as before. A
//! reload that adds a name starts its task, one that removes it stops it.

pub mod fleet;
pub mod order;
pub mod state;
pub mod storage;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use instant_acme::Account;
use parking_lot::Mutex;
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::acme::AcmeConfig;
use fleet::{Fleet, FleetLock, SharedChallenge};
use order::OrderError;
use state::Managed;
use storage::{Storage, Stored};

/// How often the set of names is compared with the config in force.
const CONFIG_POLL: Duration = Duration::from_secs(1);
/// How long an instance that found a name's lock held waits before reading
/// the storage (and the fleet's published challenge) again.
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// The longest sleep between two looks at a name (clocks move; files change).
const LONGEST_SLEEP: Duration = Duration::from_secs(3600);
/// First retry after a CA that could not be reached or answered an error.
const RETRY_FIRST: Duration = Duration::from_secs(2);
/// First retry after a failed validation (CAs count those per name and hour).
const RETRY_FIRST_VALIDATION: Duration = Duration::from_secs(60);
/// The longest retry delay, and the least after `rateLimited`.
const RETRY_MOST: Duration = Duration::from_secs(3600);

/// The metric families this module counts (created at zero by [`start_at_zero`]).
pub const ORDERS: &str = "tollgate_acme_orders_total";

/// Creates the order counters at zero so they are scraped before the first order.
pub fn start_at_zero(metrics: &crate::metrics::Metrics) {
    for result in ["ok", "error", "rate_limited", "lock_lost"] {
        metrics.counter(ORDERS, &[("result", result)]);
    }
}

/// The account per CA directory, created once and shared by every name's task.
type Accounts = Arc<AsyncMutex<HashMap<String, Account>>>;

/// What the ACME tasks read from the running proxy, handed down by `run`
/// (so this module never reaches up into the app): the `server.tls.acme`
/// in force, the clock, and the orders counter by result.
#[derive(Clone)]
pub struct Context {
    pub acme: Arc<dyn Fn() -> Option<AcmeConfig> + Send + Sync>,
    pub clock: SharedClock,
    pub count_order: Arc<dyn Fn(&str) + Send + Sync>,
    /// The store's Redis, when it is the store: the fleet shares through it.
    pub redis: Option<crate::store::redis::Redis>,
}

/// Runs until `stop`: keeps one task per name of the `server.tls.acme` in force.
pub async fn manage(app: Context, managed: Arc<Managed>, stop: CancellationToken) {
    let accounts: Accounts = Arc::default();
    let mut tasks: HashMap<String, (AcmeConfig, CancellationToken)> = HashMap::new();
    loop {
        let config = (app.acme)();
        managed.set_shared_dir(config.as_ref().map(|c| c.storage.join("challenges")));
        tasks.retain(|domain, (running, token)| {
            let wanted = config.as_ref().filter(|c| c.domains.contains(domain));
            // A changed CA, challenge, storage or window restarts the name's task.
            let keep = wanted.is_some_and(|c| same_except_domains(c, running));
            if !keep {
                token.cancel();
                if wanted.is_none() {
                    managed.forget(domain);
                    tracing::info!(%domain, "ACME: name no longer managed");
                }
            }
            keep
        });
        for domain in config.iter().flat_map(|c| &c.domains) {
            if tasks.contains_key(domain) {
                continue;
            }
            let config = config.clone().expect("iterating its domains");
            managed.manage(domain);
            let token = stop.child_token();
            let task = DomainTask {
                app: app.clone(),
                managed: managed.clone(),
                config: config.clone(),
                domain: domain.clone(),
                accounts: accounts.clone(),
                fleet: fleet_of(&app, &config),
                held: Mutex::default(),
                followed: Mutex::default(),
                wanting: AtomicBool::new(true),
            };
            tokio::spawn(task.run(token.clone()));
            tasks.insert(domain.clone(), (config, token));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CONFIG_POLL) => {}
        }
    }
}

/// Puts in force, before the TLS listeners accept, the stored certificate
/// of every name `config` manages that has a usable one. A (re)start then
/// serves them from its first handshake, not from when each name's task
/// first looks; the tasks still look (the fleet's copy in Redis included)
/// and order what is missing, unusable or due. What cannot be read here is
/// left to them.
pub async fn load_stored(config: &AcmeConfig, managed: &Managed, clock: &SharedClock) {
    let (root, directory) = (config.storage.clone(), config.directory.clone());
    let domains = config.domains.clone();
    let read = tokio::task::spawn_blocking(move || {
        let storage = Storage::open(&root, &directory)?;
        let mut found = Vec::new();
        for domain in domains {
            if let Some(stored) = storage.certificate(&domain)? {
                found.push((domain, stored));
            }
        }
        std::io::Result::Ok(found)
    })
    .await;
    let found = match read {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "ACME: cannot read the stored certificates at start; each name's task tries again");
            return;
        }
        Err(_) => return,
    };
    let now = clock.now() / 1_000_000_000;
    let mut loaded = 0;
    for (domain, stored) in &found {
        match install(managed, domain, stored, now) {
            Ok(_) => loaded += 1,
            // Its task logs it and orders a new one.
            Err(e) => {
                tracing::debug!(%domain, error = %e, "ACME: stored certificate not usable at start")
            }
        }
    }
    tracing::info!(
        loaded,
        names = config.domains.len(),
        "ACME: stored certificates in force before the TLS listeners accept"
    );
}

/// Puts `stored` in force for `domain` and records its facts: refused when
/// its key is not the certificate's, or it has expired at `now` (Unix s).
fn install(
    managed: &Managed,
    domain: &str,
    stored: &Stored,
    now: u64,
) -> Result<Facts, OrderError> {
    let key = order::matching_key(&stored.chain_pem, &stored.key_pem)?;
    let facts = facts(key.cert[0].as_ref())?;
    if facts.not_after <= now {
        return Err(OrderError::Certificate(format!(
            "expired (serial {})",
            facts.serial
        )));
    }
    managed.install(domain, Arc::new(key));
    managed.update(domain, |s| {
        s.not_before = Some(facts.not_before);
        s.not_after = Some(facts.not_after);
        s.issuer = Some(facts.issuer.clone());
        s.serial = Some(facts.serial.clone());
    });
    Ok(facts)
}

/// The fleet's shared state when the store is Redis (validation made the key required then).
fn fleet_of(app: &Context, config: &AcmeConfig) -> Option<Arc<Fleet>> {
    let (redis, key) = (app.redis.clone()?, config.shared_key.clone()?);
    let ca = storage::ca_tag(&config.directory);
    Some(Arc::new(Fleet::new(redis, key, ca)))
}

fn same_except_domains(a: &AcmeConfig, b: &AcmeConfig) -> bool {
    AcmeConfig {
        domains: Vec::new(),
        ..a.clone()
    } == AcmeConfig {
        domains: Vec::new(),
        ..b.clone()
    }
}

/// One name's lifecycle.
struct DomainTask {
    app: Context,
    managed: Arc<Managed>,
    config: AcmeConfig,
    domain: String,
    accounts: Accounts,
    /// The fleet's shared state, with the Redis store.
    fleet: Option<Arc<Fleet>>,
    /// A certificate in force that could not be saved (so it is not ordered again).
    held: Mutex<Option<Stored>>,
    /// The challenge this instance answers for another instance's order.
    followed: Mutex<Option<SharedChallenge>>,
    /// No certificate in force, or a due one: a fleet member then watches Redis.
    wanting: AtomicBool,
}

/// A certificate's facts, read from its leaf.
#[derive(Debug, Clone)]
struct Facts {
    not_before: u64,
    not_after: u64,
    issuer: String,
    serial: String,
}

impl DomainTask {
    async fn run(self, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let wait = self.step(&mut failures).await;
            let next = self.now_secs() + wait.as_secs();
            self.managed
                .update(&self.domain, |s| s.next_attempt = Some(next));
            if !self.sleep(wait, &stop).await {
                break;
            }
        }
        self.follow(None);
    }

    /// Sleeps `wait`; false when stopped. A fleet member whose name has no
    /// certificate in force (or one that is due) looks at Redis every
    /// [`LOCK_WAIT`] meanwhile, even while it backs off from its own failure:
    /// it answers the challenge of whichever instance orders, and wakes as
    /// soon as a certificate that is not due is shared.
    async fn sleep(&self, wait: Duration, stop: &CancellationToken) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let watching = self.fleet.is_some() && self.wanting.load(Ordering::Relaxed);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return true;
            }
            let nap = if watching { left.min(LOCK_WAIT) } else { left };
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(nap) => {}
            }
            if watching {
                self.follow_challenge().await;
                if self.shared_and_not_due().await {
                    return true;
                }
            }
        }
    }

    /// Whether the fleet shares a certificate for the name that is not yet due.
    async fn shared_and_not_due(&self) -> bool {
        let Some(fleet) = &self.fleet else {
            return false;
        };
        let Ok(Some(stored)) = fleet.certificate(&self.domain).await else {
            return false;
        };
        order::matching_key(&stored.chain_pem, &stored.key_pem)
            .and_then(|k| facts(k.cert[0].as_ref()))
            .is_ok_and(|f| f.not_after > self.now_secs() && !self.until_renewal(&f).is_zero())
    }

    fn now_secs(&self) -> u64 {
        self.app.clock.now() / 1_000_000_000
    }

    /// One look at the name: serve what is stored, order when due; returns how long to sleep.
    async fn step(&self, failures: &mut u32) -> Duration {
        let storage = match self
            .blocking({
                let (root, dir) = (self.config.storage.clone(), self.config.directory.clone());
                move || Storage::open(&root, &dir)
            })
            .await
        {
            Ok(s) => s,
            Err(e) => return self.failed(failures, OrderError::Storage(e)),
        };
        if let Some(wait) = self.serve_stored(&storage).await {
            self.wanting.store(false, Ordering::Relaxed);
            self.follow(None);
            return wait;
        }
        self.wanting.store(true, Ordering::Relaxed);
        let lock = match self.try_lock(&storage).await {
            Ok(Some(l)) => l,
            Ok(None) => {
                // Another instance orders it: its certificate will be shared,
                // and its challenge is answered here too meanwhile.
                self.follow_challenge().await;
                return LOCK_WAIT;
            }
            Err(e) => return self.failed(failures, e),
        };
        self.follow(None);
        // It may have finished between our read and our lock.
        if let Some(wait) = self.serve_stored(&storage).await {
            self.wanting.store(false, Ordering::Relaxed);
            return wait;
        }
        self.order_under(lock, &storage, failures).await
    }

    /// The name's lock: in Redis for a fleet, else a file lock in the storage.
    async fn try_lock(&self, storage: &Storage) -> Result<Option<OrderHold>, OrderError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.try_lock(&self.domain).await?.map(OrderHold::Fleet));
        }
        let (st, d) = (storage.clone(), self.domain.clone());
        let lock = self.blocking(move || st.try_lock(&d)).await;
        Ok(lock
            .map_err(OrderError::Storage)?
            .map(|l| OrderHold::File { _lock: l }))
    }

    /// Orders, puts the certificate in force, saves and shares it; holds `lock` throughout.
    async fn order_under(
        &self,
        lock: OrderHold,
        storage: &Storage,
        failures: &mut u32,
    ) -> Duration {
        let now = self.now_secs();
        self.managed
            .update(&self.domain, |s| s.last_attempt = Some(now));
        tracing::info!(domain = %self.domain, challenge = self.config.challenge.as_str(), "ACME: ordering a certificate");
        let ordered = match lock.lost() {
            Some(lost) => tokio::select! {
                r = self.order(storage) => r,
                _ = lost.cancelled() => Err(OrderError::LockLost),
            },
            None => self.order(storage).await,
        };
        let stored = match ordered {
            Ok(s) => s,
            Err(e) => return self.failed(failures, e),
        };
        *failures = 0;
        self.count("ok");
        self.managed.update(&self.domain, |s| {
            s.renewals += 1;
            s.last_error = None;
        });
        let facts = match self.install(&stored) {
            Ok(f) => f,
            Err(e) => return self.failed(failures, e),
        };
        tracing::info!(domain = %self.domain, serial = %facts.serial, not_after = facts.not_after, "ACME: certificate in force");
        self.wanting.store(false, Ordering::Relaxed);
        let saved = self.save(storage, &stored, &facts).await;
        *self.held.lock() = match saved {
            Ok(()) => None,
            Err(e) => {
                // Served from memory all the same: an order is never thrown away.
                let message = format!("{e} (the certificate is served from memory)");
                tracing::error!(domain = %self.domain, error = %message, "ACME: certificate not saved");
                self.managed.update(&self.domain, |s| {
                    s.failures += 1;
                    s.last_error = Some(message);
                });
                Some(stored)
            }
        };
        drop(lock);
        self.until_renewal(&facts)
    }

    /// Writes the certificate to the storage and, in a fleet, to Redis (until it expires).
    async fn save(
        &self,
        storage: &Storage,
        stored: &Stored,
        facts: &Facts,
    ) -> Result<(), OrderError> {
        let mut result = Ok(());
        if let Some(fleet) = &self.fleet {
            let ttl = Duration::from_secs(facts.not_after.saturating_sub(self.now_secs()).max(1));
            if let Err(e) = fleet.save_certificate(&self.domain, stored, ttl).await {
                result = Err(OrderError::Fleet(e));
            }
        }
        let (st, d, s) = (storage.clone(), self.domain.clone(), stored.clone());
        if let Err(e) = self.blocking(move || st.save_certificate(&d, &s)).await {
            result = Err(OrderError::Storage(e));
        }
        result
    }

    /// Serves the stored certificate, if any; `Some(wait)` when it is not yet due.
    /// One that cannot be used (damaged, a key that does not match, expired)
    /// is logged and never served; the next candidate is tried.
    async fn serve_stored(&self, storage: &Storage) -> Option<Duration> {
        for (source, stored) in self.candidates(storage).await {
            match self.install(&stored) {
                Ok(facts) => {
                    let wait = self.until_renewal(&facts);
                    if source != "memory" && !wait.is_zero() {
                        // A good certificate is in force and saved: nothing failing to report.
                        self.managed.update(&self.domain, |s| s.last_error = None);
                    }
                    return (!wait.is_zero()).then_some(wait);
                }
                Err(e) => {
                    tracing::warn!(domain = %self.domain, source, error = %e, "ACME: stored certificate unusable; never served, ordering a new one")
                }
            }
        }
        None
    }

    /// The certificates this name may have, newest source first: the
    /// fleet's (Redis), the storage's, and one held in memory because it
    /// could not be saved.
    async fn candidates(&self, storage: &Storage) -> Vec<(&'static str, Stored)> {
        let mut out = Vec::new();
        if let Some(fleet) = &self.fleet {
            match fleet.certificate(&self.domain).await {
                Ok(Some(s)) => out.push(("redis", s)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(domain = %self.domain, error = %e, "ACME: shared certificate unavailable; using the local copy")
                }
            }
        }
        let (st, d) = (storage.clone(), self.domain.clone());
        match self.blocking(move || st.certificate(&d)).await {
            Ok(Some(s)) => out.push(("file", s)),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(domain = %self.domain, error = %e, "ACME: stored certificate unreadable")
            }
        }
        out.extend(self.held.lock().clone().map(|s| ("memory", s)));
        out
    }

    /// Answers the challenge another instance of the fleet published for this name.
    async fn follow_challenge(&self) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        match fleet.challenge(&self.domain).await {
            Ok(found) => self.follow(found),
            Err(e) => {
                tracing::debug!(domain = %self.domain, error = %e, "ACME: shared challenge unavailable")
            }
        }
    }

    /// Puts `challenge` in place of the one this instance answered for another.
    fn follow(&self, challenge: Option<SharedChallenge>) {
        let mut followed = self.followed.lock();
        if *followed == challenge {
            return;
        }
        match followed.take() {
            Some(SharedChallenge::Http { token, .. }) => self.managed.set_http_answer(&token, None),
            Some(SharedChallenge::Alpn { .. }) => {
                self.managed.set_alpn_certificate(&self.domain, None)
            }
            None => {}
        }
        match &challenge {
            Some(SharedChallenge::Http { token, answer }) => {
                self.managed.set_http_answer(token, Some(answer.clone()))
            }
            Some(SharedChallenge::Alpn { chain_pem, key_pem }) => {
                match order::certified_key(chain_pem, key_pem) {
                    Ok(k) => self
                        .managed
                        .set_alpn_certificate(&self.domain, Some(Arc::new(k))),
                    Err(e) => {
                        tracing::warn!(domain = %self.domain, error = %e, "ACME: shared tls-alpn-01 certificate unusable")
                    }
                }
            }
            None => {}
        }
        *followed = challenge;
    }

    /// Puts `stored` in force and records its facts.
    fn install(&self, stored: &Stored) -> Result<Facts, OrderError> {
        install(&self.managed, &self.domain, stored, self.now_secs())
    }

    /// How long until `facts`' certificate is due (zero: now), at most [`LONGEST_SLEEP`].
    fn until_renewal(&self, facts: &Facts) -> Duration {
        let lifetime = facts.not_after.saturating_sub(facts.not_before);
        let due = match self.config.renew_before {
            Some(before) => facts.not_after.saturating_sub(before.as_secs()),
            None => facts.not_before + lifetime * 2 / 3,
        };
        Duration::from_secs(due.saturating_sub(self.now_secs())).min(LONGEST_SLEEP)
    }

    async fn order(&self, storage: &Storage) -> Result<Stored, OrderError> {
        let account = {
            let mut accounts = self.accounts.lock().await;
            match accounts.get(&self.config.directory) {
                Some(a) => a.clone(),
                None => {
                    let a = order::account(&self.config, storage).await?;
                    accounts.insert(self.config.directory.clone(), a.clone());
                    a
                }
            }
        };
        let fleet = self.fleet.as_ref();
        order::obtain(
            &account,
            &self.domain,
            self.config.challenge,
            &self.managed,
            fleet,
        )
        .await
    }

    /// Records a failure; returns the jittered delay before the next attempt.
    fn failed(&self, failures: &mut u32, e: OrderError) -> Duration {
        *failures = failures.saturating_add(1);
        let wait = failure_delay(&e, *failures, jitter());
        self.count(failure_label(&e));
        tracing::warn!(domain = %self.domain, error = %e, retry_in = ?wait, "ACME: no certificate");
        let message = e.to_string();
        self.managed.update(&self.domain, |s| {
            s.failures += 1;
            s.last_error = Some(message);
        });
        wait
    }

    fn count(&self, result: &str) {
        (self.app.count_order)(result);
    }

    /// Runs file I/O on a blocking thread (never on the runtime).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }
}

/// The lock an order runs under.
enum OrderHold {
    /// Released when the file is closed (dropped).
    File {
        _lock: storage::OrderLock,
    },
    Fleet(FleetLock),
}

impl OrderHold {
    /// Cancelled when a fleet lock is lost (a file lock cannot be).
    fn lost(&self) -> Option<CancellationToken> {
        match self {
            OrderHold::File { .. } => None,
            OrderHold::Fleet(l) => Some(l.lost()),
        }
    }
}

/// The `result` label of a failed order.
fn failure_label(e: &OrderError) -> &'static str {
    if e.rate_limited() {
        "rate_limited"
    } else if matches!(e, OrderError::LockLost) {
        "lock_lost"
    } else {
        "error"
    }
}

/// How long after the `failures`-th failure in a row, `e`, the next attempt
/// is: doubling from 2 s (1 min after a failed validation), at least 1 h
/// after `rateLimited`, times `jitter`.
fn failure_delay(e: &OrderError, failures: u32, jitter: f64) -> Duration {
    let first = if e.is_validation() {
        RETRY_FIRST_VALIDATION
    } else {
        RETRY_FIRST
    };
    let wait = retry_delay(first, failures, jitter);
    if e.rate_limited() {
        wait.max(RETRY_MOST)
    } else {
        wait
    }
}

/// `first` doubled per failure after the first, capped at [`RETRY_MOST`],
/// times `jitter` (0.8–1.2) so a fleet does not retry in step.
fn retry_delay(first: Duration, failures: u32, jitter: f64) -> Duration {
    let doubled = first.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    doubled.min(RETRY_MOST).mul_f64(jitter)
}

/// A factor in 0.8–1.2 from the process's random hasher keys.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    // One division, no sum: `0.8 + 0.4` is 1.2000000000000002, past the bound.
    (8_000 + h.finish() % 4_001) as f64 / 10_000.0
}

/// The leaf's validity, issuer and serial.
fn facts(der: &[u8]) -> Result<Facts, OrderError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| OrderError::Certificate(format!("unparsable certificate: {e}")))?;
    let validity = cert.validity();
    Ok(Facts {
        not_before: validity.not_before.timestamp().max(0) as u64,
        not_after: validity.not_after.timestamp().max(0) as u64,
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string().replace(':', ""),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_the_first_delay_up_to_an_hour() {
        let s = |n| retry_delay(RETRY_FIRST, n, 1.0).as_secs();
        assert_eq!([s(1), s(2), s(3), s(4)], [2, 4, 8, 16]);
        assert_eq!(s(30), 3600);
        let v = |n| retry_delay(RETRY_FIRST_VALIDATION, n, 1.0).as_secs();
        assert_eq!([v(1), v(2), v(7), v(8)], [60, 120, 3600, 3600]);
    }

    fn problem(kind: &str) -> OrderError {
        let json = format!(
            r#"{{"type": "urn:ietf:params:acme:error:{kind}", "detail": "d", "status": 429}}"#
        );
        OrderError::Ca(instant_acme::Error::Api(
            serde_json::from_str(&json).unwrap(),
        ))
    }

    /// pebble never answers `rateLimited`: the error value instant-acme gives
    /// for the CA's problem document is built here instead.
    #[test]
    fn a_rate_limited_answer_is_counted_as_such_and_waits_at_least_an_hour() {
        let limited = problem("rateLimited");
        assert!(limited.rate_limited());
        assert_eq!(failure_label(&limited), "rate_limited");
        for failures in [1, 2, 5, 30] {
            for jitter in [0.8, 1.0, 1.2] {
                let wait = failure_delay(&limited, failures, jitter);
                assert!(
                    wait >= RETRY_MOST,
                    "{failures} failures, ×{jitter}: {wait:?}"
                );
            }
        }
        let other = problem("malformed");
        assert!(!other.rate_limited());
        assert_eq!(failure_label(&other), "error");
        assert_eq!(failure_delay(&other, 1, 1.0), RETRY_FIRST);
        assert_eq!(failure_label(&OrderError::LockLost), "lock_lost");
        let validation = OrderError::Validation {
            domain: "a.test".into(),
            detail: "connection refused".into(),
        };
        assert_eq!(failure_delay(&validation, 1, 1.0), RETRY_FIRST_VALIDATION);
        // What a CA answers the order's poll with when the challenge failed.
        let refused = problem("connection");
        assert!(refused.is_validation());
        assert_eq!(failure_delay(&refused, 1, 1.0), RETRY_FIRST_VALIDATION);
    }

    #[test]
    fn jitter_stays_within_a_fifth_either_way() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.8..=1.2).contains(&j), "{j}");
        }
    }
}
