//! Browsers prove themselves: signed proof-of-work challenges, the check of a solution, and the signed pass that then identifies the browser.
//!
//! Nothing here keeps state per client: a challenge and a pass carry what
//! they bind (site, client address block, expiry, the key that signed
//! them) under an HMAC, so checking one costs one MAC (and, for a
//! solution, one SHA-256), and every tollgate that holds the same secret
//! file accepts what another issued. A solved challenge always yields the
//! same pass id (it is derived from the challenge's random), so replaying a
//! solution does not mint fresh identities.
//!
//! What does keep state is the allowance of new passes per address block
//! (`identity.pass.issue_limit` per `ttl`, counted by the app in the
//! limiter store): past it a solution still earns a pass, which lets its
//! browser through the challenge but identifies no browser — `key: pass`
//! counts its holder as its address. A pass also names the difficulty it
//! was solved at, and opens no route that asks for more.
//!
//! The request path uses it through `app/challenge.rs`: the pass a request
//! carries becomes `Client::pass` (what `key: pass` counts on), the pass
//! path ([`PASS_PATH`]) turns a solution into a cookie, and a route's
//! `challenge:` answers browsers without a pass with [`page`] — or, under
//! `mode: metarefresh`, with [`refresh`]'s page, whose URL
//! ([`REFRESH_PATH`]) earns a pass of difficulty 0 — except for what
//! [`public`] lets through.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, COOKIE};
use ipnet::IpNet;
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::config::PassConfig;
use crate::limiter::{Algorithm, Nanos};
use crate::metrics::{inc, Counter, Histogram, Metrics};
pub use token::TokenFault;
use token::{hex, SigningKey};

pub mod crawler;
pub mod page;
pub mod public;
pub mod refresh;
pub mod token;

pub use public::is_public;
pub use refresh::REFRESH_PATH;

/// The tollgate-owned path a solution is posted to (never forwarded).
pub const PASS_PATH: &str = "/.well-known/tollgate/pass";
/// The cookie that holds the pass.
pub const COOKIE_NAME: &str = "tollgate_pass";
/// How long a challenge may take from issue to solution: long enough for a
/// slow phone, short enough that a stockpile of challenges goes stale.
pub const CHALLENGE_TTL: Duration = Duration::from_secs(600);
/// The most of a solution's form that is read.
pub const FORM_LIMIT: usize = 2048;
/// The longest return path a solution may carry.
const RETURN_MAX: usize = 1024;
/// The most `tollgate_pass` cookies of one request that are checked (a MAC
/// each): a browser may hold a stale one beside its good one, or have one
/// planted, but a client may send any number.
pub const MAX_PASS_COOKIES: usize = 8;

const NANOS: u64 = 1_000_000_000;

/// The pass and challenge rules of one config snapshot.
pub struct ChallengeGate {
    /// Oldest first; the last one signs.
    keys: Vec<SigningKey>,
    ttl: Duration,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    /// `issue_limit` new passes per address block per `ttl` (see [`ChallengeGate::grant`]).
    issue: Algorithm,
    rng: SystemRandom,
    metrics: GateMetrics,
    crawlers: crawler::Crawlers,
}

impl std::fmt::Debug for ChallengeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        write!(f, "ChallengeGate(keys: {ids:?})")
    }
}

struct GateMetrics {
    issued: Counter,
    /// By the hash the page used: `subtle` (WebCrypto) or `js` (its own SHA-256).
    solved_subtle: Counter,
    solved_js: Counter,
    /// Refresh URLs followed (`challenge.mode: metarefresh`).
    solved_refresh: Counter,
    failed: [Counter; TokenFault::ALL.len()],
    verified: Counter,
    rejected: [Counter; TokenFault::ALL.len()],
    solve_time: Arc<Histogram>,
    /// Solutions whose address block had used its allowance of new passes.
    issue_refused: Counter,
}

pub const ISSUED: &str = "tollgate_challenges_issued_total";
pub const SOLVED: &str = "tollgate_challenges_solved_total";
pub const FAILED: &str = "tollgate_challenges_failed_total";
pub const VERIFIED: &str = "tollgate_passes_verified_total";
pub const REJECTED: &str = "tollgate_passes_rejected_total";
pub const SOLVE_TIME: &str = "tollgate_challenge_solve_seconds";
pub const ISSUE_REFUSED: &str = "tollgate_pass_issue_refused_total";

