//! Store keys, `<limiter>:<key value>`: built for requests, overrides and the admin API, split and canonicalized here only.
//!
//! A key value joins the parts of a limiter's `key` with `|`, and every part
//! spells itself with a prefix of its own (`ip:`, `key:`, `route:`, `global`,
//! `h:`, `pass:`, `asn:`, `country:`), so two parts never produce the same text and no client can name a
//! limiter's overflow key ([`StoreKey::overflow`]). Limiter names hold only
//! letters, digits, `_` and `-` (config checks that), so the first `:` of a
//! store key ends the name; the value may hold any number of `:` (IPv6
//! addresses, `key:…`).

use std::fmt;
use std::fmt::Write as _;
use std::net::IpAddr;

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::KeyPart;
use crate::identity::{ApiKey, Client, Identity};

/// Ends the limiter name in a store key.
const NAME_END: char = ':';
/// Joins the parts of a composite key value.
const PART_SEP: char = '|';
/// The key value of a limiter's overflow key. Every value a request builds
/// starts with `ip:`, `key:`, `route:`, `global` or `h:`, so no client can
/// name it.
const OVERFLOW: &str = "*overflow";
const ROUTE: &str = "route:";
const GLOBAL: &str = "global";
const HEADER: &str = "h:";
/// The key value of a verified pass: `pass:` + 32 hex digits of its id.
pub const PASS: &str = "pass:";
/// The key value of an address block ([`for_pass_issue`]).
const NET: &str = "net:";
/// The client's network: `asn:13335`, `country:DE`; an address the
/// database has no entry for is in the bucket `asn:none` / `country:none`.
const ASN: &str = "asn:";
const COUNTRY: &str = "country:";
const NO_ENTRY: &str = "none";
/// A header value longer than this, or not plain ASCII, is kept as a hash.
const HEADER_READABLE_MAX: usize = 64;

/// A store key split into the limiter it belongs to and its key value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreKey<'k> {
    pub limiter: &'k str,
    /// E.g. `ip:203.0.113.9` or `key:3f2a…|route:login`.
    pub value: &'k str,
}

impl<'k> StoreKey<'k> {
    pub fn new(limiter: &'k str, value: &'k str) -> StoreKey<'k> {
        StoreKey { limiter, value }
    }

    /// Splits a store key at the end of its limiter name; `None` when the
    /// text is not a store key (it has no `:`).
    pub fn parse(key: &'k str) -> Option<StoreKey<'k>> {
        let (limiter, value) = key.split_once(NAME_END)?;
        Some(StoreKey { limiter, value })
    }

    /// `<limiter>:<value>`, in one allocation.
    pub fn to_key(self) -> String {
        let mut k = String::with_capacity(self.limiter.len() + 1 + self.value.len());
        k.push_str(self.limiter);
        k.push(NAME_END);
        k.push_str(self.value);
        k
    }

    /// The one key every client of `limiter` shares once the store tracks
    /// `store.max_keys` keys and none of them is at rest.
    pub fn overflow(limiter: &str) -> String {
        StoreKey::new(limiter, OVERFLOW).to_key()
    }
}

impl fmt::Display for StoreKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{NAME_END}{}", self.limiter, self.value)
    }
}

/// The limiter name of a store key (all of it when it is not a store key).
pub fn limiter_of(key: &str) -> &str {
    StoreKey::parse(key).map_or(key, |k| k.limiter)
}

/// The key value of a store key (empty when it is not a store key).
pub fn value_of(key: &str) -> &str {
    StoreKey::parse(key).map_or("", |k| k.value)
}

