//! serde's messages in operator terms: what a key expects in YAML ("a whole number, e.g. `limit: 100`"), never a Rust type, and where that key is.
//!
//! serde reports the first value that does not fit the schema as
//! `path: invalid type: string "100/min", expected u64`; the expected side
//! names a Rust type (`u64`, `struct RawLimiter`). This file rewrites the known shapes of that message into
//! the YAML the key takes, adds a did-you-mean to an unknown key, and puts
//! the problem at the key's own path, so it is located at that key rather
//! than at the mapping around it.

use super::error::ConfigProblem;
use super::suggest;

/// Where a problem is shown: at the key (one the schema does not have) or at its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Anchor {
    Key,
    Value,
}

/// One serde message as a problem at its path. `is_path` tells whether a
/// prefix of the message is a path of the document (serde writes
/// `path: message`, and a key may itself contain `: `).
pub(super) fn problem(message: &str, is_path: impl Fn(&str) -> bool) -> (ConfigProblem, Anchor) {
    let (path, message) = split_path(message, &is_path);
    match message.strip_prefix("unknown field `") {
        Some(rest) => (unknown_key(path, rest), Anchor::Key),
        None => (value_problem(path, message), Anchor::Value),
    }
}

/// A value that is not what its key takes.
fn value_problem(path: &str, message: &str) -> ConfigProblem {
    let key = last_key(path);
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or(rest);
        return ConfigProblem::at(path, format!("needs `{field}`"));
    }
    // The schema has no untagged enum (their errors lose the path); should
    // one come back, its message must still not name a Rust type.
    if message.starts_with("data did not match any variant") {
        return ConfigProblem::at(
            path,
            format!("`{key}` does not take this kind of value; docs/CONFIG.md lists what it takes"),
        );
    }
    for kind in ["invalid type: ", "invalid value: "] {
        let Some(rest) = message.strip_prefix(kind) else {
            continue;
        };
        let Some((found, expected)) = rest.rsplit_once(", expected ") else {
            continue;
        };
        let shape = shape(expected, key, path);
        let found = found_in_yaml(found);
        let hint = indent_hint(expected, key, &found);
        // A number of the right kind but out of range: say the range.
        let out_of_range = kind == "invalid value: " || found.starts_with("the number -");
        let range = match largest(expected) {
            Some(max) if out_of_range && !found.ends_with("too large") => {
                format!(", out of range (0 to {max})")
            }
            _ => String::new(),
        };
        return ConfigProblem::at(
            path,
            format!("expected {shape}, found {found}{range}{hint}"),
        );
    }
    ConfigProblem::at(path, message)
}

/// `limiters.strict.limit: message` → (`limiters.strict.limit`, `message`).
fn split_path<'m>(message: &'m str, is_path: &impl Fn(&str) -> bool) -> (&'m str, &'m str) {
    let mut from = 0;
    while let Some(i) = message[from..].find(": ") {
        let cut = from + i;
        if is_path(&message[..cut]) {
            return (&message[..cut], &message[cut + 2..]);
        }
        from = cut + 2;
    }
    ("", message)
}

/// The key a path ends in: `limit` for `limiters.strict.limit`, `limiters` for `routes[0].limiters[1]`.
fn last_key(path: &str) -> &str {
    let without_index = path.trim_end_matches(|c: char| c == ']' || c.is_ascii_digit() || c == '[');
    without_index.rsplit('.').next().unwrap_or(without_index)
}

/// `limt`, expected one of `algorithm`, `limit`, … → an unknown key at its own path, with the closest allowed one.
/// A reader that knows whose keys these are says so after `; these are the keys of ` (a limiter: its algorithm's).
fn unknown_key(parent: &str, rest: &str) -> ConfigProblem {
    let (rest, owner) = rest
        .split_once("; these are the keys of ")
        .map_or((rest, None), |(rest, owner)| (rest, Some(owner)));
    let (field, allowed) = rest.split_once('`').unwrap_or((rest, ""));
    let allowed: Vec<&str> = allowed.split('`').skip(1).step_by(2).collect();
    let at = if parent.is_empty() {
        field.to_string()
    } else {
        format!("{parent}.{field}")
    };
    let list = if allowed.is_empty() {
        "none".to_string()
    } else {
        allowed.join(", ")
    };
    let hint = suggest::hint(field, allowed.iter().copied());
    let whose = owner.map_or("keys here".to_string(), |o| format!("keys of {o}"));
    ConfigProblem::at(at, format!("unknown key `{field}`{hint} ({whose}: {list})"))
}

