//! The shared scene of the ACME suites: a pebble address chosen before pebble starts, configs with `server.tls.acme`, and waiting for a name's certificate through `/certificates`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tollgate::clock::SystemClock;

use super::certs;
use super::pebble::{Pebble, Validation};
use super::{Proxy, Upstream};

/// How long a test waits for a certificate: account, order, validation, issuance
/// (and the retry after tollgate found pebble not yet started).
pub const OBTAIN: Duration = Duration::from_secs(60);

/// A config where every name goes to `upstream`, with `server.tls.acme`
/// pointing at `directory` (the pebble address, chosen before it starts).
pub fn config(acme: &str, upstream: &str, extra_server: &str, limiters: &str) -> String {
    format!(
        r#"
server:
  tls:
    listen: ["127.0.0.1:0"]
    acme: {{ {acme} }}
{extra_server}
upstreams:
  app: {{ url: "{upstream}" }}
{limiters}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, upstream: app{route_limiters} }}
"#,
        route_limiters = if limiters.is_empty() {
            ""
        } else {
            ", limiters: [per_ip]"
        }
    )
}

pub fn acme_block(
    directory: &str,
    ca: &std::path::Path,
    storage: &std::path::Path,
    domains: &[&str],
    challenge: &str,
    extra: &str,
) -> String {
    format!(
        "directory: \"{directory}\", directory_ca: \"{}\", email: ops@example.com, domains: [{}], challenge: {challenge}, storage: \"{}\"{extra}",
        ca.display(),
        domains.join(", "),
        storage.display()
    )
}

pub async fn start(yaml: &str, dir: tempfile::TempDir) -> Proxy {
    Proxy::start_in(yaml, Arc::new(SystemClock), dir, None).await
}

pub async fn certificates(proxy: &Proxy) -> Value {
    super::get_json(&super::client(), &proxy.admin_url("/certificates")).await
}

/// The entry of `/certificates` for `domain`.
pub async fn status_of(proxy: &Proxy, domain: &str) -> Value {
    entry_for(&certificates(proxy).await, domain)
}

/// The entry for `domain` in a `{"certificates": [...]}` answer (the admin
/// API's or the dashboard's), or null.
pub fn entry_for(answer: &Value, domain: &str) -> Value {
    answer["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["domain"] == domain)
        .cloned()
        .unwrap_or(Value::Null)
}

/// `acme` beside a configured pair for `static.test` (the name that must
/// keep working whatever the CA does).
pub fn with_static_name(
    acme: &str,
    upstream: &str,
    dir: &std::path::Path,
    ca: &certs::Ca,
) -> String {
    let (cert, key) = ca.issue(&["static.test"]).write(dir, "static");
    format!(
        r#"
server:
  tls:
    listen: ["127.0.0.1:0"]
    certs: [{{ cert: "{}", key: "{}" }}]
    acme: {{ {acme} }}
upstreams:
  app: {{ url: "{upstream}" }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}
"#,
        cert.display(),
        key.display(),
    )
}

/// Waits until `domain` has a certificate in force (its serial).
pub async fn wait_certificate(proxy: &Proxy, domain: &str, pebble: &Pebble) -> String {
    let deadline = tokio::time::Instant::now() + OBTAIN;
    let mut last = status_of(proxy, domain).await;
    while !last["serial"].is_string() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = status_of(proxy, domain).await;
    }
    assert!(
        last["serial"].is_string(),
        "no certificate for {domain}: {last}\npebble:\n{}",
        pebble.output()
    );
    last["serial"].as_str().unwrap().to_string()
}

/// Seconds since the Unix epoch, on the real clock (the one tollgate's status uses).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Waits until `domain`'s next look is scheduled at least `ahead` from now:
/// the name's task has decided and sleeps until then, so no order can start
/// before it. Returns that status; fails with the last one seen otherwise.
pub async fn wait_scheduled(proxy: &Proxy, domain: &str, ahead: Duration) -> Value {
    let last = std::cell::RefCell::new(Value::Null);
    let scheduled = super::eventually(OBTAIN, || async {
        let status = status_of(proxy, domain).await;
        let next = status["next_attempt"]
            .as_str()
            .and_then(tollgate::clock::parse_iso8601);
        *last.borrow_mut() = status;
        next.is_some_and(|n| n >= unix_now() + ahead.as_secs())
    })
    .await;
    let status = last.into_inner();
    assert!(
        scheduled,
        "{domain}'s next look never got {ahead:?} ahead: {status}"
    );
    status
}

/// A handshake with `sni` verified against pebble's root; the served leaf's serial (hex).
pub async fn verified_serial(
    addr: SocketAddr,
    sni: &str,
    client: Arc<rustls::ClientConfig>,
) -> std::io::Result<String> {
    let stream = certs::handshake(addr, sni, client).await?;
    Ok(serial(&certs::served_certificate(&stream)))
}

pub fn serial(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.raw_serial_as_string().replace(':', "")
}

/// Ports pebble validates on: the proxy's plain and TLS listeners.
pub fn validation(proxy: &Proxy, validity: u64) -> Validation {
    Validation {
        http_port: proxy.addr.port(),
        tls_port: proxy.tls_addr.unwrap().port(),
        validity,
    }
}

/// The shared start: a pebble address, an upstream, a storage directory.
pub struct Scene {
    pub pebble_addr: SocketAddr,
    /// pebble's WFE CA, written before pebble starts so the config can name it.
    pub work: tempfile::TempDir,
    pub upstream: Upstream,
}

impl Scene {
    pub async fn new() -> Scene {
        Scene {
            pebble_addr: super::free_addr(),
            work: tempfile::tempdir().unwrap(),
            upstream: Upstream::start().await,
        }
    }

    pub fn directory(&self) -> String {
        format!("https://{}/dir", self.pebble_addr)
    }

    /// Where [`Pebble::start`] writes its WFE CA (`pebble-wfe-ca.pem` in `work`).
    pub fn directory_ca(&self) -> std::path::PathBuf {
        self.work.path().join("pebble-wfe-ca.pem")
    }

    pub fn storage(&self) -> std::path::PathBuf {
        self.work.path().join("acme")
    }

    pub fn acme(&self, domains: &[&str], challenge: &str, extra: &str) -> String {
        acme_block(
            &self.directory(),
            &self.directory_ca(),
            &self.storage(),
            domains,
            challenge,
            extra,
        )
    }

    pub fn pebble(&self, v: &Validation) -> Pebble {
        Pebble::start(self.work.path(), self.pebble_addr, v)
    }
}

/// A client that accepts any certificate: only the server's refusal can fail its handshake.
pub fn accept_any() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct Any(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for Any {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Any(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}