impl GateMetrics {
    fn new(m: &Metrics) -> GateMetrics {
        GateMetrics {
            issued: m.counter(ISSUED, &[]),
            solved_subtle: m.counter(SOLVED, &[("via", "subtle")]),
            solved_js: m.counter(SOLVED, &[("via", "js")]),
            solved_refresh: m.counter(SOLVED, &[("via", "metarefresh")]),
            failed: TokenFault::ALL.map(|r| m.counter(FAILED, &[("reason", r.as_str())])),
            verified: m.counter(VERIFIED, &[]),
            // A pass has no nonce: `unsolved` never happens to one.
            rejected: TokenFault::ALL.map(|r| match r {
                TokenFault::Unsolved => Counter::default(),
                r => m.counter(REJECTED, &[("reason", r.as_str())]),
            }),
            solve_time: m.histogram(SOLVE_TIME, &[]),
            issue_refused: m.counter(ISSUE_REFUSED, &[]),
        }
    }
}

/// Creates every challenge and pass series at zero, whether or not the
/// config has `identity.pass`: dashboards and alerts see 0, not "no data".
pub fn start_at_zero(metrics: &Metrics) {
    GateMetrics::new(metrics);
    crawler::start_at_zero(metrics);
}

/// A solution as the page posts it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Solution {
    pub challenge: String,
    pub nonce: String,
    /// Where the browser was going: a path on this site.
    pub back: String,
    /// How long the page took, in ms (its own report; only a metric).
    pub solve_ms: Option<u64>,
    /// `subtle` or `js`: which SHA-256 the page used.
    pub via: String,
}

impl Solution {
    /// Reads an `application/x-www-form-urlencoded` body: `c`, `n`, `r`, `ms`, `via`.
    pub fn from_form(body: &[u8]) -> Solution {
        let mut s = Solution::default();
        for pair in body.split(|&b| b == b'&') {
            let mut kv = pair.splitn(2, |&b| b == b'=');
            let (Some(k), Some(v)) = (kv.next(), kv.next()) else {
                continue;
            };
            let v = form_decode(v);
            match k {
                b"c" => s.challenge = v,
                b"n" => s.nonce = v,
                b"r" => s.back = v,
                b"ms" => s.solve_ms = v.parse().ok(),
                b"via" => s.via = v,
                _ => {}
            }
        }
        s
    }
}

fn form_decode(v: &[u8]) -> String {
    let plus: Vec<u8> = v
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_encoding::percent_decode(&plus)
        .decode_utf8_lossy()
        .into_owned()
}

/// A challenge whose solution holds: what its pass will bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    random: String,
    site: String,
    /// The address block (`203.0.113.0/24`) it was issued to: what the
    /// allowance of new passes is counted on.
    pub prefix: String,
    bits: u8,
    back: String,
}

/// The valid pass a request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedPass {
    /// `pass:<id>`, what `key: pass` counts on; `None` for a pass that
    /// counts as its holder's address (issued past the block's allowance).
    pub key: Option<String>,
    /// The difficulty it was solved at: it opens routes asking no more.
    pub bits: u8,
}

/// A pass made from a solved challenge: the cookie to set and where to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The whole `Set-Cookie` value.
    pub cookie: String,
    /// A path on this site (`/` when the one posted was not safe to follow).
    pub back: String,
}

impl ChallengeGate {
    /// `None` when the config has no pass keys (validated but not loaded).
    pub fn new(config: &PassConfig, metrics: &Metrics) -> Option<ChallengeGate> {
        if config.keys.0.is_empty() {
            return None;
        }
        Some(ChallengeGate {
            keys: config
                .keys
                .0
                .iter()
                .map(|k| SigningKey::new(&k.id, &k.secret))
                .collect(),
            ttl: config.ttl,
            ipv4_prefix: config.ipv4_prefix,
            ipv6_prefix: config.ipv6_prefix,
            issue: config.issue_limiter().algorithm,
            rng: SystemRandom::new(),
            metrics: GateMetrics::new(metrics),
            crawlers: crawler::Crawlers::new(&config.crawlers, metrics),
        })
    }

