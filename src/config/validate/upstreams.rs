//! Validation of `upstreams`: http(s) servers and how their certificates are trusted (fastcgi:// and balancing are in their own files).

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::{dur, valid_name, Validator};
use crate::config::balance::RawBalance;
use crate::config::raw::{RawUpstream, Text};
use crate::config::{UpstreamConfig, UpstreamTls};

/// `written` with what is before the `@` of its authority masked
/// (`http://***@host:8080/`), when it has one; `None` when it has none.
fn masked_userinfo(written: &str) -> Option<String> {
    let (scheme, rest) = written.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let (_, host) = authority.rsplit_once('@')?;
    Some(format!("{scheme}://***@{host}{path}"))
}

impl Validator<'_> {
    /// One upstream server URL: http(s), with a host, without a query.
    fn upstream_url(&mut self, path: &str, text: &Text) -> Option<Uri> {
        let url: Uri = match text.0.parse() {
            Ok(u) => u,
            Err(e) => {
                self.err(path, format!("invalid URL {:?}: {e}", text.0));
                return None;
            }
        };
        match url.scheme_str() {
            Some("http") | Some("https") => {}
            _ => {
                self.err(
                    path,
                    format!(
                        "{:?} must start with http://, https:// or fastcgi://",
                        text.0
                    ),
                );
                return None;
            }
        }
        if url.authority().is_none() {
            self.err(path, format!("{:?} has no host", text.0));
            return None;
        }
        if url.query().is_some() {
            self.err(path, "an upstream URL cannot carry a query string");
            return None;
        }
        Some(url)
    }

    /// Whether an upstream's name is of the characters a log line can carry (else reported).
    pub(super) fn upstream_name(&mut self, name: &str) -> bool {
        let valid = valid_name(name);
        if !valid {
            self.err(
                format!("upstreams.{name}"),
                "an upstream name uses only letters, digits, `_` and `-` (it appears in log lines and metric labels)",
            );
        }
        valid
    }

    /// `upstreams.<name>`: a `fastcgi://` one, or http(s):// servers with their trust.
    pub(super) fn upstream(&mut self, name: &str, raw: &RawUpstream) -> Option<UpstreamConfig> {
        if self.credentials_in_urls(name, raw) {
            return None;
        }
        if raw
            .url
            .as_ref()
            .is_some_and(|u| u.0.starts_with("fastcgi://"))
        {
            return self.fastcgi_upstream(name, raw);
        }
        for (field, set) in [
            ("root", raw.root.is_some()),
            ("index", raw.index.is_some()),
            ("fallback", raw.fallback.is_some()),
            ("cache_control", raw.cache_control.is_some()),
            ("script_cache", raw.script_cache.is_some()),
        ] {
            if set {
                self.err(
                    format!("upstreams.{name}.{field}"),
                    "applies to fastcgi:// upstreams only",
                );
            }
        }
        let servers = self.upstream_servers(name, raw)?;
        let url = servers[0].clone();
        let tls = self.upstream_tls(name, raw, url.scheme_str() == Some("https"))?;
        Some(UpstreamConfig {
            name: name.to_string(),
            url,
            connect_timeout: dur(raw.connect_timeout, Duration::from_secs(2)),
            timeout: dur(raw.timeout, Duration::from_secs(30)),
            tls,
            balance: self.balance(
                name,
                RawBalance {
                    servers: &raw.servers,
                    balance: &raw.balance,
                    max_fails: raw.max_fails,
                    fail_timeout: raw.fail_timeout,
                    max_conns: raw.max_conns,
                    queue: raw.queue,
                    queue_timeout: raw.queue_timeout,
                    health: &raw.health,
                    tunnel_idle_timeout: raw.tunnel_idle_timeout,
                },
                servers,
            )?,
            fastcgi: None,
        })
    }

    /// Whether `url` or a `servers` entry carries a user name or password
    /// (`http://user:pass@host`), each reported. They are refused, as nginx's
    /// `proxy_pass` and HAProxy's `server` refuse them: tollgate sends no
    /// credentials to an upstream, so such an upstream could only ever fail
    /// (502), and the URL is shown in `/config`, `/upstreams`, the dashboard,
    /// metric labels and logs. The message masks what is before the `@`.
    fn credentials_in_urls(&mut self, name: &str, raw: &RawUpstream) -> bool {
        let url = raw.url.iter().map(|u| (format!("upstreams.{name}.url"), u));
        let servers = raw.servers.iter().flatten().enumerate();
        let servers = servers.map(|(i, u)| (format!("upstreams.{name}.servers[{i}]"), u));
        let mut found = false;
        for (path, text) in url.chain(servers) {
            if let Some(masked) = masked_userinfo(&text.0) {
                found = true;
                self.err(
                    path,
                    format!(
                        "{masked:?}: an upstream URL cannot carry a user name or password; tollgate \
                         sends no credentials upstream and would show them wherever it shows the URL. \
                         Write the URL without them, and let the upstream admit tollgate by its address"
                    ),
                );
            }
        }
        found
    }

    /// `url`, or every entry of `servers`, as URLs of one scheme; at least one.
    fn upstream_servers(&mut self, name: &str, raw: &RawUpstream) -> Option<Vec<Uri>> {
        let written: Vec<(String, &Text)> = match (&raw.url, &raw.servers) {
            (Some(url), None) => vec![(format!("upstreams.{name}.url"), url)],
            (None, Some(list)) if !list.is_empty() => list
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("upstreams.{name}.servers[{i}]"), t))
                .collect(),
            (None, Some(_)) => {
                self.err(format!("upstreams.{name}.servers"), "lists no server");
                return None;
            }
            (Some(_), Some(_)) => {
                self.err(
                    format!("upstreams.{name}"),
                    "`url` and `servers` contradict each other; keep one",
                );
                return None;
            }
            (None, None) => {
                self.err(format!("upstreams.{name}"), "needs `url` or `servers`");
                return None;
            }
        };
        let mut servers = Vec::with_capacity(written.len());
        for (path, text) in &written {
            servers.push(self.upstream_url(path, text));
        }
        let servers: Vec<Uri> = servers.into_iter().collect::<Option<_>>()?;
        if servers.iter().any(|s| s.scheme() != servers[0].scheme()) {
            self.err(
                format!("upstreams.{name}.servers"),
                "every server needs the same scheme (all http:// or all https://)",
            );
            return None;
        }
        Some(servers)
    }

    /// How an https:// upstream's certificate is verified; `ca` and
    /// `insecure_skip_verify` are refused on http://, and together.
    fn upstream_tls(&mut self, name: &str, raw: &RawUpstream, https: bool) -> Option<UpstreamTls> {
        let insecure = raw.insecure_skip_verify.unwrap_or(false);
        let tls = match (&raw.ca, insecure) {
            (_, true) if !https => {
                self.err(
                    format!("upstreams.{name}.insecure_skip_verify"),
                    "applies to https:// upstreams only",
                );
                return None;
            }
            (Some(_), _) if !https => {
                self.err(
                    format!("upstreams.{name}.ca"),
                    "applies to https:// upstreams only",
                );
                return None;
            }
            (Some(_), true) => {
                self.err(
                    format!("upstreams.{name}"),
                    "`ca` and `insecure_skip_verify` contradict each other; keep one",
                );
                return None;
            }
            // The bundle is read by the loader, which reports it at `upstreams.<name>.ca`.
            (Some(ca), false) => UpstreamTls::Ca {
                path: PathBuf::from(&ca.0),
                certs: Vec::new(),
            },
            (None, true) => UpstreamTls::InsecureSkipVerify,
            (None, false) => UpstreamTls::SystemRoots,
        };
        Some(tls)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn refused(upstream: &str) -> String {
        let yaml = format!(
            "upstreams:\n  app: {upstream}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, upstream: app }}\n"
        );
        parse(&yaml)
            .expect_err("credentials are refused")
            .to_string()
    }

    #[test]
    fn an_upstream_url_with_credentials_is_refused_without_showing_them() {
        for (upstream, path, masked) in [
            (
                "{ url: \"http://alice:s3cret@127.0.0.1:8080/app\" }",
                "upstreams.app.url",
                "http://***@127.0.0.1:8080/app",
            ),
            (
                "{ servers: [\"http://10.0.0.1:80\", \"https://tok3n@10.0.0.2\"] }",
                "upstreams.app.servers[1]",
                "https://***@10.0.0.2",
            ),
            (
                "{ url: \"fastcgi://alice:s3cret@127.0.0.1:9000\", root: /srv }",
                "upstreams.app.url",
                "fastcgi://***@127.0.0.1:9000",
            ),
            // A second `@` (an unescaped one in the password) is masked whole.
            (
                "{ url: \"http://alice:s3cret@x@127.0.0.1\" }",
                "upstreams.app.url",
                "http://***@127.0.0.1",
            ),
        ] {
            let e = refused(upstream);
            assert!(
                e.contains(&format!(
                    "{path}: \"{masked}\": an upstream URL cannot carry a user name or password"
                )),
                "{e}"
            );
            assert!(
                !e.contains("s3cret") && !e.contains("alice") && !e.contains("tok3n"),
                "{e}"
            );
        }
    }

    #[test]
    fn an_at_sign_in_the_path_is_no_credential() {
        let yaml = "upstreams:\n  app: { url: \"http://127.0.0.1:8080/@team\" }\nroutes:\n  - { name: r, match: { path_prefix: / }, upstream: app }\n";
        parse(yaml).unwrap();
    }
}
