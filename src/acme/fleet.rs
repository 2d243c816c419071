//! A fleet on one Redis store: each name's order lock, its certificate and the challenge in flight, shared through Redis and sealed (ChaCha20-Poly1305) with the key of `shared_key_file`, so Redis never holds a private key in the clear.
//!
//! - **Lock**: `SET NX PX` with a random token, kept alive every third of
//!   [`LOCK_TTL`] by a compare-and-extend script and released by a
//!   compare-and-delete one: a holder never deletes another's lock. When it
//!   cannot be kept (Redis gone, or it expired and someone else took it), the
//!   holder's order is abandoned ([`FleetLock::lost`]).
//! - **Certificate**: one record per name and CA, expiring with the
//!   certificate; the others read it on every look at the name.
//! - **Challenge**: the holder publishes its http-01 answer or tls-alpn-01
//!   certificate and waits [`CHALLENGE_SPREAD`] before telling the CA it is
//!   ready; an instance waiting for the lock reads it every second and answers
//!   the validation too (the CA may reach any instance behind the address).
//!
//! A record is `tg1` ‖ nonce ‖ ciphertext; the Redis key is the associated
//! data, so a record copied under another name does not open.

use std::sync::Arc;
use std::time::Duration;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::storage::Stored;
use crate::config::acme::SharedKey;
use crate::store::redis::Redis;
use crate::store::StoreError;

/// How long a lock outlives its holder's last sign of life.
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long the holder waits between publishing a challenge and asking for
/// validation: more than the others' poll ([`super::LOCK_WAIT`]).
pub const CHALLENGE_SPREAD: Duration = Duration::from_millis(2500);
/// A published challenge expires on its own after this long.
const CHALLENGE_TTL: Duration = Duration::from_secs(300);
const MAGIC: &[u8] = b"tg1";

/// Why a shared record could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("Redis: {0}")]
    Redis(#[from] StoreError),
    /// Not sealed with this instance's key (a different `shared_key_file`) or damaged.
    #[error("the shared record {key} does not open with this shared_key_file (a different secret on another instance, or a damaged record)")]
    Unreadable { key: String },
}

/// A challenge answer one instance publishes for the others.
#[derive(Debug, Clone, PartialEq)]
pub enum SharedChallenge {
    Http { token: String, answer: String },
    Alpn { chain_pem: String, key_pem: String },
}

/// One CA's shared state in Redis.
pub struct Fleet {
    redis: Redis,
    key: SharedKey,
    /// Tells CA directories apart (as the storage directory does).
    ca: String,
}

impl Fleet {
    pub fn new(redis: Redis, key: SharedKey, ca: String) -> Fleet {
        Fleet { redis, key, ca }
    }

    fn key_of(&self, domain: &str, what: &str) -> String {
        self.redis.acme_key(domain, &self.ca, what)
    }

    /// The name's shared certificate, if any.
    pub async fn certificate(&self, domain: &str) -> Result<Option<Stored>, FleetError> {
        let key = self.key_of(domain, "cert");
        let Some(sealed) = self.redis.acme_get(&key).await? else {
            return Ok(None);
        };
        let plain = open(&self.key, &key, &sealed).ok_or(FleetError::Unreadable { key })?;
        let text = String::from_utf8_lossy(&plain);
        let (chain, private) = text.split_once('\0').unwrap_or((&text, ""));
        Ok(Some(Stored {
            chain_pem: chain.to_string(),
            key_pem: private.to_string(),
        }))
    }

    /// Shares `stored` until it expires (`ttl`).
    pub async fn save_certificate(
        &self,
        domain: &str,
        stored: &Stored,
        ttl: Duration,
    ) -> Result<(), FleetError> {
        let key = self.key_of(domain, "cert");
        // PEM never holds a NUL: it separates the chain from the key.
        let plain = format!("{}\0{}", stored.chain_pem, stored.key_pem);
        let sealed = seal(&self.key, &key, plain.as_bytes());
        Ok(self.redis.acme_put(&key, &sealed, ttl).await?)
    }

    /// Takes the name's lock without waiting: `None` when another instance holds it.
    pub async fn try_lock(&self, domain: &str) -> Result<Option<FleetLock>, FleetError> {
        let key = self.key_of(domain, "lock");
        let token = random_token();
        if !self.redis.acme_lock(&key, &token, LOCK_TTL).await? {
            return Ok(None);
        }
        let stop = CancellationToken::new();
        let lost = CancellationToken::new();
        tokio::spawn(keep_alive(
            self.redis.clone(),
            key.clone(),
            token.clone(),
            stop.clone(),
            lost.clone(),
        ));
        Ok(Some(FleetLock {
            redis: self.redis.clone(),
            key,
            token,
            stop,
            lost,
        }))
    }

    pub async fn publish_challenge(
        &self,
        domain: &str,
        challenge: &SharedChallenge,
    ) -> Result<(), FleetError> {
        let key = self.key_of(domain, "challenge");
        let value = match challenge {
            SharedChallenge::Http { token, answer } => {
                json!({"http": {"token": token, "answer": answer}})
            }
            SharedChallenge::Alpn { chain_pem, key_pem } => {
                json!({"alpn": {"chain": chain_pem, "key": key_pem}})
            }
        };
        let sealed = seal(&self.key, &key, value.to_string().as_bytes());
        Ok(self.redis.acme_put(&key, &sealed, CHALLENGE_TTL).await?)
    }

