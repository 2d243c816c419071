//! Automatic HTTPS: one background task per managed name that loads its certificate from storage, orders one when it is missing or due for renewal, and puts it in force — with backoff on failure and a lock so instances sharing the storage order a name once.
//!
//! The lifecycle of a name (`domain_loop`):
//!
//! 1. its stored certificate, if any, is served at once (restart: no order);
//! 2. when none is stored or it is due (two thirds of its lifetime, or
//!    `renew_before` before expiry), the name's lock is taken without
//!    waiting; an instance that finds it held waits a moment and reads the
//!    storage again: the holder's certificate is what it will serve;
//! 3. under the lock the storage is read once more (another instance may
//!    just have finished), then the order runs ([`order::obtain`]);
//! 4. success: saved (0600), served from the next handshake on; failure:
//!    retried after a jittered, doubling delay — from 2 s for a CA that
//!    cannot be reached, from 1 min for a failed validation, and at least
//!    1 h when the CA says `rateLimited` — capped at 1 h.
//!
//! Until a name has its first certificate its handshakes fail (see
//! [`state::Managed::lookup`]); every other name is served as before. A
//! reload that adds a name starts its task, one that removes it stops it.

pub mod order;
pub mod state;
pub mod storage;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::Account;
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::acme::AcmeConfig;
use order::OrderError;
use state::Managed;
use storage::{Storage, Stored};

/// How often the set of names is compared with the config in force.
const CONFIG_POLL: Duration = Duration::from_secs(1);
/// How long an instance that found a name's lock held waits before reading the storage again.
const LOCK_WAIT: Duration = Duration::from_secs(2);
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
    for result in ["ok", "error", "rate_limited"] {
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
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
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
            return wait;
        }
        let lock = {
            let (st, d) = (storage.clone(), self.domain.clone());
            self.blocking(move || st.try_lock(&d)).await
        };
        let _lock = match lock {
            Ok(Some(l)) => l,
            // Another instance orders it: its certificate will be in the storage.
            Ok(None) => return LOCK_WAIT,
            Err(e) => return self.failed(failures, OrderError::Storage(e)),
        };
        // It may have finished between our read and our lock.
        if let Some(wait) = self.serve_stored(&storage).await {
            return wait;
        }
        let now = self.now_secs();
        self.managed
            .update(&self.domain, |s| s.last_attempt = Some(now));
        tracing::info!(domain = %self.domain, challenge = self.config.challenge.as_str(), "ACME: ordering a certificate");
        match self.order(&storage).await {
            Ok(stored) => {
                let st = storage.clone();
                let (d, s) = (self.domain.clone(), stored.clone());
                if let Err(e) = self.blocking(move || st.save_certificate(&d, &s)).await {
                    return self.failed(failures, OrderError::Storage(e));
                }
                *failures = 0;
                self.count("ok");
                self.managed.update(&self.domain, |s| {
                    s.renewals += 1;
                    s.last_error = None;
                });
                match self.install(&stored) {
                    Ok(facts) => {
                        tracing::info!(domain = %self.domain, serial = %facts.serial, not_after = facts.not_after, "ACME: certificate in force");
                        self.until_renewal(&facts)
                    }
                    Err(e) => self.failed(failures, e),
                }
            }
            Err(e) => self.failed(failures, e),
        }
    }

    /// Serves the stored certificate, if any; `Some(wait)` when it is not yet due.
    async fn serve_stored(&self, storage: &Storage) -> Option<Duration> {
        let st = storage.clone();
        let d = self.domain.clone();
        let stored = self.blocking(move || st.certificate(&d)).await.ok()??;
        match self.install(&stored) {
            Ok(facts) => {
                let wait = self.until_renewal(&facts);
                (!wait.is_zero()).then_some(wait)
            }
            Err(e) => {
                tracing::warn!(domain = %self.domain, error = %e, "ACME: stored certificate unusable; ordering a new one");
                None
            }
        }
    }

    /// Puts `stored` in force and records its facts.
    fn install(&self, stored: &Stored) -> Result<Facts, OrderError> {
        let key = order::certified_key(&stored.chain_pem, &stored.key_pem)?;
        let facts = facts(key.cert[0].as_ref())?;
        if facts.not_after <= self.now_secs() {
            return Err(OrderError::Certificate(format!(
                "expired (serial {})",
                facts.serial
            )));
        }
        self.managed.install(&self.domain, Arc::new(key));
        self.managed.update(&self.domain, |s| {
            s.not_before = Some(facts.not_before);
            s.not_after = Some(facts.not_after);
            s.issuer = Some(facts.issuer.clone());
            s.serial = Some(facts.serial.clone());
        });
        Ok(facts)
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
        order::obtain(&account, &self.domain, self.config.challenge, &self.managed).await
    }

    /// Records a failure; returns the jittered delay before the next attempt.
    fn failed(&self, failures: &mut u32, e: OrderError) -> Duration {
        *failures = failures.saturating_add(1);
        let limited = e.rate_limited();
        self.count(if limited { "rate_limited" } else { "error" });
        let first = if e.is_validation() {
            RETRY_FIRST_VALIDATION
        } else {
            RETRY_FIRST
        };
        let mut wait = retry_delay(first, *failures, jitter());
        if limited {
            wait = wait.max(RETRY_MOST);
        }
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

    #[test]
    fn jitter_stays_within_a_fifth_either_way() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.8..=1.2).contains(&j), "{j}");
        }
    }
}
