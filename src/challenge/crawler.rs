//! Verified crawlers: address ranges let through, and user-agents confirmed by forward-confirmed reverse DNS (a minimal DNS client over UDP), cached with a bound and a TTL.
//!
//! "Googlebot" in a user-agent proves nothing; the search engines' own
//! documented check does: the PTR name of the client address must lie in
//! one of the crawler's domains, and that name's A/AAAA records must hold
//! the address again (a PTR record is whatever the address owner writes;
//! the forward lookup is under the domain owner's control). Only a request
//! that would be challenged and names such a user-agent costs a lookup, and
//! each address is looked up once per TTL: the cache is bounded, so a flood
//! of addresses claiming to be Googlebot costs at most one lookup each, and
//! nothing when the cache is full and cleared.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use parking_lot::Mutex;
use tokio::net::UdpSocket;

use crate::config::CrawlerConfig;
use crate::limiter::Nanos;
use crate::metrics::{inc, Counter, Metrics};
use crate::networks::Network;

const TYPE_A: u16 = 1;
const TYPE_PTR: u16 = 12;
const TYPE_AAAA: u16 = 28;
/// A DNS name is at most 255 bytes; a pointer chain longer than this is a loop.
const MAX_JUMPS: usize = 16;

pub struct Crawlers {
    config: CrawlerConfig,
    /// Address → (confirmed, until when); cleared when full.
    cache: Mutex<HashMap<IpAddr, (bool, Nanos)>>,
    results: [Counter; 5],
}

/// What a client is, as a crawler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crawler {
    /// Its user-agent names no crawler to verify (and its address is in no `cidrs`).
    NotClaimed,
    /// In `cidrs`, or its claim confirmed by forward-confirmed reverse DNS.
    Verified,
    /// Its user-agent names a crawler its address's reverse DNS does not confirm.
    Unverified,
    /// The resolver failed or timed out: no proof either way, so treated as
    /// a client that claims nothing (a resolver outage must not refuse
    /// the real Googlebot).
    Unknown,
}

impl Crawler {
    fn confirmed(ok: bool) -> Crawler {
        if ok {
            Crawler::Verified
        } else {
            Crawler::Unverified
        }
    }
}

/// What the check of one request found (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrawlerFinding {
    Cidr = 0,
    Confirmed = 1,
    Refused = 2,
    Cached = 3,
    Error = 4,
}

const LABELS: [&str; 5] = ["cidr", "confirmed", "refused", "cached", "error"];
pub const CHECKS: &str = "tollgate_crawler_checks_total";

pub fn start_at_zero(metrics: &Metrics) {
    for l in LABELS {
        metrics.counter(CHECKS, &[("result", l)]);
    }
}

impl Crawlers {
    pub fn new(config: &CrawlerConfig, metrics: &Metrics) -> Crawlers {
        Crawlers {
            config: config.clone(),
            cache: Mutex::default(),
            results: LABELS.map(|l| metrics.counter(CHECKS, &[("result", l)])),
        }
    }

    fn count(&self, found: CrawlerFinding) {
        inc(&self.results[found as usize]);
    }

    /// What the client is as a crawler: let through (its address is in
    /// `cidrs`, or its user-agent names a `verify` rule whose `asn` holds
    /// its network or whose domains its address's forward-confirmed reverse
    /// DNS lies in), a claim its network and the DNS refute, or nothing of
    /// the kind.
    pub async fn check(
        &self,
        ip: IpAddr,
        network: &Network,
        user_agent: Option<&str>,
        now: Nanos,
    ) -> Crawler {
        if self.config.cidrs.iter().any(|n: &IpNet| n.contains(&ip)) {
            self.count(CrawlerFinding::Cidr);
            return Crawler::Verified;
        }
        let Some(ua) = user_agent else {
            return Crawler::NotClaimed;
        };
        let ua = ua.to_ascii_lowercase();
        let Some(rule) = self
            .config
            .verify
            .iter()
            .find(|r| ua.contains(&r.user_agent))
        else {
            return Crawler::NotClaimed;
        };
        // Its network, when the rule names one: no lookup, nothing to cache.
        if network.asn.is_some_and(|a| rule.asn.contains(&a)) {
            self.count(CrawlerFinding::Confirmed);
            return Crawler::Verified;
        }
        if rule.domains.is_empty() {
            self.count(CrawlerFinding::Refused);
            return Crawler::Unverified;
        }
        if let Some(&(ok, until)) = self.cache.lock().get(&ip) {
            if until > now {
                self.count(CrawlerFinding::Cached);
                return Crawler::confirmed(ok);
            }
        }
        let ok = match self.confirm(ip, &rule.domains).await {
            Ok(ok) => ok,
            Err(_) => {
                // Not cached: the resolver may be back for the next request.
                self.count(CrawlerFinding::Error);
                return Crawler::Unknown;
            }
        };
        self.count(if ok {
            CrawlerFinding::Confirmed
        } else {
            CrawlerFinding::Refused
        });
        let mut cache = self.cache.lock();
        if cache.len() >= self.config.cache_size {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= self.config.cache_size {
                cache.clear();
            }
        }
        let ttl = self.config.cache_ttl.as_nanos() as Nanos;
        cache.insert(ip, (ok, now.saturating_add(ttl)));
        Crawler::confirmed(ok)
    }

