//! `server.tls.acme` and `server.tls.hsts` as validated config: which CA, which names, which challenge, where state is kept; pure (no I/O, the CA is never contacted).

use std::path::PathBuf;
use std::time::Duration;

use super::Validator;
use crate::config::raw::{RawAcme, RawHsts};

/// Let's Encrypt's production directory: the default.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// Let's Encrypt's staging directory (untrusted certificates, generous rate limits).
pub const LETS_ENCRYPT_STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";
/// Where account, certificates and keys are kept unless `storage` says otherwise.
pub const DEFAULT_STORAGE: &str = "/var/lib/tollgate/acme";

/// How the CA checks that tollgate controls a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// A self-signed certificate on the TLS listener, chosen by ALPN `acme-tls/1`.
    TlsAlpn01,
    /// `/.well-known/acme-challenge/<token>` on a plain listener (port 80).
    Http01,
}

impl AcmeChallenge {
    pub fn as_str(self) -> &'static str {
        match self {
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Http01 => "http-01",
        }
    }
}

/// `server.tls.acme`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct AcmeConfig {
    pub directory: String,
    pub directory_ca: Option<PathBuf>,
    /// `mailto:` is added when the account is created.
    pub email: Option<String>,
    /// Lower-case DNS names, each validated alone (never a wildcard): the
    /// explicit list, or every exact `host` the routes name.
    pub domains: Vec<String>,
    pub challenge: AcmeChallenge,
    pub storage: PathBuf,
    /// Renew when this much validity is left; `None`: at two thirds of the lifetime.
    pub renew_before: Option<Duration>,
    /// `shared_key_file`: its key is filled in when the config is loaded (the file is read there).
    pub shared_key_file: Option<PathBuf>,
    pub shared_key: Option<SharedKey>,
}

/// The fewest characters of the secret in `shared_key_file`.
pub const MIN_SHARED_SECRET: usize = 32;

/// The 256-bit key that seals what instances share through Redis (see
/// `acme::fleet`): SHA-256 of a label and the file's secret, so the file
/// holds text an operator can generate (`openssl rand -hex 32`).
#[derive(Clone, PartialEq, Eq)]
pub struct SharedKey(pub [u8; 32]);

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedKey(<secret>)")
    }
}

impl SharedKey {
    /// The key of the secret in `text` (surrounding whitespace is not part of it).
    pub fn parse(text: &str) -> Result<SharedKey, String> {
        use sha2::{Digest, Sha256};
        let secret = text.trim();
        if secret.chars().count() < MIN_SHARED_SECRET {
            return Err(format!(
                "the secret needs at least {MIN_SHARED_SECRET} characters (e.g. `openssl rand -hex 32`)"
            ));
        }
        let mut h = Sha256::new();
        h.update(b"tollgate-acme-shared-key\0");
        h.update(secret.as_bytes());
        Ok(SharedKey(h.finalize().into()))
    }
}

/// `server.tls.hsts`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct HstsConfig {
    pub max_age: Duration,
    pub include_subdomains: bool,
    pub preload: bool,
}

impl HstsConfig {
    /// The `Strict-Transport-Security` value.
    pub fn header_value(&self) -> String {
        let mut v = format!("max-age={}", self.max_age.as_secs());
        if self.include_subdomains {
            v.push_str("; includeSubDomains");
        }
        if self.preload {
            v.push_str("; preload");
        }
        v
    }
}

/// Whether `name` is a DNS name a CA can validate by http-01 or tls-alpn-01:
/// letters, digits and `-` in labels of 1–63, at least two labels, not an IP.
pub fn is_orderable_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 || name.parse::<std::net::IpAddr>().is_ok() {
        return false;
    }
    let labels: Vec<&str> = name.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && !labels
            .last()
            .unwrap_or(&"")
            .bytes()
            .all(|b| b.is_ascii_digit())
}

