//! The CGI response header block php-fpm writes first on STDOUT: `Status:`, `Location`, the rest as HTTP headers.

use http::header::{HeaderName, HeaderValue, LOCATION};
use http::{HeaderMap, StatusCode};

use super::FastCgiError;

/// The status and headers of a CGI response.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub headers: HeaderMap,
}

/// Where the header block ends: (end of its last line, start of the body).
/// CGI allows bare `\n` line ends; PHP writes `\r\n`.
pub fn head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + p;
        // An empty line: "\n\n" or "\n\r\n" (and the block may start with one).
        if nl == 0 || buf[nl - 1] == b'\n' {
            return Some((nl, nl + 1));
        }
        if nl >= 1 && buf[nl - 1] == b'\r' && (nl == 1 || buf[nl - 2] == b'\n') {
            return Some((nl - 1, nl + 1));
        }
        i = nl + 1;
    }
    None
}

/// Parses the header lines. `Status:` sets the status (200 without it, 302
/// when only `Location` is given, as CGI and nginx do); every other line is
/// a response header, repeated ones (`Set-Cookie`) kept apart.
pub fn parse_head(block: &[u8]) -> Result<Head, FastCgiError> {
    let mut status = None;
    let mut headers = HeaderMap::new();
    for line in block.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(FastCgiError::BadHead("a header line without a colon"));
        };
        let name = &line[..colon];
        let value = trim(&line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"status") {
            let code = value.get(..3).unwrap_or(value);
            status = Some(
                StatusCode::from_bytes(code)
                    .map_err(|_| FastCgiError::BadHead("a Status line without a valid code"))?,
            );
            continue;
        }
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            return Err(FastCgiError::BadHead("an invalid header name or value"));
        };
        headers.append(name, value);
    }
    let status = match status {
        Some(s) => s,
        None if headers.contains_key(LOCATION) => StatusCode::FOUND,
        None => StatusCode::OK,
    };
    Ok(Head { status, headers })
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_ends_at_the_first_empty_line_with_either_line_ending() {
        assert_eq!(head_end(b"A: 1\r\nB: 2\r\n\r\nbody"), Some((12, 14)));
        assert_eq!(head_end(b"A: 1\n\nbody"), Some((5, 6)));
        assert_eq!(head_end(b"\r\nbody"), Some((0, 2)));
        assert_eq!(head_end(b"A: 1\r\nB: 2\r\n"), None);
    }

    #[test]
    fn status_sets_the_code_and_set_cookie_lines_stay_apart() {
        let h = parse_head(b"Status: 404 Not Found\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Type: text/html").unwrap();
        assert_eq!(h.status, StatusCode::NOT_FOUND);
        let cookies: Vec<_> = h.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(!h.headers.contains_key("status"));
    }

    #[test]
    fn a_location_without_a_status_is_a_302_and_none_is_a_200() {
        let h = parse_head(b"Location: /login").unwrap();
        assert_eq!(h.status, StatusCode::FOUND);
        assert_eq!(h.headers[LOCATION], "/login");
        assert_eq!(parse_head(b"X-A: 1").unwrap().status, StatusCode::OK);
        let h = parse_head(b"Status: 301\r\nLocation: https://example/").unwrap();
        assert_eq!(h.status, StatusCode::MOVED_PERMANENTLY);
    }

    #[test]
    fn a_garbled_block_is_an_error_not_a_guess() {
        assert!(parse_head(b"no colon here").is_err());
        assert!(parse_head(b"Status: abc").is_err());
        assert!(parse_head(b"Bad Name: x").is_err());
    }
}
