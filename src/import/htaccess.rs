//! An Apache `.htaccess` read directive by directive: mod_rewrite rules and their common conditions, mod_alias redirects, `<Files>`/`<FilesMatch>` access blocks, `Require`/`Allow`/`Deny`, basic auth and header rules.
//!
//! Apache matches a per-directory `RewriteRule` pattern against the path
//! without its directory (no leading `/`); tollgate's `path_regex` sees the
//! whole normalised path, so an anchored pattern gets the directory's prefix
//! (`^foo` → `^/foo`), and a relative substitution the `RewriteBase`. A
//! pattern the `regex` crate cannot run (look-around) is translated without
//! it only where that denies more, never less.

use super::{
    Finding, ImportedAccess, ImportedAction, ImportedHeaders, ImportedRoute, Severity, Site,
};

/// What the command line says about the site.
#[derive(Debug, Clone)]
pub struct Options {
    /// The document root php-fpm sees.
    pub root: String,
    /// php-fpm's address, `fastcgi://…`.
    pub upstream_url: String,
    /// The URL path the `.htaccess` applies under (`/` for the root).
    pub prefix: String,
}

/// One `RewriteCond`.
#[derive(Debug, Clone)]
struct Cond {
    line: usize,
    var: String,
    pattern: String,
    negated: bool,
    nocase: bool,
    or: bool,
}

/// An open `<Files>` / `<FilesMatch>` block.
#[derive(Debug, Default)]
struct FilesBlock {
    line: usize,
    /// The block's file-name pattern, as a `path_regex`.
    path_regex: String,
    denied: bool,
    access: Option<ImportedAccess>,
    headers: ImportedHeaders,
}

/// The state of one pass over the file.
struct Reader {
    site: Site,
    base: String,
    conds: Vec<Cond>,
    /// Open `<IfModule>` blocks: whether each is active.
    modules: Vec<bool>,
    files: Option<FilesBlock>,
    auth_type: bool,
    realm: String,
    users_file: Option<String>,
    require_user: bool,
    auth_line: usize,
}

/// Translates `text`; the findings name the lines they concern.
pub fn translate(text: &str, options: &Options) -> Site {
    let mut r = Reader {
        site: Site {
            upstream_url: options.upstream_url.clone(),
            root: options.root.clone(),
            prefix: options.prefix.clone(),
            ..Default::default()
        },
        base: options.prefix.clone(),
        conds: Vec::new(),
        modules: Vec::new(),
        files: None,
        auth_type: false,
        realm: "Restricted".into(),
        users_file: None,
        require_user: false,
        auth_line: 0,
    };
    for (n, raw) in logical_lines(text) {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        r.directive(n, line);
    }
    r.finish();
    r.site
}

/// Lines with `\` continuations joined, each with its first line's number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let (body, continues) = match line.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (line, false),
        };
        match out.last_mut() {
            Some((_, prev)) if open => prev.push_str(body),
            _ => out.push((i + 1, body.to_string())),
        }
        open = continues;
    }
    out
}

/// A directive's arguments: words, or double-quoted strings.
fn args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'"') => word.push(chars.next().unwrap_or('"')),
                    '"' => break,
                    c => word.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        out.push(word);
    }
    out
}

/// Modules tollgate stands in for: their blocks apply. Any other module
/// (mod_php, mod_expires, …) is not there, so `<IfModule mod_x.c>` is skipped
/// and `<IfModule !mod_x.c>` applies.
const PRESENT: &[&str] = &[
    "mod_rewrite",
    "mod_headers",
    "mod_alias",
    "mod_authz_core",
    "mod_authz_host",
    "mod_auth_basic",
    "mod_authn_file",
    "mod_dir",
    "mod_mime",
    "mod_autoindex",
    "mod_setenvif",
    "mod_deflate",
    "mod_filter",
];

fn module_present(name: &str) -> bool {
    let name = name.trim_end_matches(".c");
    PRESENT.contains(&name)
}

impl Reader {
    fn note(&mut self, line: usize, message: impl Into<String>) {
        self.site.findings.push(Finding {
            line,
            severity: Severity::Note,
            message: message.into(),
        });
    }

