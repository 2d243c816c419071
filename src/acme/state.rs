//! What ACME has produced, shared with the rest of tollgate: the certificate in force per managed name (read by each TLS handshake), the challenge answers in flight (tls-alpn-01 certificates, http-01 key authorizations), and each name's status for the admin API and metrics.
//!
//! The certificate table is an `ArcSwap` read once per handshake without a
//! lock and replaced whole when a certificate arrives (rare). The challenge
//! maps are behind short locks: they are read only by validation requests.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use std::path::PathBuf;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::{Mutex, RwLock};
use rustls::sign::CertifiedKey;

/// The ALPN protocol of a tls-alpn-01 validation (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The metric families [`Managed::render_metrics`] writes.
pub const EXPIRY: &str = "tollgate_certificate_expiry_seconds";
pub const FAILING: &str = "tollgate_certificate_renewal_failing";

/// How a handshake for one SNI name is answered, as far as ACME is concerned.
pub enum Lookup {
    /// A managed name with its certificate.
    Serve(Arc<CertifiedKey>),
    /// A managed name still waiting for its first certificate: the handshake
    /// fails, it is never answered with another name's certificate.
    Refuse,
    /// Not a managed name: the configured pairs decide.
    NotManaged,
}

/// One managed name's certificate facts and renewal history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainStatus {
    /// Unix seconds; `None` until a certificate is held.
    pub not_before: Option<u64>,
    pub not_after: Option<u64>,
    pub issuer: Option<String>,
    /// Hex, as `openssl x509 -serial` prints it.
    pub serial: Option<String>,
    /// Unix seconds of the last order started by this instance.
    pub last_attempt: Option<u64>,
    /// Why the last attempt failed; cleared by a success.
    pub last_error: Option<String>,
    /// Unix seconds when the next order (or renewal) is due.
    pub next_attempt: Option<u64>,
    /// Orders this instance completed and failed since it started.
    pub renewals: u64,
    pub failures: u64,
}

/// Under this much validity left, a certificate is flagged on the dashboard
/// (renewal normally happens at a third of the lifetime left: 30 days of 90).
pub const EXPIRING_WITHIN_SECS: u64 = 14 * 86_400;

/// Why a managed name needs an operator's eye.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// The last order or renewal failed (`last_error` says why).
    RenewalFailing,
    /// The certificate in force expires in under [`EXPIRING_WITHIN_SECS`].
    Expiring,
}

impl Attention {
    pub fn as_str(self) -> &'static str {
        match self {
            Attention::RenewalFailing => "renewal_failing",
            Attention::Expiring => "expiring",
        }
    }
}

impl DomainStatus {
    /// What the dashboard flags at `now` (Unix seconds): a failing renewal
    /// first, else a certificate with under 14 days left.
    pub fn attention(&self, now: u64) -> Option<Attention> {
        if self.last_error.is_some() {
            return Some(Attention::RenewalFailing);
        }
        let left = self.not_after?.saturating_sub(now);
        (left < EXPIRING_WITHIN_SECS).then_some(Attention::Expiring)
    }
}

/// The shared table (one per process, created by `run`).
#[derive(Default)]
pub struct Managed {
    /// Managed name → its certificate (`None` while the first is ordered).
    certs: ArcSwap<HashMap<String, Option<Arc<CertifiedKey>>>>,
    /// Name → the self-signed tls-alpn-01 certificate of a validation in flight.
    alpn: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    /// http-01 token → key authorization.
    http: RwLock<HashMap<String, String>>,
    status: Mutex<BTreeMap<String, DomainStatus>>,
    /// `<storage>/challenges`: where http-01 answers are also written, so
    /// that an instance sharing the storage answers a validation that
    /// another instance's order started (a fleet behind one address).
    shared: ArcSwapOption<PathBuf>,
}

impl Managed {
    /// What a handshake for `server_name` gets (names compared case-insensitively).
    pub fn lookup(&self, server_name: &str) -> Lookup {
        let certs = self.certs.load();
        if certs.is_empty() {
            return Lookup::NotManaged;
        }
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        match certs.get(&name) {
            None => Lookup::NotManaged,
            Some(None) => Lookup::Refuse,
            Some(Some(k)) => Lookup::Serve(k.clone()),
        }
    }

    /// Makes `domain` managed; its handshakes fail until a certificate is installed.
    pub fn manage(&self, domain: &str) {
        self.certs.rcu(|t| {
            let mut t = HashMap::clone(t);
            t.entry(domain.to_string()).or_insert(None);
            t
        });
        self.status.lock().entry(domain.to_string()).or_default();
    }

    /// Stops managing `domain` (a reload removed it): the configured pairs answer for it again.
    pub fn forget(&self, domain: &str) {
        self.certs.rcu(|t| {
            let mut t = HashMap::clone(t);
            t.remove(domain);
            t
        });
        self.status.lock().remove(domain);
        self.alpn.write().remove(domain);
    }