    /// What the client is as a crawler: let through without a challenge
    /// (`crawlers.cidrs`, or a `verify` user-agent its network or its
    /// reverse DNS confirms), a refuted claim, or no claim.
    pub async fn crawler(
        &self,
        ip: IpAddr,
        network: &crate::networks::Network,
        headers: &HeaderMap,
        now: Nanos,
    ) -> crawler::Crawler {
        let ua = headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok());
        self.crawlers.check(ip, network, ua, now).await
    }

    /// A fresh CSP nonce for one page (16 random bytes in hex).
    pub fn page_nonce(&self) -> String {
        let mut n = [0u8; 16];
        let _ = self.rng.fill(&mut n);
        hex(&n)
    }

    fn signing_key(&self) -> &SigningKey {
        self.keys.last().expect("a gate has at least one key")
    }

    /// The address block a pass from `ip` is bound to, e.g. `203.0.113.0/24`.
    pub fn prefix(&self, ip: IpAddr) -> String {
        let len = match ip {
            IpAddr::V4(_) => self.ipv4_prefix,
            IpAddr::V6(_) => self.ipv6_prefix,
        };
        IpNet::new(ip, len)
            .map(|n| n.trunc().to_string())
            .unwrap_or_else(|_| ip.to_string())
    }

    /// A new challenge for a browser at `ip` on `host`, signed with the newest key.
    pub fn issue(&self, host: &str, ip: IpAddr, bits: u8, now: Nanos) -> String {
        let mut random = [0u8; 16];
        // The system RNG failing is not something a request can recover
        // from; a zero random only makes two challenges alike, never a pass forgeable.
        let _ = self.rng.fill(&mut random);
        inc(&self.metrics.issued);
        let key = self.signing_key();
        token::write_challenge(
            key,
            &token::Challenge {
                key_id: &key.id,
                expires: now / NANOS + CHALLENGE_TTL.as_secs(),
                bits,
                random: &hex(&random),
                site: &site(host),
                prefix: &self.prefix(ip),
            },
        )
    }

    /// A solved challenge's pass, with a fresh identity (see [`ChallengeGate::grant`]).
    pub fn redeem(
        &self,
        s: &Solution,
        host: &str,
        ip: IpAddr,
        now: Nanos,
        secure: bool,
    ) -> Result<Granted, TokenFault> {
        let solved = self.solve(s, host, ip, now)?;
        Ok(self.grant(&solved, true, now, secure))
    }

    /// Checks a posted solution: one MAC, then the binding, then one hash.
    pub fn solve(
        &self,
        s: &Solution,
        host: &str,
        ip: IpAddr,
        now: Nanos,
    ) -> Result<Solved, TokenFault> {
        let c = match self.check_solution(s, host, ip, now) {
            Ok(c) => c,
            Err(r) => {
                inc(&self.metrics.failed[r as usize]);
                return Err(r);
            }
        };
        match s.via.as_str() {
            "js" => inc(&self.metrics.solved_js),
            _ => inc(&self.metrics.solved_subtle),
        }
        if let Some(ms) = s.solve_ms {
            // The page's own report, so bounded: a client cannot skew the histogram's sum.
            let ms = ms.min(CHALLENGE_TTL.as_millis() as u64);
            self.metrics.solve_time.observe(Duration::from_millis(ms));
        }
        Ok(Solved {
            random: c.random.to_string(),
            site: c.site.to_string(),
            prefix: c.prefix.to_string(),
            bits: c.bits,
            back: safe_return(&s.back).to_string(),
        })
    }

    /// The limit on new passes per address block, as the store counts it
    /// (under [`crate::key::for_pass_issue`] of [`Solved::prefix`]).
    pub fn issue_limit(&self) -> &Algorithm {
        &self.issue
    }

    /// The pass `solved` earns. `fresh`: the address block's allowance of
    /// new passes had room, and the pass gets an identity of its own; else
    /// (counted) one that counts as its holder's address, which still lets
    /// the browser through the challenge — no browser is sent round the
    /// challenge again and again because its neighbours solved first.
    /// `secure`: the request came over TLS (the cookie is then `Secure`).
    pub fn grant(&self, solved: &Solved, fresh: bool, now: Nanos, secure: bool) -> Granted {
        // One solved challenge, one pass id: replaying it mints nothing new.
        let id = if fresh {
            let digest = Sha256::new()
                .chain_update(b"tollgate-pass-id")
                .chain_update(solved.random.as_bytes())
                .finalize();
            hex(&digest[..16])
        } else {
            inc(&self.metrics.issue_refused);
            token::COUNTS_AS_ADDRESS.to_string()
        };
        let key = self.signing_key();
        let max_age = self.ttl.as_secs();
        let pass = token::write_pass(
            key,
            &token::Pass {
                key_id: &key.id,
                id: &id,
                expires: now / NANOS + max_age,
                bits: solved.bits,
                site: &solved.site,
                prefix: &solved.prefix,
            },
        );
        let secure = if secure { "; Secure" } else { "" };
        Granted {
            cookie: format!(
                "{COOKIE_NAME}={pass}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"
            ),
            back: solved.back.clone(),
        }
    }

    fn check_solution<'s>(
        &self,
        s: &'s Solution,
        host: &str,
        ip: IpAddr,
        now: Nanos,
    ) -> Result<token::Challenge<'s>, TokenFault> {
        if s.nonce.is_empty() || s.nonce.len() > 20 || !s.nonce.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(TokenFault::Malformed);
        }
        let c = token::read_challenge(&s.challenge, &self.keys)?;
        bound(c.expires, c.site, c.prefix, self, host, ip, now)?;
        let digest = Sha256::new()
            .chain_update(s.challenge.as_bytes())
            .chain_update(s.nonce.as_bytes())
            .finalize();
        if token::leading_zero_bits(&digest) < u32::from(c.bits) {
            return Err(TokenFault::Unsolved);
        }
        Ok(c)
    }

    /// The first valid pass among the request's `tollgate_pass` cookies
    /// (at most [`MAX_PASS_COOKIES`] are checked; each that does not hold is
    /// counted by reason): a bad cookie beside a good one, stale or planted,
    /// does not hide the good one.
    pub fn pass_of(
        &self,
        headers: &HeaderMap,
        host: &str,
        ip: IpAddr,
        now: Nanos,
    ) -> Option<CarriedPass> {
        pass_cookies(headers)
            .take(MAX_PASS_COOKIES)
            .find_map(|text| self.check_pass(text, host, ip, now))
    }

    fn check_pass(&self, text: &str, host: &str, ip: IpAddr, now: Nanos) -> Option<CarriedPass> {
        let checked = token::read_pass(text, &self.keys)
            .and_then(|p| bound(p.expires, p.site, p.prefix, self, host, ip, now).map(|()| p));
        match checked {
            Ok(p) => {
                inc(&self.metrics.verified);
                let key = (p.id != token::COUNTS_AS_ADDRESS)
                    .then(|| format!("{}{}", crate::key::PASS, p.id));
                Some(CarriedPass { key, bits: p.bits })
            }
            Err(r) => {
                inc(&self.metrics.rejected[r as usize]);
                None
            }
        }
    }
}