    fn warn(&mut self, line: usize, message: impl Into<String>) {
        self.site.findings.push(Finding {
            line,
            severity: Severity::Warning,
            message: message.into(),
        });
    }

    fn active(&self) -> bool {
        self.modules.iter().all(|&a| a)
    }

    fn directive(&mut self, n: usize, line: &str) {
        let a = args(line);
        let Some(name) = a.first() else { return };
        let lower = name.to_ascii_lowercase();
        if let Some(block) = lower.strip_prefix('<') {
            return self.open_or_close(n, block.trim_end_matches('>'), &a);
        }
        if !self.active() {
            return;
        }
        if self.files.is_some() {
            return self.in_files(n, &lower, &a);
        }
        match lower.as_str() {
            "rewriteengine" | "rewriteoptions" => {}
            "rewritebase" => self.base = a.get(1).map_or("/".into(), |b| with_slashes(b)),
            "rewritecond" => self.cond(n, &a),
            "rewriterule" => self.rule(n, &a),
            "redirect" | "redirectpermanent" | "redirecttemp" | "redirectmatch" => {
                self.redirect(n, &lower, &a)
            }
            "header" => {
                let mut h = std::mem::take(&mut self.site.response_headers);
                self.header(n, &a, &mut h);
                self.site.response_headers = h;
            }
            "requestheader" => {
                let mut h = std::mem::take(&mut self.site.request_headers);
                self.header(n, &a, &mut h);
                self.site.request_headers = h;
            }
            "require" | "order" | "allow" | "deny" | "satisfy" => {
                let mut access = self.site.access.take().unwrap_or_default();
                let mut denied = false;
                self.access(n, &a, &mut access, &mut denied);
                if denied {
                    access.deny = vec!["all".into()];
                }
                self.site.access =
                    Some(access).filter(|a| !a.allow.is_empty() || !a.deny.is_empty());
            }
            "authtype" | "authname" | "authuserfile" | "authbasicprovider" => {
                self.auth(n, &lower, &a)
            }
            _ => self.other(n, &lower, line),
        }
    }

    fn open_or_close(&mut self, n: usize, block: &str, a: &[String]) {
        match block {
            "ifmodule" => {
                let module = a.get(1).map_or("", |m| m.trim_end_matches('>'));
                let active = match module.strip_prefix('!') {
                    Some(m) => !module_present(m),
                    None => module_present(module),
                };
                if !active && self.active() {
                    self.note(n, format!("<IfModule {module}> does not apply in front of php-fpm; its lines are skipped"));
                }
                self.modules.push(active);
            }
            "/ifmodule" => {
                self.modules.pop();
            }
            "files" | "filesmatch" if self.active() => {
                let mut words = a[1..]
                    .iter()
                    .map(|w| w.trim_end_matches('>'))
                    .filter(|w| !w.is_empty());
                let first = words.next().unwrap_or("");
                let (regex, pattern) = match (block, first) {
                    ("files", "~") => (true, words.next().unwrap_or("")),
                    ("files", name) => (false, name),
                    (_, pattern) => (true, pattern),
                };
                let path_regex = if regex {
                    files_regex(pattern)
                } else {
                    format!("(?:^|/){}$", regex::escape(pattern))
                };
                self.files = Some(FilesBlock {
                    line: n,
                    path_regex,
                    ..Default::default()
                });
            }
            "/files" | "/filesmatch" => {
                if let Some(block) = self.files.take() {
                    self.close_files(block);
                }
            }
            "files" | "filesmatch" => {}
            other => self.warn(n, format!("<{other}> blocks are not translated")),
        }
    }

    fn in_files(&mut self, n: usize, lower: &str, a: &[String]) {
        let mut block = self.files.take().expect("in a files block");
        match lower {
            "require" | "order" | "allow" | "deny" | "satisfy" => {
                let mut access = block.access.take().unwrap_or_default();
                self.access(n, a, &mut access, &mut block.denied);
                block.access = Some(access).filter(|a| !a.allow.is_empty());
            }
            "header" => self.header(n, a, &mut block.headers),
            "expiresactive" | "expiresdefault" | "expiresbytype" => self.note(
                n,
                "expiry headers: tollgate's static files carry Cache-Control by type (`upstreams.php.cache_control` sets one); add a `headers` rule for others",
            ),
            _ => self.warn(n, format!("`{}` inside <Files> is not translated", a[0])),
        }
        self.files = Some(block);
    }

