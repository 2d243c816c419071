//! The challenge page: self-contained HTML whose script solves the proof of work in a Web Worker, and the headers that keep it to itself.
//!
//! Nothing is loaded from anywhere: the style and the script are inline and
//! allowed by a per-response CSP nonce, the worker is the page's own text
//! turned into a `blob:` URL, and the only place the page may send anything
//! is its own pass path (`form-action 'self'`).

use http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue};

const TEMPLATE: &str = include_str!("page.html");
const SOLVER: &str = include_str!("solver.js");

/// The page for `challenge` at `bits`, returning to `back` once solved;
/// `nonce` allows its inline script and style and nothing else.
pub fn render(challenge: &str, bits: u8, back: &str, nonce: &str) -> String {
    TEMPLATE
        .replace("{{SOLVER}}", SOLVER)
        .replace("{{NONCE}}", nonce)
        .replace("{{ACTION}}", super::PASS_PATH)
        .replace("{{BITS}}", &bits.to_string())
        .replace("{{CHALLENGE}}", &escape(challenge))
        .replace("{{BACK}}", &escape(back))
}

/// The headers a challenge page goes out with: its CSP, never cached, never indexed.
pub fn headers(headers: &mut HeaderMap, nonce: &str) {
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         worker-src blob:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        headers.insert(CONTENT_SECURITY_POLICY, v);
    }
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    headers.remove(http::header::CONTENT_LENGTH);
}

/// Text for an attribute value in double quotes.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_escapes_what_the_client_chose() {
        let page = render("k~1~16~ab", 16, "/a\"><script>x</script>", "n0nce");
        assert!(!page.contains("<script>x"), "{page}");
        assert!(page.contains("&quot;&gt;&lt;script&gt;"));
        for external in ["src=\"http", "href=\"http", "src=\"//", "@import", "url("] {
            assert!(!page.contains(external), "{external} in the page");
        }
        assert!(page.contains("<noscript>"));
        assert!(page.contains("new Worker("));
        assert_eq!(page.matches("nonce=\"n0nce\"").count(), 2);
    }
}
