//! Networks as identities: the client's autonomous system and country from MaxMind DB files (`identity.geoip`), swapped in when a file changes, and the busiest networks of the last minutes.
//!
//! A lookup is a walk down the database's search tree and one decoded
//! field: no allocation, no lock (the database in force is behind an
//! `ArcSwap`), well under a microsecond (`cargo bench --bench geoip`). It
//! can be asked from anywhere with an address ([`Networks::lookup`]): the
//! identify phase asks once per request and keeps the answer on the
//! `Client` (limiter keys `asn`/`country`, route matches, the access log);
//! `GET /bans` asks for a banned address.
//!
//! An address the database has no entry for (a private range, a new
//! allocation) has no ASN or country: limiter keys then share one bucket,
//! `asn:none` / `country:none`, and a route's `asn:`/`country:` match does not
//! match it.
//!
//! The files are read by the config loader (on a blocking thread, like
//! every file a config names) and then checked every
//! `identity.geoip.check_every` by [`watch`], again on a blocking thread: a
//! changed file (size, modification time or inode: an update tool's
//! write-and-rename) is read and checked whole before it replaces the one in
//! force; a broken one is logged and counted, and the old one stays.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use maxminddb::PathElement;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::{read_named_file, GeoFile, GeoipConfig};
pub use crate::geodb::{Country, GeoDb, Network, Stamp, GEOIP_FILE_LIMIT};
use crate::limiter::Nanos;
use crate::metrics::{inc, Counter, Metrics};

/// One configured database and the version in force.
struct Source {
    path: PathBuf,
    db: ArcSwap<GeoDb>,
    /// The file's stamp when it was last read (or tried).
    seen: Mutex<Stamp>,
    /// `tollgate_geoip_lookups_total{db, result}`: hit, miss.
    hit: Counter,
    miss: Counter,
    reload_ok: Counter,
    reload_error: Counter,
}

impl Source {
    fn new(name: &str, file: &GeoFile, metrics: &Metrics) -> Source {
        let lookups = |r| metrics.counter(LOOKUPS, &[("db", name), ("result", r)]);
        let reloads = |r| metrics.counter(RELOADS, &[("db", name), ("result", r)]);
        Source {
            path: file.path.clone(),
            db: ArcSwap::new(file.loaded.clone()),
            seen: Mutex::new(file.loaded.stamp()),
            hit: lookups("hit"),
            miss: lookups("miss"),
            reload_ok: reloads("ok"),
            reload_error: reloads("error"),
        }
    }

    fn counted<T>(&self, found: Option<T>) -> Option<T> {
        inc(if found.is_some() {
            &self.hit
        } else {
            &self.miss
        });
        found
    }
}

pub const LOOKUPS: &str = "tollgate_geoip_lookups_total";
pub const RELOADS: &str = "tollgate_geoip_reloads_total";

/// The databases of `identity.geoip` and the busiest networks.
pub struct Networks {
    asn: Option<Source>,
    country: Option<Source>,
    check_every: Duration,
    /// Shared across reloads: a config edit does not reset the list.
    talkers: Arc<Talkers>,
}

impl std::fmt::Debug for Networks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = |s: &Option<Source>| s.as_ref().map(|s| s.path.clone());
        f.debug_struct("Networks")
            .field("asn", &path(&self.asn))
            .field("country", &path(&self.country))
            .finish()
    }
}

