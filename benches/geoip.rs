//! Cost of a GeoIP lookup: the ASN (and the country) of an address, in databases of 100,000 networks each, through `Networks` as a request asks it.
//!
//! `cargo bench --bench geoip` prints nanoseconds per lookup (median of 5
//! runs of 1,000,000 addresses, hits and misses mixed) and fails when an ASN
//! lookup takes more than 1 µs. Under `cargo test --all-targets` it runs a
//! few thousand lookups once as a smoke test.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use maxminddb_writer::metadata::IpVersion;
use maxminddb_writer::paths::IpAddrWithMask;
use maxminddb_writer::Database;
use tollgate::config::{GeoFile, GeoipConfig};
use tollgate::metrics::Metrics;
use tollgate::networks::{GeoDb, Networks};

#[global_allocator]
static GLOBAL: tollgate::allocator::Mimalloc = tollgate::allocator::Mimalloc;

const NETWORKS: u32 = 100_000;

#[derive(serde::Serialize)]
struct Asn {
    autonomous_system_number: u32,
    autonomous_system_organization: String,
}

#[derive(serde::Serialize)]
struct Country {
    country: std::collections::BTreeMap<&'static str, String>,
}

/// Every other /24 from 10.0.0.0 up gets a record; IPv4 under `::/96`.
fn write(path: &Path, country: bool) {
    let mut db = Database::default();
    db.metadata.ip_version = IpVersion::V6;
    db.metadata.binary_format_major_version = 2;
    db.metadata.database_type = "bench".into();
    for i in 0..NETWORKS {
        let v4 = Ipv4Addr::from(0x0A00_0000 + (i * 2) * 256);
        let node = IpAddrWithMask::new(IpAddr::V6(v4.to_ipv6_compatible()), 96 + 24);
        let data = if country {
            let code = ["DE", "FR", "US", "BR", "JP"][(i % 5) as usize].to_string();
            db.insert_value(Country {
                country: [("iso_code", code)].into(),
            })
        } else {
            db.insert_value(Asn {
                autonomous_system_number: 64_512 + i % 1000,
                autonomous_system_organization: format!("net {i}"),
            })
        };
        db.insert_node(node, data.unwrap());
    }
    let file = std::fs::File::create(path).unwrap();
    db.write_to(std::io::BufWriter::new(file)).unwrap();
}

fn networks(dir: &Path) -> Networks {
    let (asn, country) = (dir.join("asn.mmdb"), dir.join("country.mmdb"));
    write(&asn, false);
    write(&country, true);
    let file = |p: &Path| GeoFile {
        path: p.to_path_buf(),
        loaded: Arc::new(GeoDb::read(p, tollgate::config::read_named_file).expect("database")),
    };
    let config = GeoipConfig {
        asn_db: Some(file(&asn)),
        country_db: Some(file(&country)),
        check_every: Duration::from_secs(60),
    };
    Networks::new(&config, None, &Metrics::default())
}

/// Addresses over the databases' span: half with an entry, half without; one IPv6 in 16.
fn addresses(n: usize) -> Vec<IpAddr> {
    (0..n as u32)
        .map(|i| {
            let x = i.wrapping_mul(2_654_435_761);
            if i % 16 == 0 {
                IpAddr::V6(Ipv6Addr::new(
                    0x2001,
                    0xdb8,
                    (x >> 16) as u16,
                    x as u16,
                    0,
                    0,
                    0,
                    1,
                ))
            } else {
                IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + x % (NETWORKS * 2 * 256)))
            }
        })
        .collect()
}

fn median_ns(runs: usize, ips: &[IpAddr], f: impl Fn(IpAddr) -> bool) -> f64 {
    let mut per = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut hits = 0usize;
        for ip in ips {
            hits += usize::from(f(black_box(*ip)));
        }
        black_box(hits);
        per.push(started.elapsed().as_nanos() as f64 / ips.len() as f64);
    }
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

fn main() {
    let timing = std::env::args().any(|a| a == "--bench");
    let dir = tempfile::tempdir().unwrap();
    let n = networks(dir.path());
    let ips = addresses(if timing { 1_000_000 } else { 5_000 });
    let runs = if timing { 5 } else { 1 };
    let asn = median_ns(runs, &ips, |ip| n.asn(ip).is_some());
    let country = median_ns(runs, &ips, |ip| n.country(ip).is_some());
    let both = median_ns(runs, &ips, |ip| n.lookup(ip).asn.is_some());
    println!("geoip asn lookup: {asn:.0} ns; country: {country:.0} ns; both (a request's lookup): {both:.0} ns");
    if timing && asn > 1_000.0 {
        eprintln!("an ASN lookup took {asn:.0} ns, over the 1 µs budget");
        std::process::exit(1);
    }
}
