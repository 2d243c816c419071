//! Site rules, the parts of a server block or `.htaccess` a route can carry: redirect, rewrite, access lists, basic auth and header rules, as values the app's phases apply.
//!
//! Everything here is built once per config (validation parses the
//! templates, the address lists and the header rules; the loader reads the
//! users file) and read by the request path without a lock. How the rules
//! compose with the challenge, the limiters and the upstream is the app's
//! (`app/site.rs`), and documented in docs/SITE.md.

pub mod access;
pub mod auth;
pub mod headers;
pub mod template;

use http::StatusCode;

pub use access::Access;
pub use auth::BasicAuth;
pub use headers::{HeaderRules, Headers};
pub use template::Template;

/// `redirect:`: tollgate answers with a `Location` built from the template.
#[derive(Debug, Clone)]
pub struct Redirect {
    pub to: Template,
    /// 301 (default), 302, 303, 307 or 308.
    pub status: StatusCode,
}

/// `rewrite:`: the upstream sees the rewritten path and query; the client's
/// request line stays what it was (FastCGI's `REQUEST_URI`, the access log).
#[derive(Debug, Clone)]
pub struct Rewrite {
    pub to: Template,
    /// Only when the requested path names no file or directory under the
    /// FastCGI root (nginx's `try_files $uri $uri/ …`, Apache's `!-f`/`!-d`).
    pub unless_exists: bool,
}

/// What a route carries besides its match and action: each `None` when
/// not configured, so a route without site rules pays one check of a
/// `None` per phase.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub access: Option<Access>,
    pub auth: Option<BasicAuth>,
    pub headers: Option<Headers>,
    pub rewrite: Option<Rewrite>,
}

/// A path rewritten for the upstream, carried in the request's extensions
/// from the app to the FastCGI client or the proxy.
#[derive(Debug, Clone)]
pub struct Rewritten {
    /// Percent-encoded, starting with `/`.
    pub path: String,
    pub query: Option<String>,
    /// See [`Rewrite::unless_exists`].
    pub unless_exists: bool,
}

impl Rewritten {
    /// The rewritten path and query as a request target (`/index.php?p=1`).
    pub fn target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }
}

/// The user a basic-auth route authenticated, carried in the request's
/// extensions to the FastCGI client (`REMOTE_USER`, `AUTH_TYPE`).
#[derive(Debug, Clone)]
pub struct RemoteUser(pub String);
