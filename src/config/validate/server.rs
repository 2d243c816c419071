//! Validation of `server` (public listeners, TLS, connection limits, workers) and `admin` (its listener and token).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{dur, Validator};
use crate::config::raw::{RawAdmin, RawServer, RawTls, RawWorkers, Text};
use crate::config::CertSet;
use crate::config::{
    admin_token, AdminConfig, CertConfig, EncodedSeparators, ServerConfig, TlsConfig,
};

impl Validator<'_> {
    /// An address as `IP:port`, or as a name the loader resolved (see [`super::Host`]).
    fn socket_addr(&mut self, path: &str, s: &str) -> Option<SocketAddr> {
        let found = s
            .parse::<SocketAddr>()
            .ok()
            .or_else(|| self.host.resolved.get(s).copied());
        if found.is_none() {
            self.err(
                path,
                format!("invalid listen address {s:?} (write host:port, e.g. 0.0.0.0:8080)"),
            );
        }
        found
    }

    pub(super) fn server(&mut self, raw: &RawServer) -> ServerConfig {
        let listen = match &raw.listen {
            None => vec![SocketAddr::from(([0, 0, 0, 0], 8080))],
            Some(l) => {
                let entries = l.entries("server.listen");
                if entries.is_empty() {
                    self.err("server.listen", "at least one listen address is needed");
                }
                entries
                    .iter()
                    .filter_map(|(path, s)| self.socket_addr(path, s))
                    .collect()
            }
        };
        let tls = raw.tls.as_ref().and_then(|t| self.tls(t, &listen));
        let max_request_body = raw.max_request_body.map(|s| s.0).unwrap_or(10 << 20);
        ServerConfig {
            listen,
            tls,
            request_header_timeout: dur(raw.request_header_timeout, Duration::from_secs(10)),
            max_request_body,
            shutdown_grace: dur(raw.shutdown_grace, Duration::from_secs(10)),
            workers: self.workers(&raw.workers),
            max_connections: self.count("server.max_connections", raw.max_connections),
            max_connections_per_ip: self
                .count("server.max_connections_per_ip", raw.max_connections_per_ip)
                .unwrap_or(256),
            idle_timeout: dur(raw.idle_timeout, Duration::from_secs(60)),
            bodies: self.bodies(raw),
            encoded_separators: self.encoded_separators(raw.encoded_separators.as_ref()),
            underscores_in_headers: raw.underscores_in_headers.unwrap_or(false),
            errors: self.error_answers(
                "server",
                raw.error_format.as_ref(),
                raw.error_pages.as_ref(),
            ),
            compression: raw.compression.unwrap_or(true),
            proxy_protocol: self.cidrs("server.proxy_protocol", &raw.proxy_protocol),
        }
    }

    fn encoded_separators(&mut self, raw: Option<&Text>) -> EncodedSeparators {
        match raw.map(|t| t.0.as_str()) {
            None | Some("reject") => EncodedSeparators::Reject,
            Some("decode") => EncodedSeparators::Decode,
            Some(other) => {
                self.err(
                    "server.encoded_separators",
                    format!("unknown value {other:?}; use reject or decode"),
                );
                EncodedSeparators::Reject
            }
        }
    }

    /// A connection count: 1 or more.
    pub(in crate::config) fn count(&mut self, path: &str, raw: Option<u64>) -> Option<usize> {
        match raw {
            Some(0) => {
                self.err(path, "must be at least 1");
                None
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        }
    }

    fn workers(&mut self, raw: &Option<RawWorkers>) -> usize {
        let cores = self.host.cores.max(1);
        match raw {
            None => cores,
            Some(RawWorkers::Auto(t)) if t.0 == "auto" => cores,
            Some(RawWorkers::Count(n)) if (1..=1024).contains(n) => *n as usize,
            Some(_) => {
                self.err(
                    "server.workers",
                    "must be `auto` or a number from 1 to 1024",
                );
                1
            }
        }
    }

    /// `server.tls`: which pairs and where TLS is served. The pairs' files
    /// are the loader's to read; their YAML paths are kept for its errors.
    fn tls(&mut self, raw: &RawTls, plain: &[SocketAddr]) -> Option<TlsConfig> {
        let (certs, paths) = self.cert_pairs(raw);
        if certs.is_empty() && raw.acme.is_none() {
            self.err("server.tls", "needs `cert` and `key`, `certs`, or `acme`");
            return None;
        }
        let listen = self.tls_listen(raw, plain);
        let redirect_plain = raw.redirect_plain.unwrap_or(false);
        if redirect_plain && raw.listen.is_none() {
            self.err(
                "server.tls.redirect_plain",
                "needs server.tls.listen: without it every server.listen address already serves TLS",
            );
        }
        self.cert_paths = paths;
        let acme = raw.acme.as_ref().map(|a| self.acme(a, !listen.is_empty()));
        let hsts = raw.hsts.as_ref().map(|h| self.hsts(h));
        Some(TlsConfig {
            certs,
            loaded: Arc::new(CertSet::empty()),
            listen,
            redirect_plain,
            acme,
            hsts,
        })
    }

    /// The pairs `server.tls` names: its own `cert` and `key` first, then
    /// `certs` in order, each with the YAML path the loader's errors name.
    fn cert_pairs(&mut self, raw: &RawTls) -> (Vec<CertConfig>, Vec<String>) {
        let mut certs = Vec::new();
        let mut paths = Vec::new();
        match (&raw.cert, &raw.key) {
            (Some(c), Some(k)) => {
                certs.push(CertConfig {
                    cert: PathBuf::from(&c.0),
                    key: PathBuf::from(&k.0),
                    hosts: Vec::new(),
                });
                paths.push("server.tls".to_string());
            }
            (None, None) => {}
            _ => self.err("server.tls", "`cert` and `key` go together"),
        }
        for (i, c) in raw.certs.iter().enumerate() {
            certs.push(CertConfig {
                cert: PathBuf::from(&c.cert.0),
                key: PathBuf::from(&c.key.0),
                hosts: c.hosts.iter().map(|h| h.0.to_ascii_lowercase()).collect(),
            });
            paths.push(format!("server.tls.certs[{i}]"));
        }
        (certs, paths)
    }

    /// `server.tls.listen`: the addresses that serve only TLS, none of them
    /// also a plain one. Without the key, every `server.listen` serves TLS.
    fn tls_listen(&mut self, raw: &RawTls, plain: &[SocketAddr]) -> Vec<SocketAddr> {
        let Some(l) = &raw.listen else {
            return Vec::new();
        };
        let entries = l.entries("server.tls.listen");
        if entries.is_empty() {
            self.err(
                "server.tls.listen",
                "an empty list would serve no TLS; remove the key to serve TLS on server.listen",
            );
        }
        entries
            .into_iter()
            .filter_map(|(path, s)| {
                let addr = self.socket_addr(&path, s)?;
                if plain.contains(&addr) {
                    self.err(path, format!("{addr} is also in server.listen"));
                }
                Some(addr)
            })
            .collect()
    }

    pub(super) fn admin(&mut self, raw: &RawAdmin, server: &ServerConfig) -> AdminConfig {
        let default = SocketAddr::from(([127, 0, 0, 1], 9901));
        let listen = match &raw.listen {
            Some(t) => self.socket_addr("admin.listen", &t.0).unwrap_or(default),
            None => default,
        };
        let clash = server.public().iter().any(|(p, _)| {
            p.port() == listen.port()
                && listen.port() != 0
                && (p.ip() == listen.ip()
                    || p.ip().is_unspecified()
                    || listen.ip().is_unspecified())
        });
        if clash {
            self.err(
                "admin.listen",
                format!("{listen} overlaps a public listener; the admin API must never be on the public port"),
            );
        }
        let token = raw.token.as_ref().map(|t| t.0.clone());
        let token_file = raw.token_file.as_ref().map(|t| PathBuf::from(&t.0));
        for (path, problem) in
            admin_token::problems(listen, token.as_deref(), token_file.as_deref())
        {
            self.err(path, problem);
        }
        AdminConfig {
            listen,
            token,
            token_file,
        }
    }
}
