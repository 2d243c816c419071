//! TLS with rustls (ring): termination with a certificate per SNI name, rotation without restart, and the client side for `https://` upstreams.
//!
//! # Listeners
//!
//! `server.tls` alone keeps the documented shape: every `server.listen` address
//! serves TLS. With `server.tls.listen: [...]` those addresses serve TLS and
//! `server.listen` stays plain HTTP, side by side; `server.tls.redirect_plain:
//! true` then makes the plain listeners answer every request with `308` to
//! the same URL on `https://` (the first `tls.listen` port, omitted when 443),
//! except `/.well-known/acme-challenge/`, which is routed as usual so an
//! HTTP-01 challenge can still be answered. Both listener kinds speak
//! HTTP/1.1 and HTTP/2; over TLS the protocol is chosen by ALPN (`h2`,
//! `http/1.1`), in TLS 1.2 or 1.3.
//!
//! # Certificates and rotation
//!
//! A [`CertSet`] is every configured pair, read and checked (the key matches
//! the certificate) when the config is loaded, so `tollgate check` and a
//! reload reject a broken pair with the file named. [`Terminator`] holds the
//! set in force behind an `ArcSwapOption`: a handshake loads it once, without
//! locks or file I/O; a reload (the file watch polls the certificate and key
//! files' content) validates a new set, then swaps it in. Connections that
//! finished their handshake keep their session and never notice.
//!
//! Which certificate: the exact SNI name, then a `*.example.com` wildcard
//! entry for one more label, then the default pair (the single `cert`/`key`,
//! or a `certs` entry without `hosts`), and without one the first entry, as
//! nginx does. A name `server.tls.acme` manages is answered from
//! [`Managed`] before any of that: with its ACME certificate, or — until the
//! first one arrives — with a failed handshake, never another name's
//! certificate. A client offering only ALPN `acme-tls/1` (a CA's tls-alpn-01
//! validation) gets the validation certificate of an order in flight, or nothing.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::acme::state::{Lookup, Managed, ACME_TLS_ALPN};
use crate::config::certs::{CertSet, FilesDigest, UpstreamTls};

/// ALPN protocols offered to clients, in order of preference; `acme-tls/1`
/// is chosen only by a client that offers nothing else (a CA validating),
/// and such a connection is closed after its handshake.
const SERVER_ALPN: [&[u8]; 3] = [b"h2", b"http/1.1", ACME_TLS_ALPN];

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

// ------------------------------------------------------------- termination

/// Chooses the certificate for each handshake from the set in force.
#[derive(Default)]
struct Resolver {
    current: ArcSwapOption<CertSet>,
    managed: Arc<Managed>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("current", &self.current)
            .finish()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name();
        if is_acme_validation(&hello) {
            return self.managed.alpn_certificate(name?);
        }
        if let Some(name) = name {
            match self.managed.lookup(name) {
                Lookup::Serve(key) => return Some(key),
                Lookup::Refuse => return None,
                Lookup::NotManaged => {}
            }
        }
        self.current.load().as_ref()?.pick(name)
    }
}

/// A tls-alpn-01 validation offers exactly one protocol: `acme-tls/1` (RFC 8737).
fn is_acme_validation(hello: &ClientHello<'_>) -> bool {
    let mut alpn = match hello.alpn() {
        Some(a) => a,
        None => return false,
    };
    alpn.next() == Some(ACME_TLS_ALPN) && alpn.next().is_none()
}

/// Whether a finished handshake was a tls-alpn-01 validation (to be closed, never served).
pub fn negotiated_acme(conn: &rustls::ServerConnection) -> bool {
    conn.alpn_protocol() == Some(ACME_TLS_ALPN)
}

/// The server side: one rustls config for the process, its certificates swapped by reloads.
pub struct Terminator {
    resolver: Arc<Resolver>,
    config: Arc<rustls::ServerConfig>,
}

