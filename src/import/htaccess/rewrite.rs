//! mod_rewrite and mod_alias lines: `RewriteCond`, `RewriteRule` with its flags, `Redirect`, `RedirectMatch`.

use super::{drop_lookarounds, Cond, Reader};
use crate::import::{ImportedAction, ImportedRoute};

/// What opens a server variable (`%{HTTP_HOST}`) in a substitution. Named,
/// so no brace stands alone in a literal of [`Reader::rule`] (a line counter
/// that matches braces would read past its end).
const SERVER_VARIABLE: &str = "%{";

/// Patterns that match every path: the rule's conditions decide alone.
const EVERYTHING: &[&str] = &[
    "^", ".*", "^.*$", "^(.*)$", "(.*)", ".", "^.*", "^(.+)$", "(.+)", ".+", "^/?(.*)$",
];

/// A `RewriteRule`'s flags.
#[derive(Debug, Default)]
struct Flags {
    redirect: Option<u16>,
    forbidden: bool,
    gone: bool,
    nocase: bool,
    append_query: bool,
    /// `E=`, `T=`: environment and type, which tollgate needs none of.
    env_only: bool,
    unknown: Vec<String>,
}

fn flags(text: Option<&String>) -> Flags {
    let mut f = Flags::default();
    let Some(text) = text else { return f };
    for flag in text.trim_matches(['[', ']']).split(',') {
        let flag = flag.trim();
        let (name, value) = flag.split_once('=').unwrap_or((flag, ""));
        match name.to_ascii_uppercase().as_str() {
            "L" | "END" | "NE" | "PT" | "DPI" => {}
            "NC" => f.nocase = true,
            "QSA" => f.append_query = true,
            "R" => f.redirect = Some(value.parse().unwrap_or(302)),
            "F" => f.forbidden = true,
            "G" => f.gone = true,
            "E" | "T" => f.env_only = true,
            _ => f.unknown.push(flag.to_string()),
        }
    }
    f
}

/// What a rule's conditions come to.
#[derive(Debug, Default)]
struct Conditions {
    /// `!-f` / `!-d` on the requested file: a front controller's.
    missing: bool,
    /// `-f` / `-d`: "an existing file is served as it is".
    exists: bool,
    /// `%{REQUEST_URI}` patterns that must match (one OR group), on the path.
    path: Option<String>,
    /// `%{REQUEST_URI}` patterns that must not match.
    not_path: Vec<(usize, String)>,
    query: Option<String>,
    host: Option<String>,
    /// `%{HTTPS}` / `%{SERVER_PORT}`: the scheme.
    scheme: bool,
    /// `%{HTTP:Accept-Encoding}` with a `.gz` sibling: precompressed files.
    gzip: bool,
    untranslated: Vec<(usize, String)>,
}