    /// The challenge another instance published for `domain`, if any.
    pub async fn challenge(&self, domain: &str) -> Result<Option<SharedChallenge>, FleetError> {
        let key = self.key_of(domain, "challenge");
        let Some(sealed) = self.redis.acme_get(&key).await? else {
            return Ok(None);
        };
        let unreadable = || FleetError::Unreadable { key: key.clone() };
        let plain = open(&self.key, &key, &sealed).ok_or_else(unreadable)?;
        let v: Value = serde_json::from_slice(&plain).map_err(|_| unreadable())?;
        let text = |v: &Value| v.as_str().map(str::to_string).ok_or_else(unreadable);
        if let Some(h) = v.get("http") {
            return Ok(Some(SharedChallenge::Http {
                token: text(&h["token"])?,
                answer: text(&h["answer"])?,
            }));
        }
        let a = v.get("alpn").ok_or_else(unreadable)?;
        Ok(Some(SharedChallenge::Alpn {
            chain_pem: text(&a["chain"])?,
            key_pem: text(&a["key"])?,
        }))
    }

    /// Withdraws the published challenge (from a spawned task: called on drop).
    pub fn clear_challenge(self: &Arc<Self>, domain: &str) {
        let key = self.key_of(domain, "challenge");
        let redis = self.redis.clone();
        // Outside a runtime (a process ending) the record expires on its own.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = redis.acme_delete(&key).await {
                tracing::debug!(error = %e, "ACME: shared challenge not withdrawn; it expires on its own");
            }
        });
    }
}

/// A name's lock in Redis, kept alive until dropped.
pub struct FleetLock {
    redis: Redis,
    key: String,
    token: String,
    stop: CancellationToken,
    lost: CancellationToken,
}

impl FleetLock {
    /// Cancelled when the lock could not be kept: the order must stop.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }
}

impl Drop for FleetLock {
    fn drop(&mut self) {
        self.stop.cancel();
        let (redis, key, token) = (self.redis.clone(), self.key.clone(), self.token.clone());
        // Outside a runtime (a process ending) the lock expires on its own.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // A release that fails leaves the lock to expire (LOCK_TTL).
            let _ = redis.acme_unlock(&key, &token).await;
        });
    }
}

/// Extends the lock every third of its TTL; cancels `lost` when it is gone
/// or when no extension succeeded for a whole TTL (it may have expired).
async fn keep_alive(
    redis: Redis,
    key: String,
    token: String,
    stop: CancellationToken,
    lost: CancellationToken,
) {
    let mut last_kept = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOCK_TTL / 3) => {}
        }
        match redis.acme_keep(&key, &token, LOCK_TTL).await {
            Ok(true) => last_kept = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::warn!(%key, "ACME: the order lock was lost (expired, another instance holds it); abandoning the order");
                lost.cancel();
                return;
            }
            Err(e) if last_kept.elapsed() >= LOCK_TTL - LOCK_TTL / 3 => {
                tracing::warn!(%key, error = %e, "ACME: the order lock could not be kept; abandoning the order");
                lost.cancel();
                return;
            }
            Err(e) => tracing::debug!(%key, error = %e, "ACME: lock extension failed; retrying"),
        }
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 16];
    // The system RNG failing leaves zeros: the lock still works, tokens just collide.
    let _ = SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn aead(key: &SharedKey) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key.0).expect("a 32-byte key"))
}

/// `tg1` ‖ a random nonce ‖ the ciphertext and its tag; `aad` is the Redis key.
pub fn seal(key: &SharedKey, aad: &str, plain: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system's random generator");
    let mut body = plain.to_vec();
    aead(key)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad.as_bytes()),
            &mut body,
        )
        .expect("a record far below ChaCha20's limit");
    [MAGIC, &nonce, &body].concat()
}

/// The plaintext of a record sealed under `aad` with `key`; `None` otherwise.
pub fn open(key: &SharedKey, aad: &str, sealed: &[u8]) -> Option<Vec<u8>> {
    let rest = sealed.strip_prefix(MAGIC)?;
    if rest.len() < NONCE_LEN {
        return None;
    }
    let (nonce, body) = rest.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut body = body.to_vec();
    let plain = aead(key)
        .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut body)
        .ok()?;
    Some(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(secret: &str) -> SharedKey {
        SharedKey::parse(secret).unwrap()
    }

    #[test]
    fn a_sealed_record_opens_only_with_its_key_under_its_own_name() {
        let k = key("0123456789abcdef0123456789abcdef");
        let sealed = seal(&k, "acme:{a.test}:x:cert", b"-----BEGIN PRIVATE KEY-----");
        assert!(!sealed.windows(b"PRIVATE".len()).any(|w| w == b"PRIVATE"));
        assert_eq!(
            open(&k, "acme:{a.test}:x:cert", &sealed).unwrap(),
            b"-----BEGIN PRIVATE KEY-----"
        );
        assert!(
            open(&k, "acme:{b.test}:x:cert", &sealed).is_none(),
            "another name"
        );
        let other = key("another secret of thirty-two characters");
        assert!(
            open(&other, "acme:{a.test}:x:cert", &sealed).is_none(),
            "another key"
        );
        let mut damaged = sealed.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert!(
            open(&k, "acme:{a.test}:x:cert", &damaged).is_none(),
            "damaged"
        );
        assert!(
            open(&k, "acme:{a.test}:x:cert", b"tg1").is_none(),
            "truncated"
        );
    }

    #[test]
    fn two_seals_of_the_same_text_differ() {
        let k = key("0123456789abcdef0123456789abcdef");
        assert_ne!(seal(&k, "n", b"same"), seal(&k, "n", b"same"));
    }
}