/// What a key expects, in YAML terms, from serde's name of it.
fn shape(expected: &str, key: &str, path: &str) -> String {
    let number_example = match key {
        "status" => "429",
        "ipv6_prefix" => "64",
        "after" => "3",
        "max_fails" | "max_conns" | "workers" => "4",
        _ => "100",
    };
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64" => {
            format!("a whole number, e.g. `{key}: {number_example}`")
        }
        "f32" | "f64" => format!("a number, e.g. `{key}: 0.5`"),
        "a boolean" => format!("`true` or `false`, e.g. `{key}: true`"),
        "a string" | "a borrowed string" => {
            format!("text (in quotes if it looks like a number), e.g. `{key}: \"…\"`")
        }
        "a sequence" if key == "limiters" => {
            "a list of limiter names, e.g. `limiters: [per_ip]`".into()
        }
        "a sequence" if key == "routes" => "a list of routes, e.g. `routes: [{ name: api, match: { path_prefix: /api }, upstream: app }]`".into(),
        "a sequence" if key == "methods" => "a list of methods, e.g. `methods: [GET, POST]`".into(),
        "a sequence" => format!("a list, e.g. `{key}: [a, b]`"),
        "a map" if key == "query" => {
            "a mapping of parameter names to values, e.g. `query: { action: login }`".into()
        }
        "a map" => {
            format!("a mapping of names to their settings, e.g. `{key}: {{ name: {{ … }} }}`")
        }
        other => match other.strip_prefix("struct ") {
            Some(name) => mapping(name, key, path),
            // Our own types say what they expect in YAML terms already.
            None => other.to_string(),
        },
    }
}

/// The largest value of an unsigned integer key, by serde's name of its type.
fn largest(expected: &str) -> Option<u64> {
    match expected {
        "u8" => Some(u8::MAX.into()),
        "u16" => Some(u16::MAX.into()),
        "u32" => Some(u32::MAX.into()),
        "u64" => Some(u64::MAX),
        _ => None,
    }
}

/// What a section or an entry of a map is, for the serde struct that reads it.
fn mapping(rust_name: &str, key: &str, path: &str) -> String {
    match rust_name {
        "RawLimiter" => {
            "a limiter: a mapping of its settings, e.g. `{ limit: 100, window: 1m, key: ip }`".into()
        }
        "RawUpstream" => {
            "an upstream: a mapping of its settings, e.g. `{ url: \"http://127.0.0.1:8000\" }`"
                .into()
        }
        "RawRoute" => "a route: a mapping such as `{ name: api, match: { path_prefix: /api }, upstream: app }`".into(),
        "RawMatch" => "a mapping, e.g. `match: { path_prefix: /api, methods: [GET] }`".into(),
        "RawOverride" => "an override: `{ key: <value>, limit: 100 }`".into(),
        _ if path.is_empty() => "a mapping of sections (server, upstreams, limiters, routes, …)".into(),
        _ => format!("a mapping of `{key}` settings, e.g. `{key}: {{ … }}`"),
    }
}

/// serde's description of what was written, in YAML terms.
fn found_in_yaml(found: &str) -> String {
    let quoted = |s: &str| s.trim_matches('`').to_string();
    if let Some(s) = found.strip_prefix("string ") {
        return format!("the text {s}");
    }
    for prefix in ["integer ", "floating point "] {
        if let Some(n) = found.strip_prefix(prefix) {
            // `integer `N` as u128`: a number beyond any integer a key takes.
            return match n.split_once(" as ") {
                Some((n, _)) => format!("the number {}, which is too large", quoted(n)),
                None => format!("the number {}", quoted(n)),
            };
        }
    }
    if let Some(b) = found.strip_prefix("boolean ") {
        return format!("`{}`", quoted(b));
    }
    match found {
        "unit value" => "nothing".into(),
        "map" => "a mapping".into(),
        "sequence" => "a list".into(),
        other => other.into(),
    }
}

/// A limiter or an upstream written as a plain value is almost always a
/// setting dedented out of its entry (`limit: 5` one level too far left).
fn indent_hint(expected: &str, key: &str, found: &str) -> String {
    let what = match expected {
        "struct RawLimiter" => "limiter",
        "struct RawUpstream" => "upstream",
        _ => return String::new(),
    };
    if found == "nothing" {
        format!(" (is `{key}`'s content indented under it?)")
    } else if found.starts_with("a ") {
        String::new()
    } else {
        format!(
            " (`{key}` is read as the name of a {what} here; if it is a setting, indent it under its {what})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_path(p: &str) -> bool {
        !p.contains(' ')
    }

    #[test]
    fn no_message_names_a_rust_type() {
        for serde in [
            "limiters.a.limit: invalid type: string \"100/min\", expected u64",
            "limiters.limit: invalid type: integer `5`, expected struct RawLimiter",
            "limiters.a.key: data did not match any variant of untagged enum OneOrMany",
            "limiters.a.limit: invalid value: integer `100000000000000000000` as u128, expected u64",
            "routes[0].limiters: invalid type: string \"per_ip\", expected a sequence",
            "server.workers: data did not match any variant of untagged enum RawWorkers",
            "invalid type: sequence, expected struct RawConfig",
        ] {
            let (p, _) = problem(serde, any_path);
            let text = p.to_string();
            for rust in ["u64", "u128", "struct", "Raw", "enum", "variant", "OneOrMany"] {
                assert!(!text.contains(rust), "{serde}\n  → {text}");
            }
        }
    }

    #[test]
    fn a_path_with_a_colon_in_a_key_is_split_where_the_document_has_that_path() {
        let (p, _) = problem(
            "limiters.a: b.limit: invalid type: map, expected u64",
            |p| p == "limiters.a: b.limit",
        );
        assert_eq!(p.path, "limiters.a: b.limit");
        assert_eq!(
            p.message,
            "expected a whole number, e.g. `limit: 100`, found a mapping"
        );
    }
}
