//! Validation of a `fastcgi://` upstream: php-fpm's address, `root` and `index`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::raw::RawUpstream;
use super::{dur, UpstreamConfig, UpstreamTls, Validator};

/// Where php-fpm listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FastCgiAddress {
    /// `fastcgi://host:port`
    Tcp(String),
    /// `fastcgi:///run/php/php-fpm.sock`
    Unix(PathBuf),
}

impl fmt::Display for FastCgiAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FastCgiAddress::Tcp(a) => write!(f, "{a}"),
            FastCgiAddress::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A validated `fastcgi://` upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastCgiConfig {
    pub address: FastCgiAddress,
    /// The document root as php-fpm sees it; tollgate reads the same path
    /// to check scripts and serve static files.
    pub root: PathBuf,
    /// A directory's default file (`index.php`).
    pub index: String,
    /// The script (`/index.php`) run for a path that names no file, with the
    /// request's own REQUEST_URI: nginx's `try_files $uri $uri/ /index.php?$args`.
    pub fallback: Option<String>,
    /// `Cache-Control` of every static file, instead of the default by type.
    pub cache_control: Option<String>,
    /// Connections to php-fpm at most, busy or idle (php-fpm's
    /// `pm.max_children`); requests beyond wait for one.
    pub max_conns: usize,
    /// How long the script a path resolved to is trusted without looking
    /// at the disk again (nginx's `open_file_cache_valid`); zero: never.
    pub script_cache: Duration,
}

impl Validator<'_> {
    /// `upstreams.<name>` with a `fastcgi://` URL; every problem is reported.
    pub(super) fn fastcgi_upstream(
        &mut self,
        name: &str,
        raw: &RawUpstream,
    ) -> Option<UpstreamConfig> {
        let at = |field: &str| format!("upstreams.{name}.{field}");
        let written = &raw.url.as_ref()?.0;
        let rest = written.strip_prefix("fastcgi://")?;
        // Every check runs before any result is used, so one pass names every problem.
        let address = self.fastcgi_address(at("url"), written, rest);
        let root = self.fastcgi_root(at("root"), raw);
        let index = raw.index.as_ref().map_or("index.php", |i| i.0.as_str());
        let fallback = raw.fallback.as_ref().map(|f| f.0.clone());
        let cache_control = raw.cache_control.as_ref().map(|c| c.0.clone());
        if let Some(c) = &cache_control {
            if http::HeaderValue::from_str(c).is_err() || c.trim().is_empty() {
                self.err(at("cache_control"), format!("{c:?} is not a header value"));
            }
        }
        let mut ok = self.fastcgi_scripts(&at, index, fallback.as_deref());
        let max_conns = raw.max_conns.unwrap_or(5);
        if max_conns == 0 {
            self.err(
                at("max_conns"),
                "must be at least 1 (php-fpm's pm.max_children)",
            );
            ok = false;
        }
        ok &= self.no_https_keys(&at, raw);
        let (Some(address), Some(root), true) = (address, root, ok) else {
            return None;
        };
        let fastcgi = FastCgiConfig {
            address,
            root,
            index: index.to_string(),
            fallback,
            cache_control,
            max_conns: max_conns as usize,
            script_cache: dur(raw.script_cache, Duration::from_secs(1)),
        };
        fastcgi_upstream_config(name, raw, fastcgi)
    }

    /// php-fpm's address from the URL after `fastcgi://`: `host:port` or a socket path.
    fn fastcgi_address(&mut self, at: String, written: &str, rest: &str) -> Option<FastCgiAddress> {
        if rest.starts_with('/') {
            if rest.len() == 1 {
                self.err(
                    at,
                    "a unix socket URL needs a path: fastcgi:///run/php/php-fpm.sock",
                );
                return None;
            }
            return Some(FastCgiAddress::Unix(PathBuf::from(rest)));
        }
        match rest.parse::<http::uri::Authority>() {
            Ok(a) if a.port_u16().is_some() && a.as_str() == rest && !a.host().is_empty() => {
                Some(FastCgiAddress::Tcp(rest.to_string()))
            }
            _ => {
                self.err(
                    at,
                    format!(
                        "{:?} must be fastcgi://host:port or fastcgi:///path/to/php-fpm.sock",
                        written
                    ),
                );
                None
            }
        }
    }

    /// `root`: an absolute path other than `/`, without its trailing slashes.
    fn fastcgi_root(&mut self, at: String, raw: &RawUpstream) -> Option<PathBuf> {
        match &raw.root {
            None => {
                self.err(at, "a fastcgi:// upstream needs `root`, the document root php-fpm sees (e.g. /var/www/html)");
                None
            }
            Some(r) if !r.0.starts_with('/') || r.0.trim_end_matches('/').is_empty() => {
                self.err(
                    at,
                    format!("{:?} must be an absolute path other than /", r.0),
                );
                None
            }
            Some(r) => Some(PathBuf::from(r.0.trim_end_matches('/'))),
        }
    }

    /// `index` is a plain file name and `fallback` a script path under root.
    fn fastcgi_scripts(
        &mut self,
        at: &dyn Fn(&str) -> String,
        index: &str,
        fallback: Option<&str>,
    ) -> bool {
        let mut ok = true;
        if index.is_empty() || index.contains('/') || index.starts_with('.') {
            self.err(
                at("index"),
                format!("{index:?} must be a file name such as index.php"),
            );
            ok = false;
        }
        if let Some(f) = fallback {
            let plain = f.starts_with('/')
                && f.ends_with(".php")
                && f[1..]
                    .split('/')
                    .all(|seg| !seg.is_empty() && !seg.starts_with('.'));
            if !plain {
                self.err(
                    at("fallback"),
                    format!("{f:?} must be a script path under root such as /index.php"),
                );
                ok = false;
            }
        }
        ok
    }

    /// `ca` and `insecure_skip_verify` are refused: they configure https:// only.
    fn no_https_keys(&mut self, at: &dyn Fn(&str) -> String, raw: &RawUpstream) -> bool {
        let mut ok = true;
        if raw.ca.is_some() {
            self.err(at("ca"), "applies to https:// upstreams only");
            ok = false;
        }
        if raw.insecure_skip_verify.is_some() {
            self.err(
                at("insecure_skip_verify"),
                "applies to https:// upstreams only",
            );
            ok = false;
        }
        ok
    }
}

