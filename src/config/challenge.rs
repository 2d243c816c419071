//! `identity.pass` and `routes[].challenge`: raw YAML → [`PassConfig`], [`ChallengeConfig`]; pure, every problem with its path, and the pass key file's format.
//!
//! The secret file is read by the loader (`load::read_pass_file`) once the
//! config is valid, like the API key file; [`PassKeys::parse`] is the pure
//! half of that, so its rules are tested without a file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{dur, Dur, KeyPart, LimiterConfig, RouteConfig, Text, Validator};

/// The difficulty a route gets without `difficulty:`: leading zero bits of
/// SHA-256(challenge ‖ nonce), so 2^14 = 16,384 hashes on average. The
/// page's own SHA-256 (the slower of its two) does ~170,000 hashes per CPU
/// second in V8 on the project's build machine, so ~0.1 s there and well
/// under a second on a phone several times slower; 16 bits would be ~0.4 s
/// there and over a second on such a phone (docs/IDENTITY.md,
/// "Scrapers and crawler fleets").
pub const DEFAULT_DIFFICULTY: u8 = 14;
/// 2^24 hashes is already minutes on a phone: more is a denial of service on people.
pub const MAX_DIFFICULTY: u8 = 24;
/// A pass is good for this long without `ttl:`.
pub const DEFAULT_PASS_TTL: Duration = Duration::from_secs(7 * 86_400);
/// The shortest secret a line of the pass key file may hold (`openssl rand -hex 32` gives 64).
pub const MIN_SECRET_LEN: usize = 32;
/// The most keys the file may hold: each is tried only by its id, but a
/// rotation needs two or three, never hundreds.
pub const MAX_PASS_KEYS: usize = 16;

/// New passes an address block may earn per pass `ttl` without
/// `issue_limit:`. The passes of one block that hold at once were issued
/// within one `ttl`, which a fixed window of `ttl` splits in at most two:
/// at most 4 of them, so `key: pass` gives one address at most 5 times
/// what `key: ip` gives it (4 passes, and the address itself).
pub const DEFAULT_ISSUE_LIMIT: u64 = 2;
/// The store name of the limiter on issuing passes: a `.` no configured
/// limiter name may hold, so it never meets one.
pub const ISSUE_LIMITER: &str = "tollgate.pass-issue";

/// `identity.pass: { secret_file, ttl, ipv4_prefix, ipv6_prefix, issue_limit }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPass {
    pub secret_file: Option<Text>,
    pub ttl: Option<Dur>,
    pub ipv4_prefix: Option<u8>,
    pub ipv6_prefix: Option<u8>,
    pub issue_limit: Option<u64>,
    pub crawlers: Option<RawCrawlers>,
}

/// `identity.pass.crawlers`: who is let through without a challenge.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCrawlers {
    pub resolver: Option<Text>,
    pub timeout: Option<Dur>,
    pub cache_size: Option<u64>,
    pub cache_ttl: Option<Dur>,
    #[serde(default)]
    pub cidrs: Vec<Text>,
    #[serde(default)]
    pub verify: Vec<RawVerify>,
}

/// One crawler confirmed by forward-confirmed reverse DNS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub user_agent: Text,
    #[serde(default)]
    pub domains: Vec<Text>,
    /// AS numbers (`identity.geoip.asn_db`) the crawler's addresses lie in.
    #[serde(default)]
    pub asn: Vec<Text>,
}

/// `routes[].challenge: { mode: proof_of_work | metarefresh, when: always | over_limit, difficulty: 16, unverified_crawlers: challenge, exempt_public: true }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChallenge {
    pub mode: Option<Text>,
    pub when: Option<Text>,
    pub difficulty: Option<u8>,
    pub unverified_crawlers: Option<Text>,
    pub exempt_public: Option<bool>,
}

