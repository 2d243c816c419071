//! Test certificates made with rcgen, a TLS client (tokio-rustls + hyper) and a TLS upstream, on real sockets.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use super::{Answer, Seen};

/// A test certificate authority.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
    /// The CA's own certificate and key, for a server that wrongly serves it.
    pub own: Leaf,
}

/// A certificate and its key, as PEM, and the certificate as DER (to compare with what a handshake shows).
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            own: Leaf {
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
                der: cert.der().clone(),
            },
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, names: &[&str]) -> Leaf {
        self.issue_with(names, |_| {})
    }

    /// A server certificate for `names` that expired in 2021.
    pub fn issue_expired(&self, names: &[&str]) -> Leaf {
        self.issue_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        })
    }

    fn issue_with(&self, names: &[&str], edit: impl FnOnce(&mut rcgen::CertificateParams)) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        edit(&mut params);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).unwrap();
        path
    }

    /// A client that trusts only this CA and offers `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.client_with_versions(alpn, rustls::DEFAULT_VERSIONS)
    }

    pub fn client_with_versions(
        &self,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(self.pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

use rustls::pki_types::pem::PemObject;

impl Leaf {
    /// Writes `dir/name.crt` and `dir/name.key`.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

/// A TLS handshake with `sni` to `addr`.
pub async fn handshake(
    addr: SocketAddr,
    sni: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(sni.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// The certificate the server presented on `stream`.
pub fn served_certificate(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// The protocol ALPN chose on `stream`.
pub fn alpn(stream: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}

/// One HTTP connection over TLS, HTTP/1.1 or HTTP/2 as ALPN chose.
pub enum Session {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Session {
    /// Speaks HTTP on a finished handshake, by the protocol ALPN chose.
    pub async fn start(stream: TlsStream<TcpStream>) -> Session {
        let h2 = alpn(&stream).as_deref() == Some(b"h2".as_slice());
        let io = TokioIo::new(stream);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Session::H2(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Session::H1(send)
        }
    }

    /// GET `https://{host}{path}`, with `headers` added.
    pub async fn get(&mut self, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::get(format!("https://{host}{path}"));
        if matches!(self, Session::H1(_)) {
            req = req.header("host", host);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Empty::<Bytes>::new()).unwrap();
        let resp = match self {
            Session::H1(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await
            }
            Session::H2(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await
            }
        }
        .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            version: parts.version,
        }
    }
}

/// Handshake with `sni`, then one GET of `path`.
pub async fn get(
    addr: SocketAddr,
    sni: &str,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> Answer {
    let stream = handshake(addr, sni, config).await.unwrap();
    Session::start(stream).await.get(sni, path, &[]).await
}

/// An https:// upstream on 127.0.0.1 port 0 serving `leaf`; answers like
/// [`super::Upstream`] and records the SNI name each client sent.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    pub sni: Arc<Mutex<Vec<Option<String>>>>,
    /// Why each failed handshake failed, as the server saw it (the client's alert).
    pub failed_handshakes: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
}

impl TlsUpstream {
    pub async fn start(leaf: &Leaf) -> TlsUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let chain = vec![leaf.der.clone()];
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let seen = Arc::new(Seen::default());
        let sni = Arc::new(Mutex::new(Vec::new()));
        let failed_handshakes = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (s, names, st) = (seen.clone(), sni.clone(), stop.clone());
        let failed = failed_handshakes.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let (acceptor, seen, names) = (acceptor.clone(), s.clone(), names.clone());
                let failed = failed.clone();
                tokio::spawn(async move {
                    let tls = match acceptor.accept(stream).await {
                        Ok(tls) => tls,
                        Err(e) => {
                            failed.lock().push(e.to_string());
                            return;
                        }
                    };
                    names
                        .lock()
                        .push(tls.get_ref().1.server_name().map(str::to_string));
                    let svc = hyper::service::service_fn(move |req| {
                        super::handle_upstream(seen.clone(), req)
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TlsUpstream {
            addr,
            seen,
            sni,
            failed_handshakes,
            stop,
        }
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