    /// Serves `key` for `domain` from the next handshake on; open connections keep theirs.
    pub fn install(&self, domain: &str, key: Arc<CertifiedKey>) {
        self.certs.rcu(|t| {
            let mut t = HashMap::clone(t);
            t.insert(domain.to_string(), Some(key.clone()));
            t
        });
    }

    pub fn alpn_certificate(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        self.alpn.read().get(&name).cloned()
    }

    pub fn set_alpn_certificate(&self, domain: &str, key: Option<Arc<CertifiedKey>>) {
        let mut alpn = self.alpn.write();
        match key {
            Some(k) => alpn.insert(domain.to_string(), k),
            None => alpn.remove(domain),
        };
    }

    /// The key authorization for an http-01 `token`, if a validation is in flight.
    pub fn http_answer(&self, token: &str) -> Option<String> {
        self.http.read().get(token).cloned()
    }

    /// Where http-01 answers are shared (set from the config in force).
    pub fn set_shared_dir(&self, dir: Option<PathBuf>) {
        self.shared.store(dir.map(Arc::new));
    }

    /// The file holding `token`'s shared answer; `None` for a token that is
    /// not base64url (never a path outside the directory) or without ACME.
    pub fn shared_answer_file(&self, token: &str) -> Option<PathBuf> {
        let valid = !token.is_empty()
            && token.len() <= 128
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let dir = self.shared.load_full()?;
        valid.then(|| dir.join(format!("http-01-{token}")))
    }

    /// An http-01 answer from this process, or else one another instance
    /// sharing the storage wrote (read on a blocking thread).
    pub async fn http_answer_anywhere(&self, token: &str) -> Option<String> {
        if let Some(a) = self.http_answer(token) {
            return Some(a);
        }
        let file = self.shared_answer_file(token)?;
        tokio::task::spawn_blocking(move || std::fs::read_to_string(file).ok())
            .await
            .ok()
            .flatten()
    }

    pub fn set_http_answer(&self, token: &str, answer: Option<String>) {
        let mut http = self.http.write();
        match answer {
            Some(a) => http.insert(token.to_string(), a),
            None => http.remove(token),
        };
    }

    /// Changes one name's status (nothing when the name is no longer managed).
    pub fn update(&self, domain: &str, f: impl FnOnce(&mut DomainStatus)) {
        if let Some(s) = self.status.lock().get_mut(domain) {
            f(s);
        }
    }

    /// `tollgate_certificate_expiry_seconds{domain}` and
    /// `tollgate_certificate_renewal_failing{domain}`, one sample per
    /// managed name (the families are written even with none).
    pub fn render_metrics(&self, out: &mut String) {
        use crate::metrics::text;
        let statuses = self.statuses();
        text::family(
            out,
            EXPIRY,
            "When the certificate served for a managed (ACME) name expires, in Unix seconds (0: none yet).",
            "gauge",
        );
        for (domain, s) in &statuses {
            let labels = text::labels(&[("domain", domain)]);
            text::sample(out, EXPIRY, &labels, s.not_after.unwrap_or(0));
        }
        text::family(
            out,
            FAILING,
            "1 when the last order or renewal of a managed (ACME) name failed, else 0.",
            "gauge",
        );
        for (domain, s) in &statuses {
            let labels = text::labels(&[("domain", domain)]);
            text::sample(out, FAILING, &labels, u8::from(s.last_error.is_some()));
        }
    }

    /// Every managed name and its status, sorted by name.
    pub fn statuses(&self) -> Vec<(String, DomainStatus)> {
        self.status
            .lock()
            .iter()
            .map(|(d, s)| (d.clone(), s.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    fn status(not_after: Option<u64>, error: Option<&str>) -> DomainStatus {
        DomainStatus {
            not_after,
            last_error: error.map(str::to_string),
            ..DomainStatus::default()
        }
    }

    #[test]
    fn a_certificate_is_flagged_under_fourteen_days_or_when_its_renewal_failed() {
        let now = 1_800_000_000;
        assert_eq!(status(Some(now + 60 * DAY), None).attention(now), None);
        assert_eq!(status(Some(now + 14 * DAY), None).attention(now), None);
        assert_eq!(
            status(Some(now + 14 * DAY - 1), None).attention(now),
            Some(Attention::Expiring)
        );
        assert_eq!(
            status(Some(now - 1), None).attention(now),
            Some(Attention::Expiring)
        );
        assert_eq!(
            status(Some(now + 60 * DAY), Some("validation failed")).attention(now),
            Some(Attention::RenewalFailing)
        );
        assert_eq!(
            status(None, Some("CA down")).attention(now),
            Some(Attention::RenewalFailing),
            "a first order that fails"
        );
        assert_eq!(
            status(None, None).attention(now),
            None,
            "a first order under way"
        );
    }
}
