//! The one spelling of a request path that routes and redirects compare: unreserved escapes decoded, `.` and `..` resolved, no empty segment or trailing slash.
//!
//! Apart from [`crate::router`] (which re-exports it) so that `config` can
//! compare a redirect's target the way routes will, without importing the
//! router that imports it.

use std::borrow::Cow;

/// Decodes percent-escapes of unreserved characters, collapses repeated
/// slashes, resolves `.` and `..`, and drops a trailing slash.
/// Reserved escapes stay encoded (a request's `%2F` is decided before, by
/// [`crate::router::request_path`]). Most paths are already normal and come back borrowed, without a copy.
pub fn normalize(path: &str) -> Cow<'_, str> {
    if is_normal(path) {
        return path.into();
    }
    let decoded = decode_unreserved(path);
    let segments = segments(&decoded);
    let mut out = String::with_capacity(decoded.len().max(1));
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    out.into()
}

/// The segments of a decoded path with empty and `.` segments dropped and
/// `..` resolved (never above the root): what a file system would walk.
pub fn segments(decoded: &str) -> Vec<&str> {
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    segments
}

/// Starts with `/`, has no escape, no empty, `.` or `..` segment, no trailing `/`.
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    if b == b"/" {
        return true;
    }
    if b.first() != Some(&b'/') || b.last() == Some(&b'/') || b.contains(&b'%') {
        return false;
    }
    path[1..]
        .split('/')
        .all(|seg| !matches!(seg, "" | "." | ".."))
}

fn decode_unreserved(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return path.into();
    }
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                } else {
                    // Keep the escape, in one canonical (upper-case) spelling.
                    out.push('%');
                    out.push(b[i + 1].to_ascii_uppercase() as char);
                    out.push(b[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // Request paths reaching here are ASCII (hyper rejects others), but be safe.
        let ch = path[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out.into()
}
