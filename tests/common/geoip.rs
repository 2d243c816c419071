//! GeoIP databases in the MaxMind DB format, written by the tests themselves: an ASN file (`autonomous_system_number`) and a country file (`country.iso_code`), IPv4 and IPv6 in one tree as MaxMind's own files have them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use maxminddb_writer::metadata::IpVersion;
use maxminddb_writer::paths::IpAddrWithMask;
use maxminddb_writer::Database;
use serde::Serialize;

#[derive(Serialize)]
struct Asn {
    autonomous_system_number: u32,
    autonomous_system_organization: String,
}

#[derive(Serialize)]
struct Country {
    country: BTreeMap<&'static str, String>,
}

/// `networks`: `(cidr, asn)`; written as GeoLite2-ASN would be.
pub fn write_asn_db(path: &Path, networks: &[(&str, u32)]) {
    let mut db = database("GeoLite2-ASN");
    for (cidr, asn) in networks {
        let record = Asn {
            autonomous_system_number: *asn,
            autonomous_system_organization: format!("Test network {asn}"),
        };
        let data = db.insert_value(record).expect("record");
        db.insert_node(node(cidr), data);
    }
    write(path, &db);
}

/// `networks`: `(cidr, ISO code)`; written as GeoLite2-Country would be.
pub fn write_country_db(path: &Path, networks: &[(&str, &str)]) {
    let mut db = database("GeoLite2-Country");
    for (cidr, code) in networks {
        let record = Country {
            country: BTreeMap::from([("iso_code", code.to_string())]),
        };
        let data = db.insert_value(record).expect("record");
        db.insert_node(node(cidr), data);
    }
    write(path, &db);
}

fn database(kind: &str) -> Database {
    let mut db = Database::default();
    db.metadata.ip_version = IpVersion::V6;
    db.metadata.binary_format_major_version = 2;
    db.metadata.database_type = kind.to_string();
    db.metadata.languages = vec!["en".into()];
    db.metadata.build_epoch = 1_767_225_600;
    db
}

/// An IPv4 network lives under `::/96` of the IPv6 tree, where readers look for it.
fn node(cidr: &str) -> IpAddrWithMask {
    let (addr, len) = cidr.split_once('/').unwrap_or((cidr, ""));
    let addr: IpAddr = addr.parse().expect("network address");
    match addr {
        IpAddr::V4(v4) => {
            let len: u8 = if len.is_empty() {
                32
            } else {
                len.parse().unwrap()
            };
            IpAddrWithMask::new(IpAddr::V6(compatible(v4)), 96 + len)
        }
        IpAddr::V6(_) => {
            let len: u8 = if len.is_empty() {
                128
            } else {
                len.parse().unwrap()
            };
            IpAddrWithMask::new(addr, len)
        }
    }
}

fn compatible(v4: Ipv4Addr) -> std::net::Ipv6Addr {
    let [a, b, c, d] = v4.octets();
    std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c, d])
}

/// Written to a temporary name and renamed into place, as update tools do:
/// a reader never sees half a file.
fn write(path: &Path, db: &Database) {
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).unwrap();
    db.write_to(std::io::BufWriter::new(file))
        .expect("database written");
    std::fs::rename(&tmp, path).unwrap();
}
