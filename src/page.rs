//! tollgate's own HTML pages: whether a client would rather read one than JSON (`Accept`), the built-in pages, and operators' templates.
//!
//! Every page is one self-contained document: the style is inline and
//! nothing in it makes a browser fetch anything (no script, image, font or
//! stylesheet), so a page shown for a 429 or a 502 cannot itself be refused
//! or fail. [`document`] is the shell; the error pages fill it, and so can
//! any other page tollgate serves itself.

use std::fmt::Write as _;

use http::{HeaderValue, StatusCode};

use crate::config::{ErrorAnswers, ErrorFormat, ErrorPage};

/// How an error is written for this client.
#[derive(Debug, Clone, Copy, Default)]
pub enum Negotiation<'a> {
    /// problem+json, whatever the client accepts: the admin API, an
    /// `error_format: json` route, an answer written without its request.
    #[default]
    Fixed,
    /// The client's `Accept` chose problem+json (the answer varies with it).
    Problem,
    /// The client's `Accept` chose a page: the operator's for the status,
    /// else the built-in one (the answer varies with it).
    Page(Pages<'a>),
}

impl Negotiation<'_> {
    /// Whether the answer depends on `Accept`, so caches must key on it (`Vary: Accept`).
    pub fn varies(&self) -> bool {
        !matches!(self, Negotiation::Fixed)
    }
}

/// The operator's error pages in force for one request: the route's, then the server's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pages<'a> {
    pub route: &'a [ErrorPage],
    pub server: &'a [ErrorPage],
}

impl<'a> Pages<'a> {
    /// The operator's page for `status`, if any (the route's wins).
    pub fn get(&self, status: StatusCode) -> Option<&'a str> {
        let find = |pages: &'a [ErrorPage]| pages.iter().find(|p| p.status == status);
        find(self.route)
            .or_else(|| find(self.server))
            .map(|p| &*p.text)
    }
}

/// How a request's errors are written: `route` (once routed) may force
/// JSON or inherit the server's `error_format`; a page is written only when
/// the client's `accept` prefers HTML.
pub fn negotiate<'a>(
    accept: Option<&HeaderValue>,
    server: &'a ErrorAnswers,
    route: Option<&'a ErrorAnswers>,
) -> Negotiation<'a> {
    let format = route
        .and_then(|r| r.format)
        .or(server.format)
        .unwrap_or_default();
    match format {
        ErrorFormat::Json => Negotiation::Fixed,
        ErrorFormat::Negotiate if accept.is_some_and(prefers_html) => Negotiation::Page(Pages {
            route: route.map_or(&[], |r| &r.pages),
            server: &server.pages,
        }),
        ErrorFormat::Negotiate => Negotiation::Problem,
    }
}

/// The most elements of one `Accept` value that are read; the rest are
/// ignored, so a client cannot make an error answer cost more than this.
const MAX_ACCEPT_ELEMENTS: usize = 32;

/// Whether `accept` gives `text/html` a higher quality than the best of
/// `application/json` and `application/problem+json`, each taken from the
/// most specific range that matches it (`text/html`, then `text/*`, then
/// `*/*`; RFC 9110 §12.5.1). A tie is JSON: `*/*` alone (curl, `fetch`)
/// reads problem+json, a browser's navigation (`text/html,…,*/*;q=0.8`) a page.
pub fn prefers_html(accept: &HeaderValue) -> bool {
    let Ok(text) = accept.to_str() else {
        return false;
    };
    let mut html = Quality::default();
    let mut json = Quality::default();
    let mut problem = Quality::default();
    for element in text.split(',').take(MAX_ACCEPT_ELEMENTS) {
        let mut parts = element.split(';');
        let range = parts.next().unwrap_or("").trim();
        let Some((kind, sub)) = range.split_once('/') else {
            continue;
        };
        let Some(q) = quality(parts) else {
            continue;
        };
        html.offer(kind, sub, "text", "html", q);
        json.offer(kind, sub, "application", "json", q);
        problem.offer(kind, sub, "application", "problem+json", q);
    }
    html.q > json.q.max(problem.q)
}

/// The quality a media type gets from the most specific range seen so far.
#[derive(Default)]
struct Quality {
    /// 0: no range matched; 1 `*/*`; 2 `type/*`; 3 the type itself.
    specificity: u8,
    /// Thousandths (q=0.8 is 800).
    q: u16,
}

impl Quality {
    fn offer(&mut self, kind: &str, sub: &str, want: &str, want_sub: &str, q: u16) {
        let specificity = match (kind.trim(), sub.trim()) {
            ("*", "*") => 1,
            (k, "*") if k.eq_ignore_ascii_case(want) => 2,
            (k, s) if k.eq_ignore_ascii_case(want) && s.eq_ignore_ascii_case(want_sub) => 3,
            _ => return,
        };
        if specificity > self.specificity {
            *self = Quality { specificity, q };
        } else if specificity == self.specificity {
            self.q = self.q.max(q);
        }
    }
}

