//! What a fleet's ACME tasks share through Redis: a lock per name (`SET NX PX`, kept alive and released only by its holder) and opaque records (a certificate, a challenge in flight).
//!
//! Key names: `<prefix>acme:{<name>}:<ca>:<what>`, where `<ca>` tells CA
//! directories apart (a staging certificate is never a production one) and
//! `{<name>}` is the Redis Cluster hash tag: one name's keys live together,
//! different names spread over the shards. The records are sealed by the
//! caller (`acme::fleet`); this file only moves bytes, under the same
//! timeout and circuit breaker as every store call (`Redis::call`).

use std::time::Duration;

use super::Redis;
use crate::store::StoreError;

/// Compare-and-extend / compare-and-delete: only the token that took the lock may touch it.
const LOCK_SCRIPT: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
if ARGV[1] == 'keep' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return redis.call('DEL', KEYS[1])
"#;

fn lock_script() -> &'static ::redis::Script {
    static SCRIPT: std::sync::OnceLock<::redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| ::redis::Script::new(LOCK_SCRIPT))
}

fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

impl Redis {
    /// The Redis key of one ACME item (see the module docs).
    pub fn acme_key(&self, domain: &str, ca: &str, what: &str) -> String {
        format!("{}acme:{{{domain}}}:{ca}:{what}", self.inner.prefix)
    }

    /// Takes the lock `key` for `ttl` unless someone holds it: `SET NX PX`.
    pub async fn acme_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(key).arg(token).arg("NX").arg("PX").arg(millis(ttl));
        let cmd = &cmd;
        let reply: Option<String> = self
            .call_at(
                key,
                |mut con| async move { cmd.query_async(&mut con).await },
            )
            .await?;
        Ok(reply.is_some())
    }

    /// Extends the lock by `ttl` if `token` still holds it; false when it was lost.
    pub async fn acme_keep(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.lock_call("keep", key, token, ttl).await
    }

    /// Deletes the lock if `token` still holds it (never another holder's).
    pub async fn acme_unlock(&self, key: &str, token: &str) -> Result<bool, StoreError> {
        self.lock_call("release", key, token, Duration::ZERO).await
    }

    async fn lock_call(
        &self,
        mode: &str,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut call = lock_script().prepare_invoke();
        call.key(key).arg(mode).arg(token).arg(millis(ttl));
        let call = &call;
        let done: i64 = self
            .call_at(
                key,
                |mut con| async move { call.invoke_async(&mut con).await },
            )
            .await?;
        Ok(done == 1)
    }

    pub async fn acme_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(key);
        let cmd = &cmd;
        self.call_at(
            key,
            |mut con| async move { cmd.query_async(&mut con).await },
        )
        .await
    }

    /// Writes a record that expires after `ttl`: nothing shared outlives its use.
    pub async fn acme_put(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(key).arg(value).arg("PX").arg(millis(ttl));
        let cmd = &cmd;
        self.call_at(key, |mut con| async move {
            cmd.query_async::<()>(&mut con).await
        })
        .await
    }

    pub async fn acme_delete(&self, key: &str) -> Result<(), StoreError> {
        let mut cmd = ::redis::cmd("DEL");
        cmd.arg(key);
        let cmd = &cmd;
        self.call_at(key, |mut con| async move {
            cmd.query_async::<()>(&mut con).await
        })
        .await
    }
}