    /// Forward-confirmed reverse DNS: a PTR name under one of `domains`
    /// whose forward records hold `ip`.
    async fn confirm(&self, ip: IpAddr, domains: &[String]) -> std::io::Result<bool> {
        let names = self.ask(&reverse_name(ip), TYPE_PTR).await?;
        let qtype = if ip.is_ipv4() { TYPE_A } else { TYPE_AAAA };
        for name in names.iter().filter_map(DnsRecord::name) {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            let under = domains
                .iter()
                .any(|d| name == *d || name.ends_with(&format!(".{d}")));
            if !under {
                continue;
            }
            let forward = self.ask(&name, qtype).await?;
            if forward.contains(&DnsRecord::Addr(ip)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn ask(&self, name: &str, qtype: u16) -> std::io::Result<Vec<DnsRecord>> {
        ask(self.config.resolver, name, qtype, self.config.timeout).await
    }
}

/// One DNS answer record of the asked type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsRecord {
    Name(String),
    Addr(IpAddr),
}

impl DnsRecord {
    fn name(&self) -> Option<&str> {
        match self {
            DnsRecord::Name(n) => Some(n),
            DnsRecord::Addr(_) => None,
        }
    }
}

/// Asks `resolver` over UDP, once, within `timeout`.
pub async fn ask(
    resolver: SocketAddr,
    name: &str,
    qtype: u16,
    timeout: Duration,
) -> std::io::Result<Vec<DnsRecord>> {
    let bind: SocketAddr = if resolver.is_ipv4() {
        "0.0.0.0:0".parse().expect("address")
    } else {
        "[::]:0".parse().expect("address")
    };
    let socket = UdpSocket::bind(bind).await?;
    socket.connect(resolver).await?;
    let id = query_id(name);
    socket.send(&query(id, name, qtype)).await?;
    let mut buf = [0u8; 1500];
    let n = tokio::time::timeout(timeout, socket.recv(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "DNS timeout"))??;
    answers(&buf[..n], id, qtype)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad DNS answer"))
}

/// A query id from the clock's low bits and the name: not a secret (the
/// socket is connected to the resolver), only a match for the answer.
fn query_id(name: &str) -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (t as u16) ^ (name.len() as u16).rotate_left(8)
}

/// `9.113.0.203.in-addr.arpa`, or the nibbles of an IPv6 address under `ip6.arpa`.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::with_capacity(72);
            for b in v6.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 15, b >> 4));
            }
            s.push_str("ip6.arpa");
            s
        }
    }
}

/// A recursion-desired query for `name` of `qtype`.
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let label = &label.as_bytes()[..label.len().min(63)];
        q.push(label.len() as u8);
        q.extend_from_slice(label);
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// The records of `qtype` in an answer to query `id`; `None` when it is not one.
pub fn answers(p: &[u8], id: u16, qtype: u16) -> Option<Vec<DnsRecord>> {
    if p.len() < 12 || u16::from_be_bytes([p[0], p[1]]) != id || p[2] & 0x80 == 0 {
        return None;
    }
    let qd = u16::from_be_bytes([p[4], p[5]]);
    let an = u16::from_be_bytes([p[6], p[7]]);
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(p, at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        let after = skip_name(p, at)?;
        let head = p.get(after..after + 10)?;
        let rtype = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[8], head[9]]));
        let data = after + 10;
        let rdata = p.get(data..data + len)?;
        match rtype {
            t if t != qtype => {}
            TYPE_A if len == 4 => out.push(DnsRecord::Addr(IpAddr::from(
                <[u8; 4]>::try_from(rdata).ok()?,
            ))),
            TYPE_AAAA if len == 16 => out.push(DnsRecord::Addr(IpAddr::from(
                <[u8; 16]>::try_from(rdata).ok()?,
            ))),
            TYPE_PTR => out.push(DnsRecord::Name(read_name(p, data)?)),
            _ => {}
        }
        at = data + len;
    }
    Some(out)
}

/// The offset just past the name at `at` (a pointer ends it).
fn skip_name(p: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *p.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

/// The name at `at`, following compression pointers (bounded).
fn read_name(p: &[u8], mut at: usize) -> Option<String> {
    let mut name = String::new();
    for _ in 0..=MAX_JUMPS * 16 {
        let len = *p.get(at)?;
        if len == 0 {
            return Some(name);
        }
        if len & 0xc0 == 0xc0 {
            at = usize::from(u16::from_be_bytes([len & 0x3f, *p.get(at + 1)?]));
            continue;
        }
        let label = p.get(at + 1..at + 1 + usize::from(len))?;
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(&String::from_utf8_lossy(label));
        if name.len() > 255 {
            return None;
        }
        at += 1 + usize::from(len);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_names_are_written_backwards_by_octet_and_nibble() {
        assert_eq!(
            reverse_name("203.0.113.9".parse().unwrap()),
            "9.113.0.203.in-addr.arpa"
        );
        let v6 = reverse_name("2001:db8::1".parse().unwrap());
        assert!(v6.starts_with("1.0.0.0."), "{v6}");
        assert!(v6.ends_with("8.b.d.0.1.0.0.2.ip6.arpa"), "{v6}");
    }

    #[test]
    fn an_answer_with_a_compressed_ptr_name_is_read() {
        let mut p = query(7, "9.113.0.203.in-addr.arpa", TYPE_PTR);
        p[2] |= 0x80; // a response
        p[7] = 1; // one answer
        p.extend_from_slice(&[0xc0, 12]); // the question's name
        p.extend_from_slice(&TYPE_PTR.to_be_bytes());
        p.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
        let rdata = [
            &[7u8][..],
            b"crawl-1",
            &[9],
            b"googlebot",
            &[3],
            b"com",
            &[0],
        ]
        .concat();
        p.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        p.extend_from_slice(&rdata);
        assert_eq!(
            answers(&p, 7, TYPE_PTR),
            Some(vec![DnsRecord::Name("crawl-1.googlebot.com".into())])
        );
        assert_eq!(answers(&p, 8, TYPE_PTR), None, "another query's id");
    }

    #[test]
    fn a_pointer_loop_is_no_name() {
        let p = [0xc0, 0];
        assert_eq!(read_name(&p, 0), None);
    }
}