/// Signed passes and challenges: the keys, how long a pass lasts, and the
/// address block it is bound to.
#[derive(Debug, Clone)]
pub struct PassConfig {
    pub secret_file: PathBuf,
    /// The file's keys, read by the loader (empty straight out of `validate`).
    pub keys: Arc<PassKeys>,
    pub ttl: Duration,
    /// A pass made for an IPv4 client holds for its /24 (by default): a
    /// phone moving between addresses of one carrier block keeps its pass.
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// New passes one address block (`ipv4_prefix`, `ipv6_prefix`) may earn
    /// per `ttl`; past it a solution earns a pass that counts as its address.
    pub issue_limit: u64,
    /// Crawlers let through without a challenge.
    pub crawlers: CrawlerConfig,
}

impl PassConfig {
    /// The limiter on issuing passes, as the store keeps it: `issue_limit`
    /// per address block in a fixed window of `ttl` (see [`DEFAULT_ISSUE_LIMIT`]).
    pub fn issue_limiter(&self) -> LimiterConfig {
        let window = self.ttl.as_nanos().min(u128::from(u64::MAX)) as u64;
        LimiterConfig {
            name: ISSUE_LIMITER.to_string(),
            algorithm: crate::limiter::Algorithm::FixedWindow(
                crate::limiter::fixed_window::FixedWindow {
                    limit: self.issue_limit,
                    window,
                },
            ),
            key: Vec::new(),
            shadow: false,
            overrides: Vec::new(),
            reject: None,
            count: None,
            ban: None,
            lease: None,
        }
    }
}

/// `identity.pass.crawlers`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrawlerConfig {
    /// The DNS server asked (UDP) for reverse and forward lookups.
    pub resolver: SocketAddr,
    pub timeout: Duration,
    /// Addresses remembered (confirmed or not) at most; the cache is cleared when full.
    pub cache_size: usize,
    pub cache_ttl: Duration,
    /// Addresses let through whatever their user-agent.
    pub cidrs: Vec<IpNet>,
    pub verify: Vec<VerifyRule>,
}

/// No crawler let through: nothing in `cidrs`, nothing to verify.
impl Default for CrawlerConfig {
    fn default() -> CrawlerConfig {
        CrawlerConfig {
            resolver: SocketAddr::from(([127, 0, 0, 1], 53)),
            timeout: Duration::from_secs(1),
            cache_size: 10_000,
            cache_ttl: Duration::from_secs(3600),
            cidrs: Vec::new(),
            verify: Vec::new(),
        }
    }
}

/// A user-agent (lowercase substring) and the domains its PTR names must lie in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyRule {
    pub user_agent: String,
    pub domains: Vec<String>,
    /// The client's AS (from `identity.geoip.asn_db`) is one of these: a
    /// check without DNS, for fetchers whose operator publishes its network
    /// but no reverse DNS.
    pub asn: Vec<u32>,
}

/// When a route challenges a browser that has no valid pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeWhen {
    /// Every such request ("under attack").
    Always,
    /// Only when the route's limiters refuse it: the page instead of the 429.
    OverLimit,
}

impl ChallengeWhen {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeWhen::Always => "always",
            ChallengeWhen::OverLimit => "over_limit",
        }
    }
}

/// What a route does with a request whose user-agent names a crawler of
/// `identity.pass.crawlers.verify` that its address's reverse DNS does not
/// confirm (a scraper dressed as Googlebot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnverifiedCrawlers {
    /// Like any other client: a browser-like one is challenged by `when`,
    /// others get the usual answers.
    AsOthers,
    /// The challenge page at once, whatever `when` and its `Accept` say:
    /// a real browser with an odd user-agent can still pass, a script cannot.
    Challenge,
    /// `403` at once (problem+json, or a page for a browser).
    Refuse,
}

impl UnverifiedCrawlers {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            UnverifiedCrawlers::AsOthers => "as_others",
            UnverifiedCrawlers::Challenge => "challenge",
            UnverifiedCrawlers::Refuse => "refuse",
        }
    }
}