impl Validator<'_> {
    /// `server.tls.acme`; `has_plain_listener`: `server.tls.listen` is set, so
    /// `server.listen` stays plain and can answer http-01. Domains left empty
    /// here are filled from the routes by [`Validator::acme_domains_from_routes`].
    pub(super) fn acme(&mut self, raw: &RawAcme, has_plain_listener: bool) -> AcmeConfig {
        let directory = raw
            .directory
            .as_ref()
            .map_or(LETS_ENCRYPT.to_string(), |t| t.0.clone());
        if !directory.starts_with("https://") {
            self.err(
                "server.tls.acme.directory",
                format!("{directory:?} is not an https:// URL (Let's Encrypt: {LETS_ENCRYPT}, staging: {LETS_ENCRYPT_STAGING})"),
            );
        }
        let email = raw.email.as_ref().map(|t| t.0.trim().to_string());
        if let Some(e) = &email {
            let ok = e.split_once('@').is_some_and(|(user, domain)| {
                !user.is_empty() && domain.contains('.') && !e.contains(char::is_whitespace)
            });
            if !ok {
                self.err(
                    "server.tls.acme.email",
                    format!("{e:?} is not an email address"),
                );
            }
        }
        let challenge = match raw.challenge.as_ref().map(|t| t.0.as_str()) {
            None | Some("tls-alpn-01") => AcmeChallenge::TlsAlpn01,
            Some("http-01") => AcmeChallenge::Http01,
            Some(other) => {
                self.err(
                    "server.tls.acme.challenge",
                    format!("unknown challenge {other:?}; use tls-alpn-01 or http-01"),
                );
                AcmeChallenge::TlsAlpn01
            }
        };
        if challenge == AcmeChallenge::Http01 && !has_plain_listener {
            self.err(
                "server.tls.acme.challenge",
                "http-01 needs a plain listener (port 80): set server.tls.listen so server.listen stays plain, or use tls-alpn-01",
            );
        }
        let domains = self.acme_domains(raw);
        if let Some(r) = raw.renew_before {
            if r.0 < Duration::from_secs(60) {
                self.err("server.tls.acme.renew_before", "must be at least 1m");
            }
        }
        AcmeConfig {
            directory,
            directory_ca: raw.directory_ca.as_ref().map(|t| PathBuf::from(&t.0)),
            email,
            domains,
            challenge,
            storage: raw
                .storage
                .as_ref()
                .map_or(PathBuf::from(DEFAULT_STORAGE), |t| PathBuf::from(&t.0)),
            renew_before: raw.renew_before.map(|d| d.0),
            shared_key_file: raw.shared_key_file.as_ref().map(|t| PathBuf::from(&t.0)),
            shared_key: None,
        }
    }

    /// `server.tls.acme.domains`: lower-case names a CA can validate, each
    /// once; wildcards and an empty list are errors.
    fn acme_domains(&mut self, raw: &RawAcme) -> Vec<String> {
        let mut domains = Vec::new();
        for (i, d) in raw.domains.iter().flatten().enumerate() {
            let name = d.0.trim_end_matches('.').to_ascii_lowercase();
            let path = format!("server.tls.acme.domains[{i}]");
            if name.starts_with("*.") {
                self.err(path, format!("{name:?}: a wildcard needs dns-01, which tollgate does not answer; list the names"));
            } else if !is_orderable_name(&name) {
                self.err(
                    path,
                    format!("{name:?} is not a DNS name a CA can validate"),
                );
            } else if !domains.contains(&name) {
                domains.push(name);
            }
        }
        if raw.domains.as_ref().is_some_and(|d| d.is_empty()) {
            self.err(
                "server.tls.acme.domains",
                "an empty list orders nothing; remove the key to order every host the routes name",
            );
        }
        domains
    }

    /// With the Redis store, instances share certificates and private keys
    /// through Redis, sealed with `shared_key_file`'s key: it is required.
    pub(super) fn acme_fleet(&mut self, acme: &AcmeConfig, redis_store: bool) {
        if redis_store && acme.shared_key_file.is_none() {
            self.err(
                "server.tls.acme.shared_key_file",
                "required with store.backend: redis: the fleet shares certificates and their private keys through Redis, encrypted with this secret (write one with `openssl rand -hex 32 > /etc/tollgate/acme.key`)",
            );
        }
    }

    /// Without `domains`, every exact route `host` (wildcards and IPs left
    /// out: they cannot be validated); none at all is an error.
    pub(super) fn acme_domains_from_routes(
        &mut self,
        acme: &mut AcmeConfig,
        hosts: impl Iterator<Item = String>,
    ) {
        if !acme.domains.is_empty() {
            return;
        }
        for h in hosts {
            let h = h.trim_end_matches('.').to_ascii_lowercase();
            if is_orderable_name(&h) && !acme.domains.contains(&h) {
                acme.domains.push(h);
            }
        }
        if acme.domains.is_empty() {
            self.err(
                "server.tls.acme.domains",
                "no domain to order: list them, or give routes a `match.host`",
            );
        }
    }

    pub(super) fn hsts(&mut self, raw: &RawHsts) -> HstsConfig {
        HstsConfig {
            max_age: raw
                .max_age
                .map_or(Duration::from_secs(365 * 86_400), |d| d.0),
            include_subdomains: raw.include_subdomains.unwrap_or(false),
            preload: raw.preload.unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_key_needs_a_long_secret_and_ignores_surrounding_whitespace() {
        assert!(SharedKey::parse("short")
            .unwrap_err()
            .contains("at least 32"));
        let secret = "0123456789abcdef0123456789abcdef";
        let key = SharedKey::parse(secret).unwrap();
        assert_eq!(SharedKey::parse(&format!("  {secret}\n")).unwrap(), key);
        assert_ne!(SharedKey::parse(&format!("{secret}x")).unwrap(), key);
        assert_eq!(format!("{key:?}"), "SharedKey(<secret>)", "never printed");
    }

    #[test]
    fn orderable_names_are_dns_names_of_two_labels_or_more() {
        for ok in ["a.test", "www.example.com", "x-1.a.test"] {
            assert!(is_orderable_name(ok), "{ok}");
        }
        for bad in [
            "localhost",
            "127.0.0.1",
            "*.a.test",
            "-a.test",
            "a..test",
            "a_b.test",
            "",
            "1.2",
        ] {
            assert!(!is_orderable_name(bad), "{bad}");
        }
    }
}