/// Whether `Accept` names one of `types` (without case) with a non-zero
/// weight; a malformed weight is no weight.
pub fn accepts(headers: &http::HeaderMap, types: &[&str]) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            types.iter().any(|t| media.eq_ignore_ascii_case(t))
                && quality(parts).is_some_and(|q| q > 0)
        })
}

/// The `q` parameter in thousandths (1000 without one); `None` when it is
/// not a valid qvalue (`0`, `1`, `0.x` up to three decimals, `1.0`…).
/// Parameter names are case-insensitive (RFC 9110 §5.6.6): `Q=0` is `q=0`.
pub fn quality<'a>(params: impl Iterator<Item = &'a str>) -> Option<u16> {
    for param in params {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        if !name.trim().eq_ignore_ascii_case("q") {
            continue;
        }
        let value = value.trim();
        let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
        if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut thousandths: u16 = match whole {
            "0" => 0,
            "1" => 1000,
            _ => return None,
        };
        for (i, digit) in fraction.bytes().enumerate() {
            thousandths += u16::from(digit - b'0') * [100, 10, 1][i];
        }
        return (thousandths <= 1000).then_some(thousandths);
    }
    Some(1000)
}

/// What a page's placeholders are filled with.
#[derive(Debug, Clone, Copy)]
pub struct Fill<'a> {
    pub status: StatusCode,
    /// Seconds; `None` when the answer has no `Retry-After` (the placeholder is then empty).
    pub retry_after: Option<u64>,
    /// The refusing limiter (empty for anything else).
    pub limiter: &'a str,
    pub request_id: Option<&'a str>,
}

/// Replaces `{{status}}`, `{{retry_after}}`, `{{limiter}}` and
/// `{{request_id}}` in an operator's template, HTML-escaped; any other
/// `{{…}}` stays as written.
pub fn fill(text: &str, with: &Fill<'_>) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        match after[..end].trim() {
            "status" => {
                let _ = write!(out, "{}", with.status.as_u16());
            }
            "retry_after" => {
                if let Some(secs) = with.retry_after {
                    let _ = write!(out, "{secs}");
                }
            }
            "limiter" => escape(&mut out, with.limiter),
            "request_id" => escape(&mut out, with.request_id.unwrap_or("")),
            _ => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `s` with `<`, `>`, `&`, `"` and `'` escaped, for text and attribute values.
pub fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// The media type of every page.
pub const CONTENT_TYPE: HeaderValue = HeaderValue::from_static("text/html; charset=utf-8");

/// The style every page shares: readable on a phone, light or dark as the
/// reader's system is, and inline (nothing to fetch).
const STYLE: &str = "body{font-family:system-ui,sans-serif;line-height:1.5;max-width:36em;margin:4em auto;padding:0 1em;color:#222;background:#fff}h1{font-size:1.6em;margin-bottom:.4em}.detail{color:#555}.meta{color:#777;font-size:.85em;margin-top:2em}@media(prefers-color-scheme:dark){body{color:#ddd;background:#181818}.detail{color:#aaa}.meta{color:#888}}";

/// A whole page: `title` (escaped here) and `body`, which is HTML already.
pub fn document(title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + STYLE.len() + 256);
    out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><meta name=\"robots\" content=\"noindex\"><title>");
    escape(&mut out, title);
    out.push_str("</title><style>");
    out.push_str(STYLE);
    out.push_str("</style></head>\n<body>");
    out.push_str(body);
    out.push_str("</body></html>\n");
    out
}

/// The built-in page of an error: what happened in a sentence a visitor
/// understands, the technical `detail` below it, when to retry (a 429's
/// and a 503's `Retry-After`), and the status and request id to quote.
pub fn error(detail: &str, with: &Fill<'_>) -> String {
    let title = with.status.canonical_reason().unwrap_or("Error");
    let mut body = String::with_capacity(512 + detail.len());
    body.push_str("<h1>");
    escape(&mut body, title);
    body.push_str("</h1>\n<p>");
    body.push_str(sentence(with.status));
    if let Some(secs) = with.retry_after {
        let unit = if secs == 1 { "second" } else { "seconds" };
        let _ = write!(body, " Please wait {secs} {unit}, then try again.");
    }
    body.push_str("</p>\n<p class=\"detail\">");
    escape(&mut body, detail);
    let _ = write!(
        body,
        "</p>\n<p class=\"meta\">Status {}",
        with.status.as_u16()
    );
    if let Some(id) = with.request_id {
        body.push_str(" · request ");
        escape(&mut body, id);
    }
    body.push_str("</p>");
    document(title, &body)
}

