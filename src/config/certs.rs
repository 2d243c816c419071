//! Certificate pairs and CA bundles as config data: the files `server.tls` and an upstream's `ca:` name, read and checked into what handshakes choose from.
//!
//! The loader (`config/load.rs`) hands in how files are read, so every read
//! keeps its bounds; the TLS module serves the [`CertSet`] in force and builds
//! the upstream client side from [`UpstreamTls`].

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};

/// One certificate pair's files and the SNI names it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct CertConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// SNI names this pair serves; empty = the default certificate.
    pub hosts: Vec<String>,
}

/// Trust for an https:// upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamTls {
    /// The operating system's CA certificates (rustls-native-certs).
    SystemRoots,
    /// Only the CA certificates of this file (`ca:`), read when the config was loaded.
    Ca {
        path: PathBuf,
        certs: Vec<CertificateDer<'static>>,
    },
    /// `insecure_skip_verify: true`: any certificate is accepted, with a warning at every load.
    InsecureSkipVerify,
}

/// A SHA-256 over the content of every certificate and key file of a set, in config order.
pub type FilesDigest = [u8; 32];

/// Why a certificate, key or CA file cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no PEM certificate in it (expected `-----BEGIN CERTIFICATE-----`)", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: no PEM private key in it (expected PKCS#8, PKCS#1 or SEC1 `-----BEGIN ... PRIVATE KEY-----`)", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: invalid PEM: {source}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: unusable private key: {source}", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("{} does not match the certificate in {}", key.display(), cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("{}: invalid certificate: {source}", path.display())]
    Certificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// Every configured pair, loaded and checked; what handshakes choose from.
pub struct CertSet {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` entries, keyed by `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    digest: FilesDigest,
}

impl fmt::Debug for CertSet {
    // Never prints key material: names and the digest only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hosts: Vec<&String> = self.exact.keys().collect();
        hosts.sort();
        f.debug_struct("CertSet")
            .field("hosts", &hosts)
            .field("wildcards", &self.wildcard.len())
            .field("default", &self.default.is_some())
            .field("digest", &hex(&self.digest[..6]))
            .finish()
    }
}

impl PartialEq for CertSet {
    /// Two sets are the same when they were read from the same bytes.
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl CertSet {
    /// A set with no pair, before the loader read the files (see `config::validate`).
    pub fn empty() -> CertSet {
        CertSet {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: None,
            digest: [0; 32],
        }
    }

    /// Reads (with `read`: the config's loader owns file reading and its
    /// bounds) and checks every pair; the first unusable file is the error.
    pub fn load(pairs: &[CertConfig], read: ReadFile<'_>) -> Result<CertSet, TlsError> {
        let provider = rustls::crypto::ring::default_provider();
        let mut set = CertSet::empty();
        let mut hasher = Sha256::new();
        let mut first = None;
        for pair in pairs {
            let cert_pem = read_with(read, &pair.cert)?;
            let key_pem = read_with(read, &pair.key)?;
            add_to_digest(&mut hasher, &cert_pem);
            add_to_digest(&mut hasher, &key_pem);
            let certified = Arc::new(certified_key(pair, &cert_pem, &key_pem, &provider)?);
            first.get_or_insert_with(|| certified.clone());
            if pair.hosts.is_empty() {
                set.default.get_or_insert_with(|| certified.clone());
            }
            for host in &pair.hosts {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                match host.strip_prefix("*.") {
                    Some(parent) => set.wildcard.insert(parent.to_string(), certified.clone()),
                    None => set.exact.insert(host, certified.clone()),
                };
            }
        }
        set.default = set.default.or(first);
        set.digest = hasher.finalize().into();
        Ok(set)
    }

    /// The pair for an SNI name (lower-case is not assumed).
    pub fn pick(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = server_name {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(k) = self.exact.get(&name) {
                return Some(k.clone());
            }
            if let Some(k) = name
                .split_once('.')
                .and_then(|(_, parent)| self.wildcard.get(parent))
            {
                return Some(k.clone());
            }
        }
        self.default.clone()
    }

    pub fn digest(&self) -> FilesDigest {
        self.digest
    }
}

/// How this module reads a certificate, key or CA file: handed in by the
/// config loader, which opens named files safely and bounds their size.
pub type ReadFile<'a> = &'a dyn Fn(&Path) -> std::io::Result<Vec<u8>>;

fn read_with(read: ReadFile<'_>, path: &Path) -> Result<Vec<u8>, TlsError> {
    read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn add_to_digest(hasher: &mut Sha256, content: &[u8]) {
    // The length first, so moving bytes from one file to the next changes the digest.
    hasher.update((content.len() as u64).to_le_bytes());
    hasher.update(content);
}

/// The digest [`CertSet::load`] would compute, from contents read elsewhere
/// (the file watch reads them asynchronously); `None` entries make it `None`.
pub fn digest_of(contents: &[Option<Vec<u8>>]) -> Option<FilesDigest> {
    let mut hasher = Sha256::new();
    for c in contents {
        add_to_digest(&mut hasher, c.as_deref()?);
    }
    Some(hasher.finalize().into())
}

fn certified_key(
    pair: &CertConfig,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = pem_certificates(&pair.cert, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: pair.key.clone(),
        },
        source => TlsError::Pem {
            path: pair.key.clone(),
            source,
        },
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::Key {
            path: pair.key.clone(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // ring's keys always know their public half; `Unknown` cannot be checked, so it passes.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::Mismatch {
            cert: pair.cert.clone(),
            key: pair.key.clone(),
        }),
        Err(source) => Err(TlsError::Certificate {
            path: pair.cert.clone(),
            source,
        }),
    }
}

/// Every certificate in a PEM file, in order; at least one.
pub fn pem_certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(chain)
}