/// What a browser is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeMode {
    /// Find a nonce in JavaScript (`difficulty` leading zero bits).
    ProofOfWork,
    /// Follow a `<meta http-equiv="refresh">` and keep a cookie: no
    /// JavaScript, no work; its pass is of difficulty 0 and opens no
    /// proof-of-work route.
    MetaRefresh,
}

impl ChallengeMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeMode::ProofOfWork => "proof_of_work",
            ChallengeMode::MetaRefresh => "metarefresh",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengeConfig {
    pub mode: ChallengeMode,
    pub when: ChallengeWhen,
    /// Leading zero bits the solution's hash needs; 0 under `metarefresh`
    /// (so any pass opens the route).
    pub difficulty: u8,
    pub unverified_crawlers: UnverifiedCrawlers,
    /// robots.txt, `/.well-known/`, favicon.ico and feeds are never
    /// challenged (see `challenge::is_public`).
    pub exempt_public: bool,
}

impl ChallengeConfig {
    /// The difficulty of a proof-of-work page shown on this route for
    /// another reason (a CrowdSec `captcha`): the route's own, or the
    /// default on a `metarefresh` route, whose tier is too weak for that.
    pub fn work_difficulty(&self) -> u8 {
        match self.mode {
            ChallengeMode::ProofOfWork => self.difficulty,
            ChallengeMode::MetaRefresh => DEFAULT_DIFFICULTY,
        }
    }
}

/// One secret of the pass key file, known by an id derived from it.
#[derive(Clone, PartialEq, Eq)]
pub struct PassKey {
    /// 8 hex digits of SHA-256("tollgate-pass-key" ‖ secret): what a pass
    /// names, so the secret itself never leaves the file.
    pub id: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for PassKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PassKey({})", self.id)
    }
}

/// The keys of the pass key file, oldest first: the last one signs, all verify.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassKeys(pub Vec<PassKey>);

impl PassKeys {
    /// One secret per line (blank lines and `#` comments skipped), at
    /// least [`MIN_SECRET_LEN`] characters each, at most [`MAX_PASS_KEYS`].
    /// Rotation: append a new line (it signs from the next reload on), and
    /// remove the old one once the passes it signed have expired.
    pub fn parse(text: &str) -> Result<PassKeys, String> {
        let mut keys: Vec<PassKey> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.len() < MIN_SECRET_LEN {
                return Err(format!(
                    "line {}: a secret needs at least {MIN_SECRET_LEN} characters (e.g. `openssl rand -hex 32`)",
                    n + 1
                ));
            }
            let key = PassKey::new(line.as_bytes());
            if keys.iter().any(|k| k.id == key.id) {
                return Err(format!("line {}: the same secret twice", n + 1));
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err("no secret in the file; write one per line".into());
        }
        if keys.len() > MAX_PASS_KEYS {
            return Err(format!(
                "{} secrets; at most {MAX_PASS_KEYS} (remove the oldest)",
                keys.len()
            ));
        }
        Ok(PassKeys(keys))
    }
}

impl PassKey {
    pub fn new(secret: &[u8]) -> PassKey {
        let mut h = Sha256::new();
        h.update(b"tollgate-pass-key");
        h.update(secret);
        let digest = h.finalize();
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        PassKey {
            id,
            secret: secret.to_vec(),
        }
    }
}