/// The store key of a request for the limiter `limiter` keyed by `parts`,
/// built in one allocation. `None` when a part is missing (no API key, no
/// such header): the limiter then does not apply to the request.
pub fn for_request(
    limiter: &str,
    parts: &[KeyPart],
    client: &Client,
    route: &str,
    headers: &HeaderMap,
) -> Option<String> {
    let mut out = String::with_capacity(limiter.len() + 48);
    out.push_str(limiter);
    out.push(NAME_END);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(PART_SEP);
        }
        match part {
            KeyPart::Client => out.push_str(client.key()),
            KeyPart::Ip => out.push_str(&client.ip_key),
            KeyPart::ApiKey => out.push_str(&client.api_key.as_ref()?.id),
            KeyPart::Route => push_route(&mut out, route),
            KeyPart::Global => out.push_str(GLOBAL),
            // Without a verified pass, the client counts as its IP (see `challenge`).
            KeyPart::Pass => out.push_str(client.pass.as_deref().unwrap_or(&client.ip_key)),
            KeyPart::Asn => push_asn(&mut out, client.network.asn),
            KeyPart::Country => push_country(&mut out, client.network.country),
            KeyPart::Header(name) => {
                let v = headers.get(name)?.as_bytes();
                if v.is_empty() {
                    return None;
                }
                push_header(&mut out, v);
            }
        }
    }
    Some(out)
}

/// The key of the limit on issuing passes to the address block `block`
/// (`203.0.113.0/24`): under [`crate::config::ISSUE_LIMITER`], a name no
/// configured limiter can have, so no request's key is ever this one.
pub fn for_pass_issue(block: &str) -> String {
    let value = format!("{NET}{block}");
    StoreKey::new(crate::config::ISSUE_LIMITER, &value).to_key()
}

/// An override's key value written the way requests build theirs, so a
/// secret API key in the config is compared by hash and an IP by its
/// canonical form (IPv6 grouped by `identity.ipv6_prefix`). A composite key
/// is written `a|b`, one value per part.
pub fn for_override(parts: &[KeyPart], raw: &str, identity: &Identity) -> String {
    let values: Vec<&str> = if parts.len() > 1 {
        raw.split(PART_SEP).collect()
    } else {
        vec![raw]
    };
    if values.len() != parts.len() {
        return raw.to_string(); // cannot match; kept so `check` output stays honest
    }
    let mut out = String::new();
    for (i, (part, value)) in parts.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(PART_SEP);
        }
        let value = value.trim();
        let as_ip = value.parse::<IpAddr>().ok().map(|ip| identity.ip_key(ip));
        match part {
            KeyPart::Client => match as_ip {
                Some(ip_key) => out.push_str(&ip_key),
                None => out.push_str(&ApiKey::from_secret(value).id),
            },
            KeyPart::Ip => out.push_str(as_ip.as_deref().unwrap_or(value)),
            KeyPart::ApiKey => out.push_str(&ApiKey::from_secret(value).id),
            KeyPart::Route => push_route(&mut out, value.strip_prefix(ROUTE).unwrap_or(value)),
            KeyPart::Global => out.push_str(GLOBAL),
            KeyPart::Header(_) => push_header(&mut out, value.as_bytes()),
            KeyPart::Pass => out.push_str(as_ip.as_deref().unwrap_or(value)),
            KeyPart::Asn => {
                let number = value.strip_prefix(ASN).unwrap_or(value);
                let number = number.trim_start_matches("AS").trim_start_matches("as");
                match number.parse::<u32>() {
                    Ok(n) => push_asn(&mut out, Some(n)),
                    Err(_) => push_asn(&mut out, None),
                }
            }
            KeyPart::Country => {
                let code = value.strip_prefix(COUNTRY).unwrap_or(value);
                push_country(&mut out, crate::geodb::Country::parse(code))
            }
        }
    }
    out
}

/// The client as the admin API is given it: an IP, an API key, or an
/// already canonical `ip:…` / `key:…`, written as a request's `client` part.
pub fn for_admin_client(identity: &Identity, raw: &str) -> String {
    if raw.starts_with("ip:") || raw.starts_with("key:") || raw.starts_with(PASS) {
        return raw.to_string();
    }
    match raw.parse::<IpAddr>() {
        Ok(ip) => identity.ip_key(ip).to_string(),
        Err(_) => ApiKey::from_secret(raw).id,
    }
}