impl Terminator {
    /// `managed`: the ACME names and their certificates, answered before `certs`.
    pub fn new(certs: Option<Arc<CertSet>>, managed: Arc<Managed>) -> Terminator {
        let resolver = Arc::new(Resolver {
            current: ArcSwapOption::empty(),
            managed,
        });
        resolver.current.store(certs);
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        // Session tickets let returning clients resume without a full handshake;
        // without them rustls still resumes TLS 1.3 from its in-memory cache.
        match rustls::crypto::ring::Ticketer::new() {
            Ok(ticketer) => config.ticketer = ticketer,
            Err(e) => tracing::warn!(error = %e, "no TLS session tickets"),
        }
        Terminator {
            resolver,
            config: Arc::new(config),
        }
    }

    /// Serves `certs` to every handshake from now on; open connections keep theirs.
    /// Returns whether the files differ from the set it replaces.
    pub fn install(&self, certs: Option<Arc<CertSet>>) -> bool {
        let new = certs.as_ref().map(|c| c.digest());
        let old = self.resolver.current.swap(certs);
        old.map(|c| c.digest()) != new
    }

    /// The digest of the files the set in force was read from.
    pub fn digest(&self) -> Option<FilesDigest> {
        self.resolver.current.load().as_ref().map(|c| c.digest())
    }

    /// The ACME names' certificates and challenge answers.
    pub fn managed(&self) -> &Arc<Managed> {
        &self.resolver.managed
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

// ------------------------------------------------------------ upstream side

/// The rustls client config for one upstream, verified as `trust` says.
/// The server name (SNI and the name verified) is the URL's host, set per connection by the connector.
/// Why a connection to an https:// upstream failed, in an operator's words,
/// when anything in `err`'s source chain is a rustls error: hyper-util's
/// error only says `client error (Connect)`, and the reason (the CA, the
/// name, the dates) is what the operator has to fix.
pub fn upstream_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(describe_rustls(r));
        }
        // An io::Error's `source()` skips the error it wraps (which may be
        // another io::Error): step into it instead.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn describe_rustls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(cert) = e else {
        return format!("TLS: {e}");
    };
    match cert {
        C::UnknownIssuer => "TLS: unknown CA: the upstream's certificate is not signed by a CA tollgate trusts (set the upstream's `ca:` to the CA that signed it)".into(),
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            format!("TLS: name mismatch: {cert} (the upstream URL's host must be one of the certificate's names)")
        }
        C::Expired | C::ExpiredContext { .. } => format!("TLS: expired: {cert}"),
        C::NotValidYet | C::NotValidYetContext { .. } => format!("TLS: not valid yet: {cert}"),
        // webpki's reason travels as an opaque `Other`; its name is the only handle.
        C::Other(other) if other.to_string().contains("CaUsedAsEndEntity") => {
            "TLS: CA used as end entity: the upstream presents a CA certificate as its own (it must serve a certificate issued by that CA)".into()
        }
        other => format!("TLS: invalid certificate: {other}"),
    }
}

pub fn upstream_client_config(trust: &UpstreamTls) -> rustls::ClientConfig {
    let provider = Arc::new(provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3");
    // No ALPN offered (hyper-rustls insists on setting it itself): an upstream
    // without ALPN speaks HTTP/1.1, which is what the pool uses.
    match trust {
        UpstreamTls::SystemRoots => builder
            .with_root_certificates(system_roots())
            .with_no_client_auth(),
        UpstreamTls::Ca { certs, .. } => {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(certs.iter().cloned());
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        UpstreamTls::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth(),
    }
}

/// The operating system's trust store (`/etc/ssl/certs` on Debian and in the
/// distroless image; `SSL_CERT_FILE` / `SSL_CERT_DIR` override), read once per process.
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "while reading the system CA certificates");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!("no system CA certificates found; https:// upstreams without `ca:` will fail verification");
            } else {
                tracing::debug!(added, ignored, "system CA certificates loaded");
            }
            Arc::new(roots)
        })
        .clone()
}

/// `insecure_skip_verify`: any certificate for any name is accepted; the
/// handshake signatures are still checked, so the session is at least bound
/// to whoever holds the key it presented.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
