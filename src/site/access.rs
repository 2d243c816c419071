//! `access: { allow, deny }`: address lists on the client address tollgate identified (after trusted proxies); the first list entry that matches decides.

use std::net::IpAddr;

use ipnet::IpNet;

/// The lists, as written: `allow` entries are tried first, then `deny`;
/// the first network that holds the address decides, and an address no
/// entry holds is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub allow: Vec<IpNet>,
    pub deny: Vec<IpNet>,
}

impl Access {
    /// Whether `ip` (canonical: an IPv4-mapped IPv6 address is its IPv4
    /// address) may go on.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|n| n.contains(&ip)) {
            return true;
        }
        !self.deny.iter().any(|n| n.contains(&ip))
    }
}

/// One entry as an operator writes it: `all`, an address, or a network.
pub fn parse_entry(s: &str) -> Result<Vec<IpNet>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("all") {
        return Ok(vec![
            "0.0.0.0/0".parse().expect("literal"),
            "::/0".parse().expect("literal"),
        ]);
    }
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(vec![net.trunc()]);
    }
    s.parse::<IpAddr>()
        .map(|ip| vec![IpNet::from(ip.to_canonical())])
        .map_err(|_| {
            format!("{s:?} is not an address, a network (192.0.2.0/24, 2001:db8::/32) or `all`")
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
        assert!(office.allows("192.0.2.7".parse().unwrap()));
        assert!(office.allows("2001:db8::1".parse().unwrap()));
        assert!(
            office.allows("::ffff:192.0.2.7".parse().unwrap()),
            "mapped IPv4"
        );
        assert!(!office.allows("198.51.100.1".parse().unwrap()));
        assert!(!office.allows("2001:db9::1".parse().unwrap()));
        let block = access(&[], &["198.51.100.0/24"]);
        assert!(!block.allows("198.51.100.1".parse().unwrap()));
        assert!(block.allows("203.0.113.1".parse().unwrap()));
    }

    #[test]
    fn entries_are_addresses_networks_or_all() {
        assert!(parse_entry("10.0.0.1").is_ok());
        assert_eq!(
            parse_entry("10.0.0.1/8").unwrap()[0].to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(parse_entry("ALL").unwrap().len(), 2);
        assert!(parse_entry("example.com").is_err());
    }
}