/// Every key value the canonical `client` (see [`for_admin_client`]) can
/// have under a limiter keyed by `parts`, without a request: `routes` are the
/// routes that use the limiter. A header part, or an IP part for an API key
/// (and the reverse), has no value a client alone decides: no keys then.
pub fn values_for_client(parts: &[KeyPart], client: &str, routes: &[&str]) -> Vec<String> {
    let is_ip = client.starts_with("ip:");
    let mut values = vec![String::new()];
    for (n, part) in parts.iter().enumerate() {
        let options: Vec<String> = match part {
            KeyPart::Client => vec![client.to_string()],
            KeyPart::Ip if is_ip => vec![client.to_string()],
            KeyPart::ApiKey if !is_ip => vec![client.to_string()],
            // A network is the database's answer, not something the client names.
            KeyPart::Ip
            | KeyPart::ApiKey
            | KeyPart::Header(_)
            | KeyPart::Asn
            | KeyPart::Country => {
                vec![]
            }
            KeyPart::Global => vec![GLOBAL.to_string()],
            KeyPart::Pass if is_ip || client.starts_with(PASS) => vec![client.to_string()],
            KeyPart::Pass => vec![],
            KeyPart::Route => routes
                .iter()
                .map(|r| {
                    let mut v = String::new();
                    push_route(&mut v, r);
                    v
                })
                .collect(),
        };
        values = values
            .iter()
            .flat_map(|v| {
                options.iter().map(move |o| {
                    if n == 0 {
                        o.clone()
                    } else {
                        format!("{v}{PART_SEP}{o}")
                    }
                })
            })
            .collect();
    }
    values
}

/// The part of a store key that places it in a Redis Cluster (its hash
/// tag): the request's identity — its first `ip:`, `key:` or `pass:` part —
/// so one client's limiters share a slot and are decided in one atomic
/// script, while different clients spread over every master. A key without
/// an identity part (`route`, `global`, a header) is placed by its whole
/// value, so such limiters get slots of their own. `{` and `}` are left
/// out: Redis would end the tag at the first `}`; a tag only places a key,
/// the full key stays distinct.
pub fn slot_tag(store_key: &str) -> String {
    let value = value_of(store_key);
    let identity = value
        .split(PART_SEP)
        .find(|p| p.starts_with("ip:") || p.starts_with("key:") || p.starts_with(PASS));
    let tag = identity.unwrap_or(value);
    tag.chars().filter(|c| !matches!(c, '{' | '}')).collect()
}

/// The address a key value names, if it has an `ip:` part: the address
/// itself, or the IPv6 prefix the client was counted by (`ip:2001:db8::/64`).
pub fn address_of(value: &str) -> Option<ipnet::IpNet> {
    let ip = value.split(PART_SEP).find_map(|p| p.strip_prefix("ip:"))?;
    ip.parse::<IpAddr>()
        .map(ipnet::IpNet::from)
        .or_else(|_| ip.parse::<ipnet::IpNet>())
        .ok()
}

fn push_asn(out: &mut String, asn: Option<u32>) {
    out.push_str(ASN);
    match asn {
        Some(n) => out.push_str(itoa::Buffer::new().format(n)),
        None => out.push_str(NO_ENTRY),
    }
}

fn push_country(out: &mut String, country: Option<crate::geodb::Country>) {
    out.push_str(COUNTRY);
    out.push_str(country.as_ref().map_or(NO_ENTRY, |c| c.as_str()));
}

fn push_route(out: &mut String, route: &str) {
    out.push_str(ROUTE);
    out.push_str(route);
}

