//! `access: { allow, deny }`: lists of addresses, networks (after trusted proxies), AS numbers and countries (`identity.geoip`); the first list entry that matches decides.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::geodb::{Country, Network};

/// The lists, as written: `allow` entries are tried first, then `deny`;
/// the first entry that holds the client decides, and a client no entry
/// holds is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub allow: Vec<AccessEntry>,
    pub deny: Vec<AccessEntry>,
}

/// One entry: an address block, or every address of an AS or a country.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessEntry {
    Net(IpNet),
    /// `asn:13335`: the ASN database names this AS for the address.
    Asn(u32),
    /// `country:DE`: the country database names this country.
    Country(Country),
}

impl AccessEntry {
    /// `ip` canonical; an address the databases have no entry for is in no AS or country.
    fn holds(&self, ip: &IpAddr, network: &Network) -> bool {
        match self {
            AccessEntry::Net(n) => n.contains(ip),
            AccessEntry::Asn(a) => network.asn == Some(*a),
            AccessEntry::Country(c) => network.country == Some(*c),
        }
    }
}

impl std::fmt::Display for AccessEntry {
    /// As an operator writes it (a network truncated to its prefix).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessEntry::Net(n) => write!(f, "{n}"),
            AccessEntry::Asn(a) => write!(f, "asn:{a}"),
            AccessEntry::Country(c) => write!(f, "country:{}", c.as_str()),
        }
    }
}

impl Access {
    /// Whether the client at `ip` (canonical: an IPv4-mapped IPv6 address
    /// is its IPv4 address) of `network` may go on.
    pub fn allows(&self, ip: IpAddr, network: &Network) -> bool {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|e| e.holds(&ip, network)) {
            return true;
        }
        !self.deny.iter().any(|e| e.holds(&ip, network))
    }

    /// Whether an entry names an AS (`asn`), a country (`country`): the
    /// database each needs.
    pub fn names(&self) -> (bool, bool) {
        let all = || self.allow.iter().chain(&self.deny);
        (
            all().any(|e| matches!(e, AccessEntry::Asn(_))),
            all().any(|e| matches!(e, AccessEntry::Country(_))),
        )
    }
}

/// One entry as an operator writes it: `all`, an address, a network,
/// `asn:13335` (or `asn:AS13335`) or `country:DE`.
pub fn parse_entry(s: &str) -> Result<Vec<AccessEntry>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("all") {
        return Ok(vec![
            AccessEntry::Net("0.0.0.0/0".parse().expect("literal")),
            AccessEntry::Net("::/0".parse().expect("literal")),
        ]);
    }
    if let Some(number) = s.strip_prefix("asn:") {
        let digits = number.trim_start_matches("AS").trim_start_matches("as");
        return digits
            .parse()
            .map(|n| vec![AccessEntry::Asn(n)])
            .map_err(|_| format!("{s:?}: {number:?} is not an AS number (asn:13335)"));
    }
    if let Some(code) = s.strip_prefix("country:") {
        return Country::parse(code)
            .map(|c| vec![AccessEntry::Country(c)])
            .ok_or_else(|| {
                format!("{s:?}: {code:?} is not a two-letter country code (country:DE)")
            });
    }
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(vec![AccessEntry::Net(net.trunc())]);
    }
    s.parse::<IpAddr>()
        .map(|ip| vec![AccessEntry::Net(IpNet::from(ip.to_canonical()))])
        .map_err(|_| {
            format!(
                "{s:?} is not an address, a network (192.0.2.0/24, 2001:db8::/32), asn:<number>, country:<code> or `all`"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(allow: &[&str], deny: &[&str]) -> Access {
        let nets = |l: &[&str]| l.iter().flat_map(|s| parse_entry(s).unwrap()).collect();
        Access {
            allow: nets(allow),
            deny: nets(deny),
        }
    }

    #[test]
    fn the_first_matching_entry_decides_and_no_match_allows() {
        let office = access(&["192.0.2.0/24", "2001:db8::/32"], &["all"]);
        let none = Network::default();
        assert!(office.allows("192.0.2.7".parse().unwrap(), &none));
        assert!(office.allows("2001:db8::1".parse().unwrap(), &none));
        assert!(
            office.allows("::ffff:192.0.2.7".parse().unwrap(), &none),
            "mapped IPv4"
        );
        assert!(!office.allows("198.51.100.1".parse().unwrap(), &none));
        assert!(!office.allows("2001:db9::1".parse().unwrap(), &none));
        let block = access(&[], &["198.51.100.0/24"]);
        assert!(!block.allows("198.51.100.1".parse().unwrap(), &none));
        assert!(block.allows("203.0.113.1".parse().unwrap(), &none));
    }

    #[test]
    fn asn_and_country_entries_match_what_the_databases_say_and_nothing_without_an_entry() {
        let rule = access(&["asn:AS64500", "country:de"], &["all"]);
        assert_eq!(rule.names(), (true, true));
        let ip: IpAddr = "198.51.100.1".parse().unwrap();
        let of = |asn, country: Option<&str>| Network {
            asn,
            country: country.and_then(Country::parse),
        };
        assert!(rule.allows(ip, &of(Some(64500), None)));
        assert!(rule.allows(ip, &of(Some(1), Some("DE"))));
        assert!(!rule.allows(ip, &of(Some(1), Some("FR"))));
        assert!(!rule.allows(ip, &of(None, None)));
        let block = access(&[], &["country:RU"]);
        assert!(block.allows(ip, &of(None, None)));
        assert!(!block.allows(ip, &of(None, Some("ru"))));
        assert!(parse_entry("asn:x").is_err());
        assert!(parse_entry("country:DEU").is_err());
    }

    #[test]
    fn entries_are_addresses_networks_or_all() {
        assert!(parse_entry("10.0.0.1").is_ok());
        assert_eq!(
            parse_entry("10.0.0.1/8").unwrap()[0],
            AccessEntry::Net("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(parse_entry("ALL").unwrap().len(), 2);
        assert!(parse_entry("example.com").is_err());
    }
}
