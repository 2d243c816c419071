//! `tollgate import`: another server's site rules (an Apache `.htaccess`) as a tollgate config that `check` accepts as it stands, with a finding for every line it could not translate.
//!
//! The translators build [`ImportedRoute`]s, a plain description of what each route
//! matches and does; [`Site::to_yaml`] writes them out once, so every
//! translator's output has the same shape: one FastCGI upstream (php-fpm on
//! the site's root), the site-wide `access` and `headers`, and the routes in
//! the order they must be tried, the catch-all last.

pub mod htaccess;

use std::fmt::Write as _;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The line needs nothing from tollgate (it does it already, or the
    /// line only concerns Apache): said so the operator knows it was read.
    Note,
    /// The line was not translated, or translated with a difference that
    /// can change what a client gets.
    Warning,
}

/// One line the translation has something to say about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub line: usize,
    pub severity: Severity,
    pub message: String,
}

/// What a route does with the requests it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportedAction {
    /// Whatever the catch-all route does (the upstream, and its front
    /// controller when there is one).
    CatchAll,
    /// To the upstream as it is, no rewrite.
    Upstream,
    Respond(u16),
    Redirect {
        to: String,
        status: u16,
        append_query: bool,
    },
    Rewrite {
        to: String,
        append_query: bool,
    },
}

