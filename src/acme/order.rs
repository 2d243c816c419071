//! One certificate from the CA: the account (restored or created), an order for one name, its challenge answered through [`Managed`], the CSR (ECDSA P-256) and the chain. The protocol itself is instant-acme's.

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::fleet::{Fleet, FleetError, SharedChallenge};
use super::state::Managed;
use super::storage::{Storage, Stored};
use crate::config::acme::{AcmeChallenge, AcmeConfig};

/// `urn:ietf:params:acme:error:rateLimited`: the CA asks us to slow down.
const RATE_LIMITED: &str = "urn:ietf:params:acme:error:rateLimited";

/// How long one order may wait for the CA to validate, then to issue.
const VALIDATION_BUDGET: Duration = Duration::from_secs(90);

/// Why a certificate could not be obtained, with what the retry schedule needs.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The CA answered with a problem document, or could not be reached.
    #[error("ACME CA: {0}")]
    Ca(#[source] instant_acme::Error),
    /// The CA tried the challenge and it failed (DNS, firewall, port 80/443 not tollgate's).
    #[error("validation of {domain} failed: {detail}")]
    Validation { domain: String, detail: String },
    /// The storage directory could not be read or written.
    #[error("storage: {0}")]
    Storage(#[source] std::io::Error),
    /// The CA's certificate or our key could not be used.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The fleet's shared state in Redis could not be read or written.
    #[error("fleet: {0}")]
    Fleet(#[from] FleetError),
    /// The Redis lock on the name could not be kept: another instance may be ordering it.
    #[error("the fleet's lock on the name was lost (Redis unreachable, or it expired); the order was abandoned")]
    LockLost,
}

impl OrderError {
    /// The CA said `rateLimited`.
    pub fn rate_limited(&self) -> bool {
        matches!(self, OrderError::Ca(instant_acme::Error::Api(p)) if p.r#type.as_deref() == Some(RATE_LIMITED))
    }

    /// A failed validation: retried slowly (CAs limit failed validations per name and hour).
    pub fn is_validation(&self) -> bool {
        match self {
            OrderError::Validation { .. } => true,
            OrderError::Ca(e) => is_validation_problem(e),
            _ => false,
        }
    }
}

/// RFC 8555 §6.7 problem types by which the CA says it tried the challenge
/// and it failed; pebble and Let's Encrypt answer the order's poll with one.
const VALIDATION_PROBLEMS: [&str; 6] = [
    "caa",
    "connection",
    "dns",
    "incorrectResponse",
    "tls",
    "unauthorized",
];

fn is_validation_problem(e: &instant_acme::Error) -> bool {
    let instant_acme::Error::Api(p) = e else {
        return false;
    };
    p.r#type
        .as_deref()
        .and_then(|t| t.strip_prefix("urn:ietf:params:acme:error:"))
        .is_some_and(|t| VALIDATION_PROBLEMS.contains(&t))
}

impl From<instant_acme::Error> for OrderError {
    fn from(e: instant_acme::Error) -> Self {
        OrderError::Ca(e)
    }
}

/// The HTTP client instant-acme speaks through: rustls (ring) trusting
/// `directory_ca` when given, else the system's CA certificates.
fn http_client(
    config: &AcmeConfig,
    directory_ca: Option<&[u8]>,
) -> Result<Box<dyn instant_acme::HttpClient>, OrderError> {
    let mut roots = rustls::RootCertStore::empty();
    match directory_ca {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem) {
                let c = c.map_err(|e| OrderError::Certificate(format!("directory_ca: {e}")))?;
                let _ = roots.add(c);
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err(OrderError::Certificate(format!(
            "no CA certificate to verify {}",
            config.directory
        )));
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| OrderError::Certificate(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client: hyper_util::client::legacy::Client<_, instant_acme::BodyWrapper<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    Ok(Box::new(client))
}

/// The account for this CA: restored from storage, or created (and saved).
/// Blocking reads happen on a blocking thread.
pub async fn account(config: &AcmeConfig, storage: &Storage) -> Result<Account, OrderError> {
    let ca_path = config.directory_ca.clone();
    let st = storage.clone();
    let (saved, ca) = tokio::task::spawn_blocking(move || {
        let ca = ca_path.map(std::fs::read).transpose()?;
        Ok::<_, std::io::Error>((st.account()?, ca))
    })
    .await
    .map_err(|e| OrderError::Storage(std::io::Error::other(e)))?
    .map_err(OrderError::Storage)?;
    let builder = Account::builder_with_http(http_client(config, ca.as_deref())?);
    if let Some(json) = saved {
        if let Ok(creds) = serde_json::from_slice::<AccountCredentials>(&json) {
            return Ok(builder.from_credentials(creds).await?);
        }
        tracing::warn!("ACME account file unreadable; creating a new account");
    }
    let contact = config.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, creds) = builder
        .create(
            &NewAccount {
                contact: &contacts,
                // Configuring ACME is agreeing to the CA's terms (docs/TLS.md says so).
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            config.directory.clone(),
            None,
        )
        .await?;
    let json = serde_json::to_vec(&creds).map_err(|e| OrderError::Storage(e.into()))?;
    let st = storage.clone();
    tokio::task::spawn_blocking(move || st.save_account(&json))
        .await
        .map_err(|e| OrderError::Storage(std::io::Error::other(e)))?
        .map_err(OrderError::Storage)?;
    tracing::info!(directory = %config.directory, "ACME account created");
    Ok(account)
}

/// Removes a challenge's answer when the order ends, however it ends.
struct Answer<'a> {
    managed: &'a Managed,
    domain: String,
    token: Option<String>,
    /// Set once the answer is published to the fleet.
    fleet: Option<Arc<Fleet>>,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if let Some(fleet) = &self.fleet {
            fleet.clear_challenge(&self.domain);
        }
        self.managed.set_alpn_certificate(&self.domain, None);
        if let Some(t) = &self.token {
            self.managed.set_http_answer(t, None);
            if let Some(file) = self.managed.shared_answer_file(t) {
                // A small unlink; a leftover answer is harmless (the token is spent).
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

/// Writes an http-01 answer where instances sharing the storage find it.
async fn share_http_answer(managed: &Managed, token: &str, answer: &str) -> Result<(), OrderError> {
    let Some(file) = managed.shared_answer_file(token) else {
        return Ok(());
    };
    let answer = answer.to_string();
    tokio::task::spawn_blocking(move || {
        // 0700 like the rest of the storage; replaced whole, so an instance
        // reading it never sees half an answer.
        if let Some(dir) = file.parent() {
            super::storage::private_dir(dir)?;
        }
        super::storage::write_private(&file, answer.as_bytes())
    })
    .await
    .map_err(|e| OrderError::Storage(std::io::Error::other(e)))?
    .map_err(OrderError::Storage)
}

/// Orders a certificate for `domain`, answering `challenge` through
/// `managed` and, in a fleet, through Redis for the other instances.
///
/// The CA's verdict that the challenge failed is reported as a validation
/// of `domain` whichever call of the order brought it: usually the order's
/// poll, but a loaded CI run once got pebble's `connection` problem from
/// another call, and the operator's report must not depend on that race.
pub async fn obtain(
    account: &Account,
    domain: &str,
    challenge: AcmeChallenge,
    managed: &Managed,
    fleet: Option<&Arc<Fleet>>,
) -> Result<Stored, OrderError> {
    place(account, domain, challenge, managed, fleet)
        .await
        .map_err(|e| match e {
            OrderError::Ca(e) => ca_error(domain, e),
            other => other,
        })
}

/// [`obtain`]'s steps: the order, its challenge answered, the CA's
/// validation awaited, the certificate finalized and fetched.
async fn place(
    account: &Account,
    domain: &str,
    challenge: AcmeChallenge,
    managed: &Managed,
    fleet: Option<&Arc<Fleet>>,
) -> Result<Stored, OrderError> {
    let ids = [Identifier::Dns(domain.to_string())];
    let mut order = account.new_order(&NewOrder::new(&ids)).await?;
    let answer = answer_challenges(&mut order, domain, challenge, managed, fleet).await?;
    let retries = RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(VALIDATION_BUDGET);
    let status = order.poll_ready(&retries).await?;
    if status != OrderStatus::Ready {
        return Err(OrderError::Validation {
            domain: domain.to_string(),
            detail: validation_detail(&mut order).await,
        });
    }
    drop(answer);
    let (key, csr) = key_and_csr(domain)?;
    order.finalize_csr(&csr).await?;
    let chain_pem = order.poll_certificate(&retries).await?;
    Ok(Stored {
        chain_pem,
        key_pem: key.serialize_pem(),
    })
}

/// [`place`]'s first step: the challenge of each authorization not yet
/// valid answered (here, and to the fleet if there is one) and marked
/// ready; the answers stand until the returned [`Answer`] is dropped.
async fn answer_challenges<'m>(
    order: &mut instant_acme::Order,
    domain: &str,
    challenge: AcmeChallenge,
    managed: &'m Managed,
    fleet: Option<&Arc<Fleet>>,
) -> Result<Answer<'m>, OrderError> {
    let mut answer = Answer {
        managed,
        domain: domain.to_string(),
        token: None,
        fleet: None,
    };
    let kind = match challenge {
        AcmeChallenge::Http01 => ChallengeType::Http01,
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        if authz.status == AuthorizationStatus::Valid {
            continue;
        }
        let mut ch = authz
            .challenge(kind.clone())
            .ok_or_else(|| OrderError::Validation {
                domain: domain.to_string(),
                detail: format!("the CA offers no {} challenge", challenge.as_str()),
            })?;
        let key_auth = ch.key_authorization();
        let shared = match challenge {
            AcmeChallenge::Http01 => {
                managed.set_http_answer(&ch.token, Some(key_auth.as_str().to_string()));
                answer.token = Some(ch.token.clone());
                share_http_answer(managed, &ch.token, key_auth.as_str()).await?;
                SharedChallenge::Http {
                    token: ch.token.clone(),
                    answer: key_auth.as_str().to_string(),
                }
            }
            AcmeChallenge::TlsAlpn01 => {
                let (chain_pem, key_pem) = alpn_certificate(domain, key_auth.digest().as_ref())?;
                let cert = certified_key(&chain_pem, &key_pem)?;
                managed.set_alpn_certificate(domain, Some(Arc::new(cert)));
                SharedChallenge::Alpn { chain_pem, key_pem }
            }
        };
        if let Some(fleet) = fleet {
            fleet.publish_challenge(domain, &shared).await?;
            answer.fleet = Some(fleet.clone());
            // The others read it within a second: the CA may ask any of them.
            tokio::time::sleep(super::fleet::CHALLENGE_SPREAD).await;
        }
        ch.set_ready().await?;
    }
    Ok(answer)
}

/// An error from the CA: its verdict on our answer (a validation failure,
/// backed off for longer) or a CA/transport error.
fn ca_error(domain: &str, e: instant_acme::Error) -> OrderError {
    if is_validation_problem(&e) {
        OrderError::Validation {
            domain: domain.to_string(),
            detail: e.to_string(),
        }
    } else {
        OrderError::Ca(e)
    }
}

/// A fresh ECDSA P-256 key for `domain` and the DER of its CSR.
fn key_and_csr(domain: &str) -> Result<(rcgen::KeyPair, Vec<u8>), OrderError> {
    let certificate = |e: rcgen::Error| OrderError::Certificate(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(certificate)?;
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_string()]).map_err(certificate)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key).map_err(certificate)?;
    Ok((key, csr.der().as_ref().to_vec()))
}

/// What the CA said about a failed challenge, from the authorizations.
async fn validation_detail(order: &mut instant_acme::Order) -> String {
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        if let Ok(state) = authz.refresh().await {
            if let Some(p) = state.challenges.iter().find_map(|c| c.error.as_ref()) {
                return p.to_string();
            }
        }
    }
    "the order became invalid".into()
}

/// The tls-alpn-01 certificate (RFC 8737): self-signed for `domain`, with
/// the critical acmeIdentifier extension holding the key authorization's SHA-256.
/// Returns its chain and key in PEM (what a fleet shares).
fn alpn_certificate(domain: &str, digest: &[u8]) -> Result<(String, String), OrderError> {
    let err = |e: rcgen::Error| OrderError::Certificate(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(err)?;
    let mut params = rcgen::CertificateParams::new(vec![domain.to_string()]).map_err(err)?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A chain and key in PEM as rustls serves them.
pub fn certified_key(chain_pem: &str, key_pem: &str) -> Result<CertifiedKey, OrderError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| OrderError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(OrderError::Certificate(
            "no certificate in the chain".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| OrderError::Certificate(e.to_string()))?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| OrderError::Certificate(e.to_string()))?;
    Ok(CertifiedKey::new(chain, signing))
}

/// [`certified_key`] for a certificate to serve (not a tls-alpn-01 one,
/// whose critical acmeIdentifier extension webpki refuses to parse): the key
/// must be the certificate's — a key file swapped or damaged beside its
/// chain would fail every handshake.
pub fn matching_key(chain_pem: &str, key_pem: &str) -> Result<CertifiedKey, OrderError> {
    let certified = certified_key(chain_pem, key_pem)?;
    certified.keys_match().map_err(|e| {
        OrderError::Certificate(format!(
            "the private key does not match the certificate: {e}"
        ))
    })?;
    Ok(certified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: &str) -> instant_acme::Error {
        let json = format!(
            r#"{{"type": "urn:ietf:params:acme:error:{kind}", "detail": "refused", "status": 400}}"#
        );
        instant_acme::Error::Api(serde_json::from_str(&json).unwrap())
    }

    #[test]
    fn the_cas_verdict_on_a_challenge_names_the_domain_whichever_call_brought_it() {
        let e = ca_error("a.test", problem("connection"));
        assert!(
            matches!(&e, OrderError::Validation { domain, .. } if domain == "a.test"),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with("validation of a.test failed: "),
            "{e}"
        );
        assert!(e.is_validation());
        let other = ca_error("a.test", problem("malformed"));
        assert!(matches!(other, OrderError::Ca(_)), "{other:?}");
        assert!(other.to_string().starts_with("ACME CA: "), "{other}");
    }
}