const ASN_FIELD: [PathElement<'static>; 1] = [PathElement::Key("autonomous_system_number")];
const COUNTRY_FIELD: [PathElement<'static>; 2] =
    [PathElement::Key("country"), PathElement::Key("iso_code")];
/// GeoLite2-Country leaves `country` out for some networks (anycast,
/// satellite providers) and names only where the block is registered.
const REGISTERED_FIELD: [PathElement<'static>; 2] = [
    PathElement::Key("registered_country"),
    PathElement::Key("iso_code"),
];

impl Networks {
    /// The databases `config` names, as the loader read them; `previous`
    /// hands over the busiest-networks list.
    pub fn new(config: &GeoipConfig, previous: Option<&Networks>, metrics: &Metrics) -> Networks {
        Networks {
            asn: config
                .asn_db
                .as_ref()
                .map(|f| Source::new("asn", f, metrics)),
            country: config
                .country_db
                .as_ref()
                .map(|f| Source::new("country", f, metrics)),
            check_every: config.check_every,
            talkers: previous.map_or_else(Arc::default, |p| p.talkers.clone()),
        }
    }

    /// The ASN and country of `ip`, from whichever databases are configured.
    pub fn lookup(&self, ip: IpAddr) -> Network {
        Network {
            asn: self.asn(ip),
            country: self.country(ip),
        }
    }

    /// The autonomous system `ip` is announced by (`autonomous_system_number`).
    pub fn asn(&self, ip: IpAddr) -> Option<u32> {
        let source = self.asn.as_ref()?;
        source.counted(source.db.load().field(ip, &ASN_FIELD))
    }

    /// The country of `ip` (`country.iso_code`, else `registered_country.iso_code`).
    pub fn country(&self, ip: IpAddr) -> Option<Country> {
        let source = self.country.as_ref()?;
        let db = source.db.load();
        let code: Option<&str> = db
            .field(ip, &COUNTRY_FIELD)
            .or_else(|| db.field(ip, &REGISTERED_FIELD));
        source.counted(code.and_then(Country::parse))
    }

    /// Counts one request of `network` for the busiest-networks list.
    pub fn count(&self, network: &Network, now: Nanos) {
        if self.asn.is_some() {
            self.talkers.count(network.asn, now);
        }
    }

    /// The busiest networks of the last one to two minutes, most requests first.
    pub fn top(&self, n: usize, now: Nanos) -> Vec<(Option<u32>, u64)> {
        self.talkers.top(n, now)
    }

    /// Checks each file once and swaps in a new version (blocking I/O).
    fn refresh(&self) {
        for (name, source) in [("asn", &self.asn), ("country", &self.country)] {
            let Some(source) = source else { continue };
            let Ok(stamp) = Stamp::of(&source.path) else {
                // A file moved away for a moment (write-and-rename): the next check sees it.
                continue;
            };
            // Each version of a file is read once, a broken one included.
            if std::mem::replace(&mut *source.seen.lock(), stamp) == stamp {
                continue;
            }
            match GeoDb::read(&source.path, read_named_file) {
                Ok(db) => {
                    tracing::info!(db = name, path = %source.path.display(), built = ?db.built(), "GeoIP database reloaded");
                    source.db.store(Arc::new(db));
                    inc(&source.reload_ok);
                }
                Err(e) => {
                    tracing::error!(db = name, error = %e, "GeoIP database not reloaded; the previous one stays");
                    inc(&source.reload_error);
                }
            }
        }
    }
}

/// How many networks `/metrics` and the dashboard list.
pub const TOP_SHOWN: usize = 10;

/// `/metrics`: the busiest networks of the last one to two minutes, by rank
/// (at most [`TOP_SHOWN`] series at a time; `asn="none"` for addresses without an entry).
pub fn render_metrics(networks: Option<&Networks>, now: Nanos, out: &mut String) {
    use crate::metrics::text::{family, labels, sample};
    let Some(networks) = networks else { return };
    let name = "tollgate_top_asn_requests";
    family(
        out,
        name,
        "Requests of the busiest networks (ASN) over the last one to two minutes, by rank.",
        "gauge",
    );
    for (rank, (asn, n)) in networks.top(TOP_SHOWN, now).into_iter().enumerate() {
        let asn = asn.map_or_else(|| "none".to_string(), |a| a.to_string());
        let rank = (rank + 1).to_string();
        sample(out, name, &labels(&[("rank", &rank), ("asn", &asn)]), n);
    }
}

/// Polls the files of the networks in force every `check_every` until
/// `stop`; `current` reads them from the snapshot, so a reload's change of
/// file is followed.
pub async fn watch(current: impl Fn() -> Option<Arc<Networks>>, stop: CancellationToken) {
    loop {
        let every = current().map_or(Duration::from_secs(60), |n| n.check_every);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Some(networks) = current() {
            let _ = tokio::task::spawn_blocking(move || networks.refresh()).await;
        }
    }
}

/// Requests per ASN over two one-minute generations, bounded: past
/// [`MAX_TALKERS`] networks in a generation, new ones are counted together.
#[derive(Default)]
pub struct Talkers {
    inner: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    started: Nanos,
    current: HashMap<Option<u32>, u64>,
    previous: HashMap<Option<u32>, u64>,
    /// Requests of networks past the bound this generation.
    other: u64,
}

/// Networks counted per generation at most (~32 bytes each).
pub const MAX_TALKERS: usize = 4096;
const GENERATION: Nanos = 60 * 1_000_000_000;

impl Talkers {
    fn count(&self, asn: Option<u32>, now: Nanos) {
        let mut g = self.inner.lock();
        g.roll(now);
        let full = g.current.len() >= MAX_TALKERS;
        match g.current.get_mut(&asn) {
            Some(n) => *n += 1,
            None if full => g.other += 1,
            None => {
                g.current.insert(asn, 1);
            }
        }
    }

    fn top(&self, n: usize, now: Nanos) -> Vec<(Option<u32>, u64)> {
        let mut g = self.inner.lock();
        g.roll(now);
        let mut sums: HashMap<Option<u32>, u64> = g.previous.clone();
        for (asn, c) in &g.current {
            *sums.entry(*asn).or_default() += c;
        }
        drop(g);
        let mut list: Vec<(Option<u32>, u64)> = sums.into_iter().collect();
        list.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        list.truncate(n);
        list
    }
}

impl Generations {
    fn roll(&mut self, now: Nanos) {
        if now.saturating_sub(self.started) < GENERATION {
            return;
        }
        // A gap of two generations or more leaves nothing recent.
        let recent = now.saturating_sub(self.started) < 2 * GENERATION;
        self.previous = if recent {
            std::mem::take(&mut self.current)
        } else {
            self.current.clear();
            HashMap::new()
        };
        self.other = 0;
        self.started = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_country_code_is_two_letters_in_capitals() {
        assert_eq!(Country::parse("de").unwrap().as_str(), "DE");
        for bad in ["", "D", "DEU", "1A", "é"] {
            assert_eq!(Country::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_busiest_networks_come_first_and_the_table_stays_bounded() {
        let t = Talkers::default();
        let now = 1_000 * GENERATION;
        for _ in 0..3 {
            t.count(Some(64500), now);
        }
        t.count(None, now);
        for asn in 0..(MAX_TALKERS as u32 + 10) {
            t.count(Some(100_000 + asn), now);
        }
        assert_eq!(t.top(2, now), vec![(Some(64500), 3), (None, 1)]);
        assert_eq!(t.inner.lock().current.len(), MAX_TALKERS);
        assert_eq!(t.inner.lock().other, 12);
        // Two generations later, nothing is recent any more.
        assert!(t.top(5, now + 3 * GENERATION).is_empty());
    }
}