/// The upstream a valid `fastcgi://` entry becomes.
fn fastcgi_upstream_config(
    name: &str,
    raw: &RawUpstream,
    fastcgi: FastCgiConfig,
) -> Option<UpstreamConfig> {
    // Shown by GET /config; a unix socket's path is kept after `unix`.
    let url = match &fastcgi.address {
        FastCgiAddress::Tcp(a) => format!("fastcgi://{a}"),
        FastCgiAddress::Unix(p) => format!("fastcgi://unix{}", p.display()),
    };
    let url = url.parse::<Uri>().ok()?;
    Some(UpstreamConfig {
        name: name.to_string(),
        // One php-fpm per upstream: its connection cap (`max_conns`) is
        // the FastCGI client's own, so the balancer has nothing to bound.
        balance: super::balance::BalanceConfig {
            servers: vec![url.clone()],
            policy: super::balance::Policy::RoundRobin,
            max_fails: 0,
            fail_timeout: Duration::from_secs(10),
            max_conns: None,
            queue: 0,
            queue_timeout: Duration::from_secs(10),
            health: None,
            tunnel_idle_timeout: Duration::from_secs(300),
        },
        url,
        connect_timeout: dur(raw.connect_timeout, Duration::from_secs(2)),
        timeout: dur(raw.timeout, Duration::from_secs(30)),
        tls: UpstreamTls::SystemRoots,
        fastcgi: Some(fastcgi),
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, Config, FastCgiAddress};

    fn load(yaml: &str) -> Result<Config, Vec<String>> {
        parse(yaml).map_err(|e| e.to_string().lines().map(String::from).collect())
    }

    #[test]
    fn tcp_and_unix_socket_urls_give_an_address_root_and_index() {
        let c = load("upstreams:\n  php: { url: \"fastcgi://127.0.0.1:9000\", root: /var/www/html/ }\n  sock: { url: \"fastcgi:///run/php/php-fpm.sock\", root: /srv, index: app.php, script_cache: 0s }\n").unwrap();
        let php = c.upstreams.iter().find(|u| u.name == "php").unwrap();
        let f = php.fastcgi.as_ref().unwrap();
        assert_eq!(f.address, FastCgiAddress::Tcp("127.0.0.1:9000".into()));
        assert_eq!(f.root.to_str(), Some("/var/www/html"));
        assert_eq!(f.index, "index.php");
        assert_eq!(f.script_cache, std::time::Duration::from_secs(1));
        let sock = c.upstreams.iter().find(|u| u.name == "sock").unwrap();
        let f = sock.fastcgi.as_ref().unwrap();
        assert_eq!(
            f.address,
            FastCgiAddress::Unix("/run/php/php-fpm.sock".into())
        );
        assert_eq!(f.index, "app.php");
        assert!(f.script_cache.is_zero());
    }

    #[test]
    fn every_fastcgi_mistake_is_reported_with_its_path() {
        let cases = [
            (
                "{ url: \"fastcgi://127.0.0.1\", root: /srv }",
                "upstreams.php.url",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000/x\", root: /srv }",
                "upstreams.php.url",
            ),
            ("{ url: \"fastcgi:///\", root: /srv }", "needs a path"),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\" }",
                "upstreams.php.root",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: srv }",
                "must be an absolute path",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: / }",
                "must be an absolute path",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: /srv, index: ../x.php }",
                "upstreams.php.index",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: /srv, insecure_skip_verify: true }",
                "https:// upstreams only",
            ),
            (
                "{ url: \"http://127.0.0.1:9000\", root: /srv }",
                "upstreams.php.root: applies to fastcgi://",
            ),
            (
                "{ url: \"http://127.0.0.1:9000\", index: a.php }",
                "upstreams.php.index: applies to fastcgi://",
            ),
            (
                "{ url: \"http://127.0.0.1:9000\", cache_control: no-cache }",
                "upstreams.php.cache_control: applies to fastcgi://",
            ),
            (
                "{ url: \"http://127.0.0.1:9000\", script_cache: 1s }",
                "upstreams.php.script_cache: applies to fastcgi://",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: /srv, cache_control: \"\" }",
                "upstreams.php.cache_control",
            ),
            (
                "{ url: \"fastcgi://127.0.0.1:9000\", root: /srv, docroot: /x }",
                "unknown key `docroot`; did you mean `root`?",
            ),
        ];
        for (upstream, expected) in cases {
            let yaml = format!("upstreams:\n  php: {upstream}\n");
            let errors = load(&yaml).expect_err(upstream);
            assert!(
                errors.iter().any(|e| e.contains(expected)),
                "{upstream}: {errors:?} lacks {expected:?}"
            );
        }
    }
}