    fn close_files(&mut self, block: FilesBlock) {
        let FilesBlock {
            line,
            path_regex,
            denied,
            access,
            headers,
        } = block;
        if crate::config::site::compile(&path_regex).is_err() {
            return self.warn(
                line,
                format!("the file pattern cannot be translated ({path_regex})"),
            );
        }
        let action = if denied && access.is_none() {
            ImportedAction::Respond(403)
        } else {
            ImportedAction::CatchAll
        };
        if action == ImportedAction::CatchAll && access.is_none() && headers.is_empty() {
            return;
        }
        let access = access.map(|mut a| {
            a.deny = vec!["all".into()];
            a
        });
        self.site.routes.push(ImportedRoute {
            line,
            path_regex: Some(path_regex),
            action: Some(action),
            access,
            response_headers: headers,
            ..Default::default()
        });
    }

    /// `Require`, `Order`, `Allow from`, `Deny from`: into `access`
    /// (`denied`: everyone is refused but the allowed).
    fn access(&mut self, n: usize, a: &[String], access: &mut ImportedAccess, denied: &mut bool) {
        let words: Vec<String> = a.iter().map(|w| w.to_ascii_lowercase()).collect();
        match words
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["require", "all", "denied"] | ["deny", "from", "all"] => *denied = true,
            ["require", "all", "granted"] | ["allow", "from", "all"] | ["satisfy", "any"] => {}
            ["order", _] | ["order", _, _] => {
                // `Order allow,deny` with no `Allow` refuses everyone.
                if words[1..].join("").replace(' ', "") == "allow,deny" {
                    *denied = true;
                }
            }
            ["require", "ip", ..] | ["allow", "from", ..] => {
                // `Require ip A B` and `Allow from A B`: the addresses follow two words.
                access.allow.extend(a[2..].iter().map(|s| ip_entry(s)));
                *denied = true;
            }
            ["deny", "from", ..] => access.deny.extend(a[2..].iter().map(|s| ip_entry(s))),
            ["require", "valid-user"] | ["require", "user", ..] => self.require_user = true,
            _ => self.warn(n, format!("`{}` is not translated", a.join(" "))),
        }
    }

    fn header(&mut self, n: usize, a: &[String], rules: &mut ImportedHeaders) {
        let mut words: Vec<&str> = a[1..].iter().map(String::as_str).collect();
        if words.first().is_some_and(|w| {
            w.eq_ignore_ascii_case("always") || w.eq_ignore_ascii_case("onsuccess")
        }) {
            words.remove(0);
        }
        let condition = words
            .iter()
            .skip(2)
            .any(|w| w.starts_with("env=") || w.starts_with("expr="));
        match (
            words.first().map(|w| w.to_ascii_lowercase()).as_deref(),
            words.get(1),
            words.get(2),
        ) {
            _ if condition => self.warn(
                n,
                "a conditional header rule (`env=`, `expr=`) is not translated",
            ),
            (Some("set"), Some(name), Some(value)) => {
                rules.set.push((name.to_string(), value.to_string()))
            }
            (Some("append" | "add" | "merge"), Some(name), Some(value)) => {
                rules.add.push((name.to_string(), value.to_string()))
            }
            (Some("unset"), Some(name), None) => rules.remove.push(name.to_string()),
            _ => self.warn(n, format!("`{}` is not translated", a.join(" "))),
        }
    }

    fn auth(&mut self, n: usize, lower: &str, a: &[String]) {
        let value = a.get(1).cloned().unwrap_or_default();
        self.auth_line = self.auth_line.max(n);
        match lower {
            "authtype" if value.eq_ignore_ascii_case("basic") => self.auth_type = true,
            "authtype" => self.warn(
                n,
                format!("AuthType {value} is not translated (only Basic)"),
            ),
            "authname" => self.realm = value.replace(['"', '\\'], ""),
            "authuserfile" => self.users_file = Some(value),
            _ => {}
        }
    }

    /// Directives tollgate needs nothing for, or cannot translate.
    fn other(&mut self, n: usize, lower: &str, line: &str) {
        let note = match lower {
            "options" | "indexignore" => Some("tollgate never lists a directory and follows no symlink out of the root"),
            "directoryindex" => Some("the upstream's `index` (index.php) answers a directory"),
            "addtype" | "addencoding" | "adddefaultcharset" | "addcharset" => Some("tollgate serves the static types it knows with their own types (docs/PHP.md)"),
            "expiresactive" | "expiresdefault" | "expiresbytype" => Some("expiry headers: tollgate's static files carry Cache-Control by type (`upstreams.php.cache_control` sets one)"),
            "fallbackresource" => Some("the catch-all route's front controller does this"),
            "php_value" | "php_flag" | "php_admin_value" | "php_admin_flag" => Some("PHP settings belong in the php-fpm pool (`php_value[...]`)"),
            "serversignature" | "fileetag" => Some("nothing to do"),
            _ => None,
        };
        match (note, lower) {
            (Some(note), _) => self.note(n, note),
            (None, "errordocument") if line.trim_end().ends_with(".php") => {
                self.note(n, "PHP answers its own errors through the front controller; tollgate's own use `server.error_pages`")
            }
            (None, "errordocument") => self.warn(n, format!("`{line}`: tollgate's own error pages are `server.error_pages` (an HTML file per status)")),
            (None, _) => self.warn(n, format!("`{line}` is not translated")),
        }
    }

    fn finish(&mut self) {
        if self.auth_type || self.users_file.is_some() || self.require_user {
            match (&self.users_file, self.require_user) {
                (Some(file), true) => self.site.auth = Some((self.realm.clone(), file.clone())),
                _ => self.warn(
                    self.auth_line,
                    "basic auth needs AuthType Basic, AuthUserFile and `Require valid-user`",
                ),
            }
        }
        if !self.conds.is_empty() {
            let line = self.conds[0].line;
            self.warn(
                line,
                "RewriteCond without a RewriteRule after it is ignored",
            );
        }
    }
}

