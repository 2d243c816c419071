//! `to:` of `redirect` and `rewrite`: a target with `$1…$9`, `${N}` and `${name}` naming `path_regex` captures, parsed once and expanded with one pass over its pieces.
//!
//! A capture can only fill the path and the query: the scheme and host of
//! an absolute target are the config's own, so no request can choose where
//! a redirect sends its client (see [`crate::location`]).

use regex::{CaptureLocations, Regex};

/// The longest `to` a config may write.
pub const MAX_TEMPLATE: usize = 2048;
/// The most capture references one `to` may hold: with requests paths of at
/// most a few KiB, an expansion stays small.
pub const MAX_REFERENCES: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// A capture group by index (0: the whole match).
    Group(usize),
}

/// A parsed `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// `to` as written (shown by `GET /config`).
    pub written: String,
    /// `https://host[:port]` of an absolute target; `None`: a path on this site.
    pub origin: Option<String>,
    /// The path and query pieces, `?` included as text.
    pieces: Vec<Piece>,
    /// Whether `to` carries a query (`?` in its text): then it replaces the request's.
    own_query: bool,
    /// Add the request's query after the template's (Apache's `QSA`).
    append_query: bool,
}

/// A template expanded for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expanded {
    pub path: String,
    pub query: Option<String>,
}

impl Template {
    /// Parses `to` against the route's regex (`None`: no captures, only `$$`
    /// and plain text). The error says what is wrong, for `check`.
    pub fn parse(to: &str, regex: Option<&Regex>, append_query: bool) -> Result<Template, String> {
        if to.len() > MAX_TEMPLATE {
            return Err(format!(
                "`to` is {} bytes; at most {MAX_TEMPLATE}",
                to.len()
            ));
        }
        let (origin, rest) = split_origin(to)?;
        let pieces = pieces(rest, regex)?;
        let references = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Group(_)))
            .count();
        if references > MAX_REFERENCES {
            return Err(format!(
                "`to` names captures {references} times; at most {MAX_REFERENCES}"
            ));
        }
        let own_query = pieces
            .iter()
            .any(|p| matches!(p, Piece::Text(t) if t.contains('?')));
        Ok(Template {
            written: to.to_string(),
            origin,
            pieces,
            own_query,
            append_query,
        })
    }

    /// `append_query` as configured.
    pub fn append_query(&self) -> bool {
        self.append_query
    }

    /// Whether any piece names a capture (else the route need not capture).
    pub fn uses_captures(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Group(_)))
    }

    /// The target for a request whose normalised path is `path` (with the
    /// captures `locs` found in it) and whose query is `query`. A group that
    /// did not take part in the match is empty.
    pub fn expand(
        &self,
        path: &str,
        locs: Option<&CaptureLocations>,
        query: Option<&str>,
    ) -> Expanded {
        let mut out = String::with_capacity(64);
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Group(i) => {
                    if let Some((start, end)) = locs.and_then(|l| l.get(*i)) {
                        out.push_str(&path[start..end]);
                    }
                }
            }
        }
        let query = query.filter(|q| !q.is_empty());
        if !self.own_query {
            return Expanded {
                path: out,
                query: query.map(str::to_string),
            };
        }
        let (path, own) = match out.split_once('?') {
            Some((p, q)) => (p.to_string(), q.to_string()),
            None => (out, String::new()),
        };
        let query = match (own.is_empty(), query.filter(|_| self.append_query)) {
            (true, None) => None,
            (true, Some(q)) => Some(q.to_string()),
            (false, None) => Some(own),
            (false, Some(q)) => Some(format!("{own}&{q}")),
        };
        Expanded { path, query }
    }
}

/// `https://host/rest` → (`https://host`, `/rest`); a local target must start with `/`.
fn split_origin(to: &str) -> Result<(Option<String>, &str), String> {
    let scheme_end = ["https://", "http://"]
        .iter()
        .find(|s| to.len() > s.len() && to[..s.len()].eq_ignore_ascii_case(s))
        .map(|s| s.len());
    let Some(scheme_end) = scheme_end else {
        if to.starts_with("//") || to.starts_with("/\\") {
            return Err(format!(
                "{to:?} starts with `//`, which a browser reads as another host; write `https://host/…` for another site, or one `/` for a path here"
            ));
        }
        if !to.starts_with('/') {
            return Err(format!(
                "{to:?} must start with `/` (a path on this site) or `https://` / `http://`"
            ));
        }
        return Ok((None, to));
    };
    let after = &to[scheme_end..];
    let host_end = after.find(['/', '?']).unwrap_or(after.len());
    let authority = &after[..host_end];
    if authority.contains('$') {
        return Err(format!(
            "{to:?}: a capture cannot choose the host; only the path and query may name `$1` or `${{name}}`"
        ));
    }
    let parsed = authority
        .parse::<http::uri::Authority>()
        .map_err(|_| format!("{to:?}: {authority:?} is not a host"))?;
    if authority.is_empty() || authority.contains('@') || parsed.as_str() != authority {
        return Err(format!("{to:?}: {authority:?} is not a host"));
    }
    let origin = format!("{}{authority}", &to[..scheme_end].to_ascii_lowercase());
    let rest = &after[host_end..];
    Ok((Some(origin), if rest.is_empty() { "/" } else { rest }))
}