/// Reads a CA bundle for an upstream's `ca:`.
pub fn load_ca(path: &Path, read: ReadFile<'_>) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_certificates(path, &read_with(read, path)?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn std_read(p: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(p)
    }

    struct Pair {
        cert: String,
        key: String,
    }

    fn pair(names: &[&str]) -> Pair {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn write(dir: &Path, name: &str, p: &Pair, hosts: &[&str]) -> CertConfig {
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &p.cert).unwrap();
        std::fs::write(&key, &p.key).unwrap();
        CertConfig {
            cert,
            key,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn sni_picks_the_exact_host_then_a_wildcard_then_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", &pair(&["a.test"]), &["a.test"]);
        let w = write(dir.path(), "w", &pair(&["*.w.test"]), &["*.w.test"]);
        let d = write(dir.path(), "d", &pair(&["d.test"]), &[]);
        let set = CertSet::load(&[a, w, d], &std_read).unwrap();
        let pick = |n: Option<&str>| set.pick(n).unwrap().cert[0].clone();
        let (a_der, w_der, d_der) = (pick(Some("a.test")), pick(Some("x.w.test")), pick(None));
        assert_ne!(a_der, d_der);
        assert_ne!(w_der, d_der);
        assert_eq!(pick(Some("A.Test.")), a_der, "names are case-insensitive");
        assert_eq!(
            pick(Some("y.x.w.test")),
            d_der,
            "a wildcard covers one label"
        );
        assert_eq!(pick(Some("other.test")), d_der);
    }

    #[test]
    fn without_a_default_pair_the_first_one_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a", &pair(&["a.test"]), &["a.test"]);
        let b = write(dir.path(), "b", &pair(&["b.test"]), &["b.test"]);
        let set = CertSet::load(&[a, b], &std_read).unwrap();
        assert_eq!(
            set.pick(Some("c.test")).unwrap().cert,
            set.pick(Some("a.test")).unwrap().cert
        );
    }

    #[test]
    fn a_key_of_another_certificate_is_rejected_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (pair(&["a.test"]), pair(&["a.test"]));
        let mixed = Pair {
            cert: one.cert,
            key: two.key,
        };
        let c = write(dir.path(), "mixed", &mixed, &[]);
        let e = CertSet::load(std::slice::from_ref(&c), &std_read).unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("mixed.key") && msg.contains("mixed.crt"),
            "{msg}"
        );
    }

    #[test]
    fn a_file_without_pem_blocks_is_rejected_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = pair(&["a.test"]);
        let mut c = write(dir.path(), "a", &p, &[]);
        std::fs::write(&c.key, "not a key").unwrap();
        let e = CertSet::load(std::slice::from_ref(&c), &std_read).unwrap_err();
        assert!(matches!(e, TlsError::NoKey { .. }), "{e}");
        assert!(e.to_string().contains("a.key"), "{e}");
        std::fs::write(&c.key, &p.key).unwrap();
        std::fs::write(&c.cert, "").unwrap();
        let e = CertSet::load(std::slice::from_ref(&c), &std_read).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        c.cert = dir.path().join("missing.crt");
        let e = CertSet::load(&[c], &std_read).unwrap_err();
        assert!(e.to_string().contains("missing.crt"), "{e}");
    }

    #[test]
    fn the_digest_of_the_same_files_read_elsewhere_matches_the_loaded_one() {
        let dir = tempfile::tempdir().unwrap();
        let c = write(dir.path(), "a", &pair(&["a.test"]), &[]);
        let set = CertSet::load(std::slice::from_ref(&c), &std_read).unwrap();
        let read = |p: &Path| Some(std::fs::read(p).unwrap());
        assert_eq!(
            digest_of(&[read(&c.cert), read(&c.key)]),
            Some(set.digest())
        );
        assert_eq!(digest_of(&[read(&c.cert), None]), None);
    }
}