/// Expiry, site and address block, the checks a challenge and a pass share.
fn bound(
    expires: u64,
    token_site: &str,
    prefix: &str,
    gate: &ChallengeGate,
    host: &str,
    ip: IpAddr,
    now: Nanos,
) -> Result<(), TokenFault> {
    if expires <= now / NANOS {
        return Err(TokenFault::Expired);
    }
    if token_site != site(host) {
        return Err(TokenFault::OtherSite);
    }
    if prefix != gate.prefix(ip) {
        return Err(TokenFault::OtherPrefix);
    }
    Ok(())
}

/// A site as tokens name it: 8 hex digits of SHA-256 of the host (without
/// port), so any Host a client sends fits a cookie unchanged.
fn site(host: &str) -> String {
    hex(&Sha256::digest(host.as_bytes())[..4])
}

/// The values of the `tollgate_pass` cookies, in the order they came.
fn pass_cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| {
            let (name, value) = c.trim().split_once('=')?;
            (name == COOKIE_NAME).then_some(value)
        })
}

/// Takes the `tollgate_pass` cookies out of the `Cookie` header(s), and
/// nothing else: the pass is tollgate's, never the upstream's. A header
/// left with no cookie goes; the others keep their cookies in their order.
pub fn strip_pass_cookies(headers: &mut HeaderMap) {
    let carries = |v: &http::HeaderValue| {
        v.as_bytes()
            .windows(COOKIE_NAME.len())
            .any(|w| w == COOKIE_NAME.as_bytes())
    };
    // Most requests carry none: they are not rewritten.
    if !headers.get_all(COOKIE).iter().any(carries) {
        return;
    }
    let values: Vec<http::HeaderValue> = headers.get_all(COOKIE).iter().cloned().collect();
    headers.remove(COOKIE);
    for value in values {
        if !carries(&value) {
            headers.append(COOKIE, value);
            continue;
        }
        // Not text: no pass could be read from it either; it stays as it came.
        let Ok(text) = value.to_str() else {
            headers.append(COOKIE, value);
            continue;
        };
        let kept: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .filter(|c| c.split_once('=').map_or(*c, |(name, _)| name) != COOKIE_NAME)
            .collect();
        if kept.is_empty() {
            continue;
        }
        if let Ok(v) = http::HeaderValue::from_str(&kept.join("; ")) {
            headers.append(COOKIE, v);
        }
    }
}

/// `back` if it is a path on this site, else `/`: one leading `/` (`//x`
/// and `/\x` are other hosts to a browser), printable ASCII, bounded.
pub fn safe_return(back: &str) -> &str {
    if back.len() <= RETURN_MAX && crate::location::is_local(back) {
        back
    } else {
        "/"
    }
}

/// Whether the client asks for a page a person reads: `Accept` names
/// `text/html` with a non-zero weight (read as the error pages read it:
/// [`crate::page::quality`], so `Q=0` refuses as `q=0` does, and a
/// malformed weight is no weight). `*/*` alone (curl, most libraries) is
/// not a browser.
pub fn prefers_html(headers: &HeaderMap) -> bool {
    crate::page::accepts(headers, &["text/html"])
}

#[cfg(test)]
mod tests;