/// The braces of a `${name}`, named so that no brace stands alone in a
/// literal of the function below (a line counter that matches braces would
/// read past its end).
const NAME_OPEN: u8 = b'{';
const NAME_CLOSE: char = '}';

/// The pieces of the path-and-query part; every `$` names a capture or is `$$`.
fn pieces(text: &str, regex: Option<&Regex>) -> Result<Vec<Piece>, String> {
    let groups = regex.map_or(1, Regex::captures_len);
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (group, used) = match after.as_bytes().first() {
            Some(b'$') => {
                literal.push('$');
                rest = &after[1..];
                continue;
            }
            Some(d @ b'0'..=b'9') => (usize::from(d - b'0'), 1),
            Some(&NAME_OPEN) => {
                let end = after
                    .find(NAME_CLOSE)
                    .ok_or_else(|| format!("unterminated `${}` in {text:?}", NAME_OPEN as char))?;
                (named(&after[1..end], regex, text)?, end + 1)
            }
            _ => {
                return Err(format!(
                    "`$` in {text:?} must be followed by a digit or `{{name}}`; write `$$` for a dollar sign"
                ))
            }
        };
        if group >= groups {
            return Err(match regex {
                None => format!(
                    "{text:?} names capture {group}, but the route has no `match.path_regex`"
                ),
                Some(r) => format!(
                    "{text:?} names capture {group}, but `{}` has {} group(s)",
                    r.as_str(),
                    groups - 1
                ),
            });
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut literal)));
        }
        pieces.push(Piece::Group(group));
        rest = &after[used..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(pieces)
}

/// `${N}` or `${name}`: the group's index.
fn named(name: &str, regex: Option<&Regex>, text: &str) -> Result<usize, String> {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        // Bounded by the caller against the groups the regex has.
        return Ok(name.parse().unwrap_or(usize::MAX));
    }
    regex
        .and_then(|r| r.capture_names().position(|n| n == Some(name)))
        .ok_or_else(|| {
            format!(
                "{text:?} names capture {name:?}, which the route's `path_regex` does not define"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(re: &str, to: &str, path: &str, query: Option<&str>) -> Expanded {
        let re = Regex::new(re).unwrap();
        let t = Template::parse(to, Some(&re), false).unwrap();
        let mut locs = re.capture_locations();
        re.captures_read(&mut locs, path).unwrap();
        t.expand(path, Some(&locs), query)
    }

    #[test]
    fn numbered_and_named_captures_fill_the_path_and_the_query_is_kept() {
        let e = expand(
            r"^/blog/(\d+)/(?P<slug>.*)$",
            "/posts/$1/${slug}",
            "/blog/7/hi",
            Some("a=1"),
        );
        assert_eq!(e.path, "/posts/7/hi");
        assert_eq!(e.query.as_deref(), Some("a=1"));
        let e = expand(r"^/p/(\w+)$", "/index.php?product=$1", "/p/x", Some("a=1"));
        assert_eq!(
            (e.path.as_str(), e.query.as_deref()),
            ("/index.php", Some("product=x"))
        );
        let e = expand(r"^/p/(\w+)$", "/new?", "/p/x", Some("a=1"));
        assert_eq!(
            (e.path.as_str(), e.query),
            ("/new", None),
            "a bare `?` drops the query"
        );
    }

    #[test]
    fn appending_keeps_both_queries() {
        let re = Regex::new(r"^/p/(\w+)$").unwrap();
        let t = Template::parse("/i.php?p=$1", Some(&re), true).unwrap();
        let mut locs = re.capture_locations();
        re.captures_read(&mut locs, "/p/x").unwrap();
        assert_eq!(
            t.expand("/p/x", Some(&locs), Some("b=2")).query.as_deref(),
            Some("p=x&b=2")
        );
    }

    #[test]
    fn a_capture_can_never_choose_the_host() {
        let re = Regex::new(r"^/(.*)$").unwrap();
        for to in [
            "https://$1/x",
            "https://a${1}b/",
            "//$1",
            "/\\x",
            "x/$1",
            "https://u@h/",
        ] {
            assert!(Template::parse(to, Some(&re), false).is_err(), "{to}");
        }
        let t = Template::parse("HTTPS://New.example/$1", Some(&re), false).unwrap();
        assert_eq!(t.origin.as_deref(), Some("https://New.example"));
    }

    #[test]
    fn references_are_checked_against_the_regex_and_bounded() {
        let re = Regex::new(r"^/(a)(?P<b>b)$").unwrap();
        assert!(Template::parse("/$3", Some(&re), false).is_err());
        assert!(Template::parse("/${c}", Some(&re), false).is_err());
        assert!(Template::parse("/${99999999999999999999999}", Some(&re), false).is_err());
        assert!(Template::parse("/$x", Some(&re), false).is_err());
        assert!(Template::parse("/$1", None, false).is_err());
        assert!(Template::parse(&"/$1".repeat(MAX_REFERENCES + 1), Some(&re), false).is_err());
        assert!(Template::parse(&"/a".repeat(MAX_TEMPLATE), Some(&re), false).is_err());
        assert!(Template::parse("/$$1${2}${b}$0", Some(&re), false).is_ok());
    }
}