impl Reader {
    pub(super) fn cond(&mut self, n: usize, a: &[String]) {
        let (Some(var), Some(pattern)) = (a.get(1), a.get(2)) else {
            return self.warn(n, "RewriteCond needs a test string and a pattern");
        };
        let flags = a.get(3).map(|f| f.to_ascii_uppercase()).unwrap_or_default();
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p.to_string()),
            None => (false, pattern.clone()),
        };
        self.conds.push(Cond {
            line: n,
            var: var.clone(),
            pattern,
            negated,
            nocase: flags.contains("NC"),
            or: flags.contains("OR"),
        });
    }

    fn conditions(&mut self, conds: &[Cond]) -> Conditions {
        let mut c = Conditions::default();
        let mut i = 0;
        while i < conds.len() {
            // An [OR] chain is one test: its patterns as one alternation.
            let mut j = i;
            while conds[j].or && j + 1 < conds.len() {
                j += 1;
            }
            let group = &conds[i..=j];
            self.condition_group(group, &mut c);
            i = j + 1;
        }
        c
    }

    fn condition_group(&mut self, group: &[Cond], c: &mut Conditions) {
        let first = &group[0];
        let var = first.var.to_ascii_uppercase();
        let same_var = group.iter().all(|g| g.var.eq_ignore_ascii_case(&first.var));
        let alternation = || {
            let parts: Vec<String> = group
                .iter()
                .map(|g| {
                    if g.nocase {
                        format!("(?i:{})", g.pattern)
                    } else {
                        format!("(?:{})", g.pattern)
                    }
                })
                .collect();
            parts.join("|")
        };
        match var.as_str() {
            "%{REQUEST_FILENAME}"
                if group
                    .iter()
                    .all(|g| matches!(g.pattern.as_str(), "-f" | "-d" | "-s" | "-l")) =>
            {
                if group.iter().all(|g| g.negated) {
                    c.missing = true;
                } else {
                    c.exists = true;
                }
            }
            "%{REQUEST_FILENAME}\\.GZ" | "%{HTTP:ACCEPT-ENCODING}" => c.gzip = true,
            "%{HTTPS}" | "%{SERVER_PORT}" | "%{REQUEST_SCHEME}" => c.scheme = true,
            "%{QUERY_STRING}" if same_var && !first.negated => c.query = Some(alternation()),
            "%{REQUEST_URI}" if same_var && group.len() == 1 && first.negated => c.not_path.push((
                first.line,
                first.pattern.trim_start_matches('=').to_string(),
            )),
            "%{REQUEST_URI}" if same_var && !first.negated => c.path = Some(alternation()),
            "%{HTTP_HOST}" if group.len() == 1 && !first.negated => {
                match literal_host(&first.pattern) {
                    Some(h) => c.host = Some(h),
                    None => c.untranslated.push((
                        first.line,
                        format!("the host pattern {:?} is not a plain name", first.pattern),
                    )),
                }
            }
            _ => {
                for g in group {
                    c.untranslated.push((
                        g.line,
                        format!("the condition on {} is not translated", g.var),
                    ));
                }
            }
        }
    }

    pub(super) fn rule(&mut self, n: usize, a: &[String]) {
        let conds = std::mem::take(&mut self.conds);
        let (Some(pattern), Some(target)) = (a.get(1), a.get(2)) else {
            return self.warn(n, "RewriteRule needs a pattern and a substitution");
        };
        let f = flags(a.get(3));
        let c = self.conditions(&conds);
        if let Some(flag) = f.unknown.first() {
            return self.warn(
                n,
                format!("the flag [{flag}] is not translated; rule skipped"),
            );
        }
        if c.gzip {
            return self.note(n, "precompressed .gz siblings: tollgate serves them itself (`app.css.gz` for `app.css`)");
        }
        if f.env_only && target == "-" {
            return self.note(n, "environment for PHP: tollgate passes HTTPS and HTTP_AUTHORIZATION to php-fpm itself");
        }
        if c.exists && target == "-" {
            return self.note(n, "an existing file is served as it is: the catch-all's front controller has `unless_exists`");
        }
        if c.scheme {
            return self.warn(n, "a redirect by scheme (http → https) is `server.tls.redirect_plain`, not a route; rule skipped");
        }
        if let Some((line, why)) = c.untranslated.first().cloned() {
            return self.warn(line, format!("{why}; the rule on line {n} is skipped"));
        }
        if target.contains(SERVER_VARIABLE)
            || target.contains('%') && target.chars().any(|ch| ch.is_ascii_digit())
        {
            return self.warn(n, format!("the substitution {target:?} names server variables or condition back-references; rule skipped"));
        }
        self.rule_route(n, pattern, target, &f, c);
    }

    fn rule_route(&mut self, n: usize, pattern: &str, target: &str, f: &Flags, c: Conditions) {
        // A pattern that matches everything still gives the captures a target names.
        let everything = EVERYTHING.contains(&pattern) && !names_captures(target);
        let denies = f.forbidden || f.gone;
        let mut regex = if everything {
            None
        } else {
            Some(self.path_pattern(pattern, f.nocase))
        };
        if regex
            .as_ref()
            .is_some_and(|r| r.contains("(?!") || r.contains("(?=") || r.contains("(?<"))
        {
            if !denies {
                return self.warn(n, "the pattern uses look-around, which tollgate's regular expressions do not; rule skipped");
            }
            regex = regex.map(|r| drop_lookarounds(&r));
            self.note(n, "look-around dropped from a deny rule: it now denies more (tollgate never serves dot files from a root either)");
        }
        if let Some(path) = &c.path {
            if regex.is_some() {
                return self.warn(n, "both the pattern and a %{REQUEST_URI} condition constrain the path; rule skipped");
            }
            regex = Some(path.clone());
        }
        if let Some(r) = &regex {
            if let Err(e) = crate::config::site::compile(r) {
                return self.warn(n, format!("the pattern cannot be translated: {e}"));
            }
        }
        let action = self.action(target, f);
        let matches_all = everything || EVERYTHING.contains(&pattern);
        let front =
            matches_all && c.missing && c.query.is_none() && c.host.is_none() && c.path.is_none();
        if let (true, ImportedAction::Rewrite { to, append_query }) = (front, &action) {
            self.site.front = Some((to.clone(), *append_query));
            self.site.front_regex = regex.clone();
            for (line, p) in &c.not_path {
                self.note(*line, format!("`!{p}`: the front controller rewrites only paths that name no file, so it never rewrites an existing script"));
            }
            return;
        }
        if !self.exceptions(n, denies, &c) {
            return;
        }
        let prefix = regex.is_none().then(|| self.base.clone());
        self.site.routes.push(ImportedRoute {
            line: n,
            path_prefix: prefix,
            path_regex: regex,
            query_regex: c.query,
            host: c.host,
            unless_exists: c.missing,
            action: Some(action),
            ..Default::default()
        });
    }

    /// What a rule does: deny (`F`, `G`), pass (`-`), redirect (`R`) or rewrite.
    fn action(&self, target: &str, f: &Flags) -> ImportedAction {
        if f.forbidden {
            ImportedAction::Respond(403)
        } else if f.gone {
            ImportedAction::Respond(410)
        } else if target == "-" {
            ImportedAction::Upstream
        } else if let Some(status) = f.redirect {
            ImportedAction::Redirect {
                to: self.target(target),
                status,
                append_query: f.append_query,
            }
        } else {
            ImportedAction::Rewrite {
                to: self.target(target),
                append_query: f.append_query,
            }
        }
    }

    /// `!%{REQUEST_URI}` conditions of rule `n`: exceptions to a deny become
    /// routes before it (later rules then do not apply to them: said so);
    /// on a rewrite of missing paths they are implied. `false`: the rule
    /// cannot be translated (warned).
    fn exceptions(&mut self, n: usize, denies: bool, c: &Conditions) -> bool {
        match (denies, c.missing) {
            (true, _) => {
                for (line, p) in &c.not_path {
                    self.note(*line, format!("`!{p}`: an exception to the deny on line {n}, a route before it that goes where the catch-all goes"));
                    let guard = ImportedRoute {
                        line: *line,
                        path_regex: Some(p.clone()),
                        action: Some(ImportedAction::CatchAll),
                        ..Default::default()
                    };
                    self.site.routes.push(guard);
                }
                true
            }
            (false, true) => {
                for (line, p) in &c.not_path {
                    self.note(
                        *line,
                        format!(
                            "`!{p}`: implied, the rewrite applies only to paths that name no file"
                        ),
                    );
                }
                true
            }
            (false, false) => match c.not_path.first() {
                Some((line, p)) => {
                    let line = *line;
                    let why = format!("`!{p}` on a rule that is not a deny is not translated; the rule on line {n} is skipped");
                    self.warn(line, why);
                    false
                }
                None => true,
            },
        }
    }

    /// A per-directory pattern as a `path_regex` on the whole path.
    fn path_pattern(&self, pattern: &str, nocase: bool) -> String {
        let nc = if nocase { "(?i)" } else { "" };
        match pattern.strip_prefix('^') {
            Some(rest) => format!(
                "{nc}^{}{}",
                regex::escape(&self.base),
                rest.trim_start_matches('/')
            ),
            None => format!("{nc}{pattern}"),
        }
    }

    /// A substitution as a `to`: relative ones under `RewriteBase`.
    fn target(&self, target: &str) -> String {
        if target.starts_with('/') || target.contains("://") {
            target.to_string()
        } else {
            format!("{}{target}", self.base)
        }
    }

    pub(super) fn redirect(&mut self, n: usize, lower: &str, a: &[String]) {
        let mut words: Vec<&str> = a[1..].iter().map(String::as_str).collect();
        let status = match lower {
            "redirectpermanent" => 301,
            "redirecttemp" => 302,
            _ => match words.first().map(|w| w.to_ascii_lowercase()).as_deref() {
                Some("permanent") => {
                    words.remove(0);
                    301
                }
                Some("temp") => {
                    words.remove(0);
                    302
                }
                Some("seeother") => {
                    words.remove(0);
                    303
                }
                Some("gone") => {
                    words.remove(0);
                    410
                }
                Some(w) if w.len() == 3 && w.parse::<u16>().is_ok() => {
                    words.remove(0);
                    w.parse().unwrap_or(302)
                }
                _ => 302,
            },
        };
        let (Some(from), to) = (words.first(), words.get(1)) else {
            return self.warn(n, "a redirect needs a path");
        };
        let regex = if lower == "redirectmatch" {
            from.to_string()
        } else {
            // `Redirect /old URL` also sends `/old/x` to `URL/x`.
            format!("^{}(/.*)?$", regex::escape(from.trim_end_matches('/')))
        };
        if let Err(e) = crate::config::site::compile(&regex) {
            return self.warn(n, format!("the pattern cannot be translated: {e}"));
        }
        let action = match (status, to) {
            (410, _) => ImportedAction::Respond(410),
            (_, Some(to)) if lower == "redirectmatch" => ImportedAction::Redirect {
                to: to.to_string(),
                status,
                append_query: false,
            },
            (_, Some(to)) => ImportedAction::Redirect {
                to: format!("{}$1", to.trim_end_matches('/')),
                status,
                append_query: false,
            },
            (_, None) => return self.warn(n, "a redirect needs a target"),
        };
        self.site.routes.push(ImportedRoute {
            line: n,
            path_regex: Some(regex),
            action: Some(action),
            ..Default::default()
        });
    }
}

/// Whether a substitution names a capture of the rule's pattern (`$1`).
fn names_captures(target: &str) -> bool {
    target
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && w[1].is_ascii_digit())
}

/// `^www\.example\.com$` → `www.example.com`; `None` for a real pattern.
fn literal_host(pattern: &str) -> Option<String> {
    let p = pattern
        .trim_start_matches('^')
        .trim_end_matches('$')
        .replace("\\.", ".");
    p.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        .then(|| p.to_ascii_lowercase())
        .filter(|p| !p.is_empty())
}
