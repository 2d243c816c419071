//! What a MaxMind DB file says about an address (ASN, country) as plain data: a database as read, a country code, a network, a file's stamp.
//!
//! Below `config`, which holds the databases it loaded and parses
//! `match.country`; [`crate::networks`] (above it) swaps them when files
//! change and counts lookups.

use std::net::IpAddr;
use std::path::Path;

use maxminddb::PathElement;

/// The most of a database file that is read: GeoLite2-City, the largest
/// MaxMind publishes, is ~70 MB; the ASN and country files ~10 MB.
pub const GEOIP_FILE_LIMIT: u64 = 256 << 20;

/// Two ASCII capitals: an ISO 3166-1 alpha-2 code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Country([u8; 2]);

impl Country {
    /// `de`, `DE` → `DE`; anything but two ASCII letters → `None`.
    pub fn parse(s: &str) -> Option<Country> {
        match s.as_bytes() {
            [a, b] if a.is_ascii_alphabetic() && b.is_ascii_alphabetic() => {
                Some(Country([a.to_ascii_uppercase(), b.to_ascii_uppercase()]))
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        // Two ASCII letters, checked by `parse`.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }
}

/// What the databases say about one address (`None`: no entry, or no database).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Network {
    pub asn: Option<u32>,
    pub country: Option<Country>,
}

/// A file's identity on disk: a new version changes one of these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    modified_ns: i128,
    inode: u64,
}

impl Stamp {
    pub fn of(path: &Path) -> std::io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(Stamp {
            len: meta.len(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            inode: meta.ino(),
        })
    }
}

/// One database as read: its reader (none before the loader read it) and the file's stamp then.
#[derive(Default)]
pub struct GeoDb {
    reader: Option<maxminddb::Reader<Vec<u8>>>,
    stamp: Stamp,
}

impl GeoDb {
    /// Reads and checks `path` (blocking I/O): a MaxMind DB, at most
    /// [`GEOIP_FILE_LIMIT`], read by `read_file` (the config loader's
    /// reader of named files, passed in: this module sits below `config`).
    pub fn read(
        path: &Path,
        read_file: fn(&Path, u64) -> std::io::Result<Vec<u8>>,
    ) -> Result<GeoDb, String> {
        let stamp = Stamp::of(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let bytes = read_file(path, GEOIP_FILE_LIMIT)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        GeoDb::from_bytes(bytes, stamp)
            .map_err(|e| format!("{} is not a MaxMind DB file: {e}", path.display()))
    }

    fn from_bytes(bytes: Vec<u8>, stamp: Stamp) -> Result<GeoDb, String> {
        let reader = maxminddb::Reader::from_source(bytes).map_err(|e| e.to_string())?;
        Ok(GeoDb {
            reader: Some(reader),
            stamp,
        })
    }

    /// The file's stamp when it was read.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    /// The record's value at `path` for `ip`, if it has one.
    pub fn field<'a, T: serde::Deserialize<'a>>(
        &'a self,
        ip: IpAddr,
        path: &[PathElement<'_>],
    ) -> Option<T> {
        let found = self.reader.as_ref()?.lookup(ip).ok()?;
        found.decode_path(path).ok().flatten()
    }

    /// The database's `build_epoch` (Unix seconds), for the logs.
    pub fn built(&self) -> Option<u64> {
        self.reader.as_ref().map(|r| r.metadata().build_epoch)
    }
}
