//! A real ACME CA for the tests: Debian's `pebble` (real validation, never `PEBBLE_VA_ALWAYS_VALID`) with `pebble-challtestsrv` as its DNS server resolving every name to 127.0.0.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use super::certs::{handshake, Ca, Session};
use super::eventually_blocking;

/// One pebble and its DNS server, killed on drop.
pub struct Pebble {
    /// The ACME directory URL.
    pub directory: String,
    /// A PEM file with the CA of pebble's own HTTPS (what `directory_ca` names).
    pub directory_ca: PathBuf,
    pub management: SocketAddr,
    /// pebble's output: one `Added order` line per order it received.
    pub log: PathBuf,
    ca: Ca,
    pebble: Child,
    dns: Child,
}

/// Where pebble checks a name's challenges: `http_port` (http-01) and `tls_port` (tls-alpn-01).
pub struct Validation {
    pub http_port: u16,
    pub tls_port: u16,
    /// Seconds a certificate is valid (pebble's `certificateValidityPeriod`); 0: pebble's default (5 years).
    pub validity: u64,
}

fn binary(name: &str) -> PathBuf {
    let path = PathBuf::from("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{name} is not installed: these tests need it (.ci/test installs Debian's `pebble`; or apt-get install pebble)"
    );
    path
}

/// `pebble-challtestsrv` as pebble's DNS server on `dns_addr`, resolving
/// every name to 127.0.0.1 (no challenge servers of its own).
fn start_dns(bin: &Path, dns_addr: SocketAddr) -> Child {
    let dns_management = super::free_addr();
    Command::new(bin)
        .args([
            "-dns01",
            &dns_addr.to_string(),
            "-http01",
            "",
            "-https01",
            "",
            "-tlsalpn01",
            "",
            "-management",
            &dns_management.to_string(),
            "-defaultIPv4",
            "127.0.0.1",
            "-defaultIPv6",
            "",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pebble-challtestsrv starts")
}

/// Writes pebble's config to `dir`: listening on `listen` and `management`,
/// serving its HTTPS with `tls` (certificate, key), validating on `v`'s ports.
fn write_config(
    dir: &Path,
    listen: SocketAddr,
    management: SocketAddr,
    tls: (&Path, &Path),
    v: &Validation,
) -> PathBuf {
    let (cert, key) = tls;
    let mut settings = serde_json::json!({
        "listenAddress": listen.to_string(),
        "managementListenAddress": management.to_string(),
        "certificate": cert,
        "privateKey": key,
        "httpPort": v.http_port,
        "tlsPort": v.tls_port,
        "ocspResponderURL": "",
        "externalAccountBindingRequired": false,
    });
    if v.validity > 0 {
        settings["certificateValidityPeriod"] = v.validity.into();
    }
    let config = dir.join("pebble.json");
    std::fs::write(
        &config,
        serde_json::json!({ "pebble": settings }).to_string(),
    )
    .unwrap();
    config
}

impl Pebble {
    /// Starts pebble (listening on `listen`, chosen beforehand so a
    /// tollgate's config can name it) validating on `v`'s ports.
    pub fn start(dir: &Path, listen: SocketAddr, v: &Validation) -> Pebble {
        let (pebble_bin, dns_bin) = (binary("pebble"), binary("pebble-challtestsrv"));
        let ca = Ca::new("pebble WFE test CA");
        let leaf = ca.issue(&["localhost", "127.0.0.1"]);
        let (cert, key) = leaf.write(dir, "pebble-wfe");
        let directory_ca = ca.write(dir, "pebble-wfe-ca.pem");
        let dns_addr = super::free_addr();
        let dns = start_dns(&dns_bin, dns_addr);
        let management = super::free_addr();
        let config = write_config(dir, listen, management, (&cert, &key), v);
        let log = dir.join("pebble.log");
        let out = std::fs::File::create(&log).unwrap();
        let pebble = Command::new(pebble_bin)
            .args(["-config", config.to_str().unwrap()])
            .args(["-dnsserver", &dns_addr.to_string()])
            // No random validation sleeps, no random bad-nonce rejections: the
            // tests measure tollgate, not pebble's chaos (validation is real).
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("pebble starts");
        let up = eventually_blocking(Duration::from_secs(15), || {
            std::net::TcpStream::connect(listen).is_ok()
                && std::net::TcpStream::connect(management).is_ok()
        });
        assert!(
            up,
            "pebble did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Pebble {
            directory: format!("https://{listen}/dir"),
            directory_ca,
            management,
            log,
            ca,
            pebble,
            dns,
        }
    }

    /// The root that signs pebble's certificates (from its management interface).
    pub async fn root(&self) -> String {
        let stream = handshake(self.management, "localhost", self.ca.client(&[b"http/1.1"]))
            .await
            .expect("pebble's management interface");
        let answer = Session::start(stream)
            .await
            .get("localhost", "/roots/0", &[])
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body
    }

    /// A TLS client trusting pebble's root only, offering h2 and HTTP/1.1.
    pub async fn client(&self) -> Arc<rustls::ClientConfig> {
        let root = self.root().await;
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(root.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// How many orders pebble has received.
    pub fn orders(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("Added order")
            .count()
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops pebble (the CA goes away; its state is lost).
    pub fn kill(&mut self) {
        let _ = self.pebble.kill();
        let _ = self.pebble.wait();
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        let _ = self.pebble.kill();
        let _ = self.pebble.wait();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}