/// The page of `reject: { body: html }`, for a login form's limiter: the
/// same for every client, so it reads as a person's wait, not an error.
pub fn attempts(with: &Fill<'_>) -> String {
    let mut body = String::with_capacity(256);
    body.push_str("<h1>Too many attempts</h1>\n<p>");
    let _ = write!(
        body,
        "Please wait {} seconds, then try again.",
        with.retry_after.unwrap_or(1)
    );
    let _ = write!(
        body,
        "</p>\n<p class=\"meta\">Status {} · request ",
        with.status.as_u16()
    );
    escape(&mut body, with.request_id.unwrap_or(""));
    body.push_str("</p>");
    document("Too many attempts", &body)
}

/// What a status means to someone reading a web page.
fn sentence(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "The request could not be understood.",
        401 => "This request needs a valid key.",
        403 => "Access is refused.",
        404 => "There is nothing at this address.",
        405 => "This address does not answer that kind of request.",
        408 => "The request took too long to arrive.",
        411 => "The request did not say how long its body is.",
        413 => "The request is too large.",
        429 => "Too many requests have come from you.",
        500 => "Something went wrong on our side.",
        501 => "This kind of request is not supported.",
        502 => "The site behind this address could not be reached. Please try again in a moment.",
        503 => "The service is busy or unavailable right now.",
        504 => {
            "The site behind this address took too long to answer. Please try again in a moment."
        }
        _ => "The request could not be answered.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn html(accept: &'static str) -> bool {
        prefers_html(&HeaderValue::from_static(accept))
    }

    #[test]
    fn a_browser_navigation_prefers_html_and_api_clients_do_not() {
        // Chromium's and Firefox's navigations.
        assert!(html("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"));
        assert!(html(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(html("text/*"));
        // curl, fetch(), API clients.
        assert!(!html("*/*"));
        assert!(!html("application/json"));
        assert!(!html("application/problem+json, text/html;q=0.5"));
        assert!(!html("text/html;q=0.5, */*"));
        // A tie is JSON.
        assert!(!html("text/html, application/json"));
        assert!(!html(""));
    }

    #[test]
    fn q_values_are_read_with_the_most_specific_range_winning() {
        assert!(html("application/json;q=0.2, text/html;q=0.3"));
        assert!(!html("application/json;q=0.3, text/html;q=0.3"));
        // `text/html;q=0` refuses HTML even though `*/*` would allow it.
        assert!(!html("text/html;q=0, */*;q=0.1"));
        // JSON refused outright, HTML allowed by `*/*`.
        assert!(html(
            "application/json;q=0, application/problem+json;q=0, */*"
        ));
        // Case, spaces and other parameters do not matter.
        assert!(html(
            "TEXT/HTML ; level=1 ; Q=1.000 , Application/JSON;q=0.999"
        ));
        // Invalid qualities drop their element.
        assert!(!html("text/html;q=2, application/json;q=0.1"));
        assert!(!html("text/html;q=0.1234, application/json;q=0.1"));
        assert!(!html("text/html;q=-1, application/json;q=0.1"));
    }

    #[test]
    fn only_the_first_elements_of_a_long_accept_are_read() {
        let mut long = "x/y,".repeat(MAX_ACCEPT_ELEMENTS);
        long.push_str("text/html");
        assert!(!prefers_html(&HeaderValue::from_str(&long).unwrap()));
    }

    #[test]
    fn a_template_is_filled_and_escaped_and_unknown_names_stay() {
        let with = Fill {
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Some(5),
            limiter: "a<b",
            request_id: Some("x-1"),
        };
        assert_eq!(
            fill(
                "<p>{{limiter}} {{ retry_after }} {{status}} {{request_id}} {{other}} {{open",
                &with
            ),
            "<p>a&lt;b 5 503 x-1 {{other}} {{open"
        );
        let none = Fill {
            retry_after: None,
            request_id: None,
            ..with
        };
        assert_eq!(fill("[{{retry_after}}][{{request_id}}]", &none), "[][]");
    }

    #[test]
    fn the_built_in_page_says_what_happened_and_fetches_nothing() {
        let page = error(
            "No route <matches>.",
            &Fill {
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after: Some(40),
                limiter: "",
                request_id: Some("r-1"),
            },
        );
        assert!(page.starts_with("<!doctype html>"));
        assert!(page.contains("<title>Too Many Requests</title>"));
        assert!(page.contains("Please wait 40 seconds, then try again."));
        assert!(page.contains("No route &lt;matches&gt;."));
        assert!(page.contains("request r-1"));
        for fetches in [
            "<script", "<link", "<img", "src=", "href=", "url(", "@import",
        ] {
            assert!(!page.contains(fetches), "{fetches} in {page}");
        }
    }
}