/// Header values are tenant ids and the like: kept readable when short,
/// hashed when long or binary so a key never grows without bound (and a
/// `|` in a value cannot fake a second part).
fn push_header(out: &mut String, v: &[u8]) {
    out.push_str(HEADER);
    match std::str::from_utf8(v) {
        Ok(text)
            if v.len() <= HEADER_READABLE_MAX
                && v.iter()
                    .all(|b| b.is_ascii_graphic() && *b != PART_SEP as u8) =>
        {
            out.push_str(text)
        }
        _ => {
            out.push_str("sha:");
            for b in &Sha256::digest(v)[..16] {
                let _ = write!(out, "{b:02x}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn identity(ipv6_prefix: &str) -> Identity {
        let config = crate::config::parse(&format!("identity: {{ ipv6_prefix: {ipv6_prefix} }}\n"))
            .unwrap()
            .identity;
        Identity::new(&config, None, &Metrics::default())
    }

    fn client(identity: &Identity, ip: &str, key: Option<&str>) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            ip_key: identity.ip_key(ip.parse().unwrap()),
            api_key: key.map(ApiKey::from_secret),
            key_verified: key.is_some(),
            peer_trusted: false,
            exempt: false,
            pass: None,
            network: Default::default(),
        }
    }

    #[test]
    fn a_store_key_splits_back_into_its_limiter_and_value() {
        for (limiter, value) in [
            ("strict", "ip:203.0.113.9"),
            ("per-tenant_2", "h:acme|route:login"),
            ("l", "key:3f2a9c0d1e2b3a4c5d6e7f8091a2b3c4"),
            ("l", ""),
        ] {
            let key = StoreKey::new(limiter, value).to_key();
            assert_eq!(key, StoreKey::new(limiter, value).to_string());
            assert_eq!(StoreKey::parse(&key), Some(StoreKey::new(limiter, value)));
            assert_eq!(limiter_of(&key), limiter);
            assert_eq!(value_of(&key), value);
        }
    }

    #[test]
    fn an_ipv6_value_keeps_every_colon_after_the_limiter_name() {
        let key = StoreKey::new("strict", "ip:2001:db8:1:2::/64").to_key();
        assert_eq!(key, "strict:ip:2001:db8:1:2::/64");
        assert_eq!(limiter_of(&key), "strict");
        assert_eq!(value_of(&key), "ip:2001:db8:1:2::/64");
    }

    #[test]
    fn text_without_a_colon_is_not_a_store_key() {
        assert_eq!(StoreKey::parse("overflow"), None);
        assert_eq!(limiter_of("overflow"), "overflow");
        assert_eq!(value_of("overflow"), "");
    }

    #[test]
    fn the_overflow_key_is_one_no_request_can_build() {
        let overflow = StoreKey::overflow("strict");
        assert_eq!(overflow, "strict:*overflow");
        assert_eq!(limiter_of(&overflow), "strict");
        let id = identity("64");
        let c = client(&id, "203.0.113.9", Some("*overflow"));
        for parts in [
            vec![KeyPart::Client],
            vec![KeyPart::Ip],
            vec![KeyPart::ApiKey],
            vec![KeyPart::Route],
            vec![KeyPart::Global],
        ] {
            let key = for_request("strict", &parts, &c, "*overflow", &HeaderMap::new()).unwrap();
            assert_ne!(key, overflow, "{parts:?}");
        }
    }

    #[test]
    fn an_ipv6_override_matches_every_request_from_its_prefix() {
        let id = identity("64");
        let parts = [KeyPart::Ip];
        let value = for_override(&parts, " 2001:db8:1:2::1 ", &id);
        assert_eq!(value, "ip:2001:db8:1:2::/64");
        let neighbour = client(&id, "2001:db8:1:2:ffff::9", None);
        let key = for_request("l", &parts, &neighbour, "r", &HeaderMap::new()).unwrap();
        assert_eq!(value_of(&key), value);
    }

    #[test]
    fn a_composite_override_is_canonical_part_by_part() {
        let id = identity("128");
        let parts = [KeyPart::Client, KeyPart::Route];
        assert_eq!(
            for_override(&parts, "premium|route:login", &id),
            format!("{}|route:login", ApiKey::from_secret("premium").id)
        );
        assert_eq!(
            for_override(&parts, "203.0.113.9|login", &id),
            "ip:203.0.113.9|route:login"
        );
        assert_eq!(
            for_override(&parts, "only-one-part", &id),
            "only-one-part",
            "a value that cannot match is kept as written"
        );
    }

    #[test]
    fn an_admin_client_is_an_ip_an_api_key_or_already_canonical() {
        let id = identity("64");
        assert_eq!(for_admin_client(&id, "203.0.113.9"), "ip:203.0.113.9");
        assert_eq!(
            for_admin_client(&id, "2001:db8:1:2::7"),
            "ip:2001:db8:1:2::/64"
        );
        assert_eq!(
            for_admin_client(&id, "sekrit"),
            ApiKey::from_secret("sekrit").id
        );
        assert_eq!(for_admin_client(&id, "ip:10.0.0.1"), "ip:10.0.0.1");
        assert_eq!(for_admin_client(&id, "key:abc"), "key:abc");
    }

    #[test]
    fn the_admin_api_finds_the_keys_a_request_of_the_client_builds() {
        let id = identity("64");
        let parts = [KeyPart::Client, KeyPart::Route];
        let admin = for_admin_client(&id, "203.0.113.9");
        let values = values_for_client(&parts, &admin, &["login", "api"]);
        assert_eq!(
            values,
            ["ip:203.0.113.9|route:login", "ip:203.0.113.9|route:api"]
        );
        let c = client(&id, "203.0.113.9", None);
        let key = for_request("l", &parts, &c, "api", &HeaderMap::new()).unwrap();
        assert!(values.iter().any(|v| v == value_of(&key)));
    }

    #[test]
    fn a_client_has_no_admin_keys_under_a_part_it_does_not_decide() {
        let ip = "ip:203.0.113.9";
        assert_eq!(values_for_client(&[KeyPart::Ip], ip, &[]), [ip]);
        assert!(values_for_client(&[KeyPart::ApiKey], ip, &[]).is_empty());
        let header = KeyPart::Header(http::HeaderName::from_static("x-tenant"));
        assert!(values_for_client(&[KeyPart::Client, header], ip, &[]).is_empty());
        assert_eq!(values_for_client(&[KeyPart::Global], ip, &[]), ["global"]);
    }

    #[test]
    fn header_values_are_readable_when_short_and_hashed_when_long_or_joined() {
        let mut out = String::new();
        push_header(&mut out, b"acme");
        assert_eq!(out, "h:acme");
        for odd in ["x".repeat(100), "a|b".to_string(), "caf\u{e9}".to_string()] {
            let mut out = String::new();
            push_header(&mut out, odd.as_bytes());
            assert!(out.starts_with("h:sha:"), "{odd}: {out}");
            assert_eq!(out.len(), "h:sha:".len() + 32);
        }
    }

    #[test]
    fn a_network_key_names_its_asn_or_country_and_an_unknown_address_shares_one_bucket() {
        let id = identity("64");
        let mut c = client(&id, "203.0.113.9", None);
        let parts = [KeyPart::Asn, KeyPart::Route];
        let none = for_request("l", &parts, &c, "api", &HeaderMap::new()).unwrap();
        assert_eq!(none, "l:asn:none|route:api");
        c.network.asn = Some(64500);
        c.network.country = crate::geodb::Country::parse("de");
        let key = for_request("l", &parts, &c, "api", &HeaderMap::new()).unwrap();
        assert_eq!(key, "l:asn:64500|route:api");
        let country = for_request("l", &[KeyPart::Country], &c, "r", &HeaderMap::new()).unwrap();
        assert_eq!(country, "l:country:DE");
        assert_eq!(for_override(&[KeyPart::Asn], "AS64500", &id), "asn:64500");
        assert_eq!(for_override(&[KeyPart::Country], "de", &id), "country:DE");
    }

    #[test]
    fn the_address_of_a_key_is_its_ip_part() {
        assert_eq!(
            address_of("ip:203.0.113.9|route:login"),
            Some("203.0.113.9/32".parse().unwrap())
        );
        assert_eq!(
            address_of("ip:2001:db8:1:2::/64"),
            Some("2001:db8:1:2::/64".parse().unwrap())
        );
        assert_eq!(address_of("key:3f2a|route:login"), None);
        assert_eq!(address_of("h:ip:1.2.3.4"), None);
    }

    #[test]
    fn a_clients_limiters_share_their_slot_tag_and_other_keys_keep_their_own() {
        assert_eq!(slot_tag("strict:ip:203.0.113.9"), "ip:203.0.113.9");
        assert_eq!(
            slot_tag("login:route:login|ip:203.0.113.9"),
            "ip:203.0.113.9"
        );
        assert_eq!(slot_tag("api:key:3f2a|route:api"), "key:3f2a");
        assert_eq!(slot_tag("browser:pass:00ff"), "pass:00ff");
        assert_eq!(slot_tag("site:global"), "global");
        assert_eq!(slot_tag("per_route:route:login"), "route:login");
        assert_eq!(slot_tag("tenant:h:{acme}"), "h:acme");
    }
}