/// One route of the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportedRoute {
    /// The line it came from (its name is `line-N`).
    pub line: usize,
    pub path_prefix: Option<String>,
    pub path_regex: Option<String>,
    pub query_regex: Option<String>,
    pub host: Option<String>,
    pub action: Option<ImportedAction>,
    /// `rewrite.unless_exists`, with `ImportedAction::Rewrite`.
    pub unless_exists: bool,
    pub access: Option<ImportedAccess>,
    pub response_headers: ImportedHeaders,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportedAccess {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportedHeaders {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

impl ImportedHeaders {
    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    fn yaml(&self) -> String {
        let map = |l: &[(String, String)]| {
            let items: Vec<String> = l
                .iter()
                .map(|(n, v)| format!("{}: {}", q(n), q(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        };
        let mut parts = Vec::new();
        if !self.set.is_empty() {
            parts.push(format!("set: {}", map(&self.set)));
        }
        if !self.add.is_empty() {
            parts.push(format!("add: {}", map(&self.add)));
        }
        if !self.remove.is_empty() {
            let names: Vec<String> = self.remove.iter().map(|n| q(n)).collect();
            parts.push(format!("remove: [{}]", names.join(", ")));
        }
        format!("{{ {} }}", parts.join(", "))
    }
}

/// A translated site.
#[derive(Debug, Clone, Default)]
pub struct Site {
    /// php-fpm's address (`fastcgi://…`) and the document root.
    pub upstream_url: String,
    pub root: String,
    pub access: Option<ImportedAccess>,
    pub response_headers: ImportedHeaders,
    pub request_headers: ImportedHeaders,
    /// `auth.basic` on every route: (realm, users file).
    pub auth: Option<(String, String)>,
    pub routes: Vec<ImportedRoute>,
    /// The catch-all's front controller: `rewrite.to`, query appended.
    pub front: Option<(String, bool)>,
    /// The catch-all's `path_regex` when the front controller names captures.
    pub front_regex: Option<String>,
    /// The URL path the rules apply under (`/` for a site's root).
    pub prefix: String,
    pub findings: Vec<Finding>,
}

/// A YAML double-quoted scalar (JSON's string syntax is YAML's).
fn q(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

impl Site {
    /// The config, ready for `tollgate check`.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "upstreams:\n  php: {{ url: {}, root: {}, index: index.php }}",
            q(&self.upstream_url),
            q(&self.root)
        );
        if let Some(a) = &self.access {
            let _ = writeln!(out, "access: {}", access_yaml(a));
        }
        if !self.response_headers.is_empty() || !self.request_headers.is_empty() {
            let mut parts = Vec::new();
            if !self.request_headers.is_empty() {
                parts.push(format!("request: {}", self.request_headers.yaml()));
            }
            if !self.response_headers.is_empty() {
                parts.push(format!("response: {}", self.response_headers.yaml()));
            }
            let _ = writeln!(out, "headers: {{ {} }}", parts.join(", "));
        }
        out.push_str("routes:\n");
        for r in &self.routes {
            self.route_yaml(&mut out, r, &format!("line-{}", r.line));
        }
        let catch_all = ImportedRoute {
            path_prefix: self.front_regex.is_none().then(|| self.prefix.clone()),
            path_regex: self.front_regex.clone(),
            action: Some(ImportedAction::CatchAll),
            ..Default::default()
        };
        // A front controller's pattern matches every path: nothing after it.
        self.route_yaml(&mut out, &catch_all, "site");
        out
    }

    fn route_yaml(&self, out: &mut String, r: &ImportedRoute, name: &str) {
        let _ = writeln!(out, "  - name: {name}");
        let mut m = Vec::new();
        if let Some(p) = &r.path_prefix {
            m.push(format!("path_prefix: {}", q(p)));
        }
        if let Some(p) = &r.path_regex {
            m.push(format!("path_regex: {}", q(p)));
        }
        if let Some(p) = &r.query_regex {
            m.push(format!("query_regex: {}", q(p)));
        }
        if let Some(h) = &r.host {
            m.push(format!("host: {}", q(h)));
        }
        let _ = writeln!(out, "    match: {{ {} }}", m.join(", "));
        if let Some(a) = &r.access {
            let _ = writeln!(out, "    access: {}", access_yaml(a));
        }
        if let Some((realm, file)) = &self.auth {
            let _ = writeln!(
                out,
                "    auth: {{ basic: {{ realm: {}, users_file: {} }} }}",
                q(realm),
                q(file)
            );
        }
        if !r.response_headers.is_empty() {
            let _ = writeln!(
                out,
                "    headers: {{ response: {} }}",
                r.response_headers.yaml()
            );
        }
        self.action_yaml(out, r);
    }

    /// A route's action: `upstream` (with the front controller for the
    /// catch-all's), `respond`, `redirect` or `rewrite`.
    fn action_yaml(&self, out: &mut String, r: &ImportedRoute) {
        // Another route's own captures are not the front controller's.
        let front_fits = self.front_regex.is_none() || r.path_regex == self.front_regex;
        let upstream = "    upstream: php\n";
        match r.action.as_ref().unwrap_or(&ImportedAction::CatchAll) {
            ImportedAction::CatchAll => match self.front.as_ref().filter(|_| front_fits) {
                Some((to, append)) => {
                    let append = if *append { ", append_query: true" } else { "" };
                    let _ = writeln!(
                        out,
                        "    rewrite: {{ to: {}, unless_exists: true{append} }}",
                        q(to)
                    );
                    out.push_str(upstream);
                }
                None => out.push_str(upstream),
            },
            ImportedAction::Upstream => out.push_str(upstream),
            ImportedAction::Respond(status) => {
                let _ = writeln!(out, "    respond: {{ status: {status} }}");
            }
            ImportedAction::Redirect {
                to,
                status,
                append_query,
            } => {
                let append = if *append_query {
                    ", append_query: true"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "    redirect: {{ to: {}, status: {status}{append} }}",
                    q(to)
                );
            }
            ImportedAction::Rewrite { to, append_query } => {
                let exists = if r.unless_exists {
                    ", unless_exists: true"
                } else {
                    ""
                };
                let append = if *append_query {
                    ", append_query: true"
                } else {
                    ""
                };
                let _ = writeln!(out, "    rewrite: {{ to: {}{exists}{append} }}", q(to));
                out.push_str(upstream);
            }
        }
    }

    /// The findings as `tollgate check` prints problems: `FILE:LINE: warning: …`.
    pub fn report(&self, file: &str) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let kind = match f.severity {
                Severity::Note => "note",
                Severity::Warning => "warning",
            };
            let _ = writeln!(out, "{file}:{}: {kind}: {}", f.line, f.message);
        }
        out
    }
}

fn access_yaml(a: &ImportedAccess) -> String {
    let list = |l: &[String]| l.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ");
    format!(
        "{{ allow: [{}], deny: [{}] }}",
        list(&a.allow),
        list(&a.deny)
    )
}