impl Validator<'_> {
    pub(super) fn pass(&mut self, raw: Option<&RawPass>) -> Option<PassConfig> {
        let raw = raw?;
        let Some(file) = &raw.secret_file else {
            self.err(
                "identity.pass.secret_file",
                "missing: the file of secrets that sign challenges and passes",
            );
            return None;
        };
        let ttl = dur(raw.ttl, DEFAULT_PASS_TTL);
        if ttl < Duration::from_secs(60) {
            self.err("identity.pass.ttl", "must be at least 1m");
        }
        let v4 = raw.ipv4_prefix.unwrap_or(24);
        if !(8..=32).contains(&v4) {
            self.err("identity.pass.ipv4_prefix", "must be between 8 and 32");
        }
        let v6 = raw.ipv6_prefix.unwrap_or(64);
        if !(16..=128).contains(&v6) {
            self.err("identity.pass.ipv6_prefix", "must be between 16 and 128");
        }
        let issue_limit = raw.issue_limit.unwrap_or(DEFAULT_ISSUE_LIMIT);
        if !(1..=1_000_000).contains(&issue_limit) {
            self.err("identity.pass.issue_limit", "must be between 1 and 1000000");
        }
        let crawlers = self.crawlers(&raw.crawlers.clone().unwrap_or_default());
        Some(PassConfig {
            secret_file: PathBuf::from(&file.0),
            keys: Arc::default(),
            ttl,
            ipv4_prefix: v4.clamp(8, 32),
            ipv6_prefix: v6.clamp(16, 128),
            issue_limit: issue_limit.clamp(1, 1_000_000),
            crawlers,
        })
    }

    fn crawlers(&mut self, raw: &RawCrawlers) -> CrawlerConfig {
        let at = "identity.pass.crawlers";
        let resolver = match &raw.resolver {
            None => SocketAddr::from(([127, 0, 0, 1], 53)),
            Some(t) => t.0.parse().unwrap_or_else(|_| {
                self.err(
                    format!("{at}.resolver"),
                    format!("{:?} is not IP:port (e.g. 127.0.0.1:53)", t.0),
                );
                SocketAddr::from(([127, 0, 0, 1], 53))
            }),
        };
        let cache_size = raw.cache_size.unwrap_or(10_000);
        if !(1..=1_000_000).contains(&cache_size) {
            self.err(format!("{at}.cache_size"), "must be between 1 and 1000000");
        }
        let verify = raw
            .verify
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if v.user_agent.0.trim().is_empty() || (v.domains.is_empty() && v.asn.is_empty()) {
                    self.err(
                        format!("{at}.verify[{i}]"),
                        "needs a user_agent and at least one domain or asn",
                    );
                }
                let asn = v
                    .asn
                    .iter()
                    .enumerate()
                    .filter_map(|(j, t)| {
                        let digits = t.0.trim().trim_start_matches("AS").trim_start_matches("as");
                        let n = digits.parse::<u32>().ok();
                        if n.is_none() {
                            self.err(
                                format!("{at}.verify[{i}].asn[{j}]"),
                                format!("{:?} is not an AS number (e.g. 32934 or AS32934)", t.0),
                            );
                        }
                        n
                    })
                    .collect();
                VerifyRule {
                    asn,
                    user_agent: v.user_agent.0.trim().to_ascii_lowercase(),
                    domains: v
                        .domains
                        .iter()
                        .map(|d| d.0.trim().trim_matches('.').to_ascii_lowercase())
                        .collect(),
                }
            })
            .collect();
        CrawlerConfig {
            resolver,
            timeout: dur(raw.timeout, Duration::from_secs(1)),
            cache_size: cache_size.clamp(1, 1_000_000) as usize,
            cache_ttl: dur(raw.cache_ttl, Duration::from_secs(3600)),
            cidrs: self.cidrs(&format!("{at}.cidrs"), &raw.cidrs),
            verify,
        }
    }

    pub(super) fn challenge(&mut self, path: &str, raw: &RawChallenge) -> ChallengeConfig {
        let when = match raw.when.as_ref().map(|t| t.0.as_str()) {
            None | Some("over_limit") => ChallengeWhen::OverLimit,
            Some("always") => ChallengeWhen::Always,
            Some(other) => {
                self.err(
                    format!("{path}.when"),
                    format!("unknown value {other:?} (always or over_limit)"),
                );
                ChallengeWhen::OverLimit
            }
        };
        let mode = self.challenge_mode(path, raw);
        let difficulty = raw.difficulty.unwrap_or(DEFAULT_DIFFICULTY);
        if !(1..=MAX_DIFFICULTY).contains(&difficulty) {
            self.err(
                format!("{path}.difficulty"),
                format!("must be between 1 and {MAX_DIFFICULTY} bits"),
            );
        }
        let difficulty = match mode {
            ChallengeMode::ProofOfWork => difficulty.clamp(1, MAX_DIFFICULTY),
            ChallengeMode::MetaRefresh => 0,
        };
        ChallengeConfig {
            mode,
            when,
            difficulty,
            unverified_crawlers: self.unverified_crawlers(path, raw),
            exempt_public: raw.exempt_public.unwrap_or(true),
        }
    }

    fn challenge_mode(&mut self, path: &str, raw: &RawChallenge) -> ChallengeMode {
        match raw.mode.as_ref().map(|t| t.0.as_str()) {
            None | Some("proof_of_work") => ChallengeMode::ProofOfWork,
            Some("metarefresh") => {
                if raw.difficulty.is_some() {
                    self.err(
                        format!("{path}.difficulty"),
                        "`metarefresh` asks no work: leave `difficulty` out (or use `mode: proof_of_work`)",
                    );
                }
                ChallengeMode::MetaRefresh
            }
            Some(other) => {
                self.err(
                    format!("{path}.mode"),
                    format!("unknown value {other:?} (proof_of_work or metarefresh)"),
                );
                ChallengeMode::ProofOfWork
            }
        }
    }

    fn unverified_crawlers(&mut self, path: &str, raw: &RawChallenge) -> UnverifiedCrawlers {
        match raw.unverified_crawlers.as_ref().map(|t| t.0.as_str()) {
            None | Some("as_others") => UnverifiedCrawlers::AsOthers,
            Some("challenge") => UnverifiedCrawlers::Challenge,
            Some("refuse") => UnverifiedCrawlers::Refuse,
            Some(other) => {
                self.err(
                    format!("{path}.unverified_crawlers"),
                    format!("unknown value {other:?} (as_others, challenge or refuse)"),
                );
                UnverifiedCrawlers::AsOthers
            }
        }
    }

    /// Challenges and `key: pass` need the secret that signs them.
    pub(super) fn need_pass(
        &mut self,
        pass: Option<&PassConfig>,
        routes: &[RouteConfig],
        limiters: &[LimiterConfig],
    ) {
        if pass.is_some() {
            return;
        }
        let why = "needs `identity.pass` (its secret_file signs challenges and passes)";
        for (i, r) in routes.iter().enumerate() {
            if r.challenge.is_some() {
                self.err(format!("routes[{i}].challenge"), why);
            }
        }
        for l in limiters {
            if l.key.contains(&KeyPart::Pass) {
                self.err(format!("limiters.{}.key", l.name), format!("`pass` {why}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_lists_secrets_oldest_first_and_names_each_by_a_hash() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let keys = PassKeys::parse(&format!("# old\n{a}\n\n{b}\n")).unwrap();
        assert_eq!(keys.0.len(), 2);
        assert_eq!(keys.0[1].secret, b.as_bytes());
        assert_eq!(keys.0[0].id.len(), 8);
        assert_ne!(keys.0[0].id, keys.0[1].id);
        assert!(!keys.0[0].id.contains('a'.to_string().repeat(8).as_str()));
    }

    #[test]
    fn short_duplicate_or_missing_secrets_are_refused() {
        assert!(PassKeys::parse("short\n").unwrap_err().contains("line 1"));
        let a = "a".repeat(40);
        assert!(PassKeys::parse(&format!("{a}\n{a}\n"))
            .unwrap_err()
            .contains("twice"));
        assert!(PassKeys::parse("# nothing\n").is_err());
    }
}