/// `RewriteBase` as a directory: `/` first and last.
fn with_slashes(b: &str) -> String {
    let t = b.trim_matches('/');
    if t.is_empty() {
        "/".into()
    } else {
        format!("/{t}/")
    }
}

/// An `Allow from` / `Require ip` entry as `access` takes it (a partial
/// IPv4 address like `10.1` is a network).
fn ip_entry(s: &str) -> String {
    let parts: Vec<&str> = s.split('.').collect();
    if !s.contains(['/', ':']) && parts.len() < 4 && parts.iter().all(|p| p.parse::<u8>().is_ok()) {
        let mut octets = parts.clone();
        octets.resize(4, "0");
        return format!("{}/{}", octets.join("."), parts.len() * 8);
    }
    s.to_string()
}

/// A `<FilesMatch>` pattern (on a file's name) as a `path_regex` (on the
/// whole path): `^` then means "after a `/`"; a look-ahead is dropped, which
/// makes the block match more (it denies more, never less).
pub(super) fn files_regex(pattern: &str) -> String {
    let pattern = drop_lookarounds(pattern);
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut class = false;
    let mut escaped = false;
    for c in pattern.chars() {
        match c {
            _ if escaped => {
                escaped = false;
                out.push(c);
                continue;
            }
            '\\' => escaped = true,
            '[' => class = true,
            ']' => class = false,
            '^' if !class => {
                out.push_str("(?:^|/)");
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// `(?!…)`, `(?=…)`, `(?<!…)`, `(?<=…)` removed (with their content).
pub(super) fn drop_lookarounds(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let b = pattern.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let rest = &pattern[i..];
        let look = ["(?!", "(?=", "(?<!", "(?<="]
            .iter()
            .find(|p| rest.starts_with(**p));
        if look.is_some() {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'\\' => j += 1,
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        let ch = rest.chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

mod rewrite;

#[cfg(test)]
mod tests;
