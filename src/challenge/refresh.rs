//! The no-JavaScript tier (`challenge.mode: metarefresh`): a page whose `<meta http-equiv="refresh">` leads to a signed, short-lived, client-bound URL that sets the pass cookie.
//!
//! It proves two things about a client and nothing more: that it follows
//! an HTML refresh to a URL it could not have made up, and that it keeps
//! the cookie the answer sets (the answer sends it back to where it was
//! going, and only a client that sends the cookie again gets there). The
//! URL's token is a challenge of difficulty 0 under the same keys and the
//! same binding as a proof-of-work challenge (site, address block, expiry,
//! here [`REFRESH_TTL`]); the pass it earns is of difficulty 0, so it opens
//! `metarefresh` routes and no proof-of-work route. Passes earned here
//! count against the same allowance of new passes per address block.

use std::net::IpAddr;
use std::time::Duration;

use http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use ring::rand::SecureRandom;

use super::{
    bound, hex, inc, safe_return, site, token, ChallengeGate, Solution, Solved, TokenFault, NANOS,
};
use crate::limiter::Nanos;

/// The tollgate-owned path the refresh leads to (never forwarded).
pub const REFRESH_PATH: &str = "/.well-known/tollgate/refresh";
/// How long the refresh URL holds: a browser follows it at once; a URL
/// copied into a script's queue goes stale.
pub const REFRESH_TTL: Duration = Duration::from_secs(60);

/// What is percent-encoded in the URL's query values: all but `-._~` and
/// letters and digits, so the URL needs no HTML escaping beyond `&`.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl ChallengeGate {
    /// The refresh URL for a browser at `ip` on `host` going to `back`
    /// (a local path, `/` when it is not safe to follow).
    pub fn refresh_url(&self, host: &str, ip: IpAddr, back: &str, now: Nanos) -> String {
        let mut random = [0u8; 16];
        // As in `issue`: a zero random makes two tokens alike, never one forgeable.
        let _ = self.rng.fill(&mut random);
        inc(&self.metrics.issued);
        let key = self.signing_key();
        let text = token::write_challenge(
            key,
            &token::Challenge {
                key_id: &key.id,
                expires: now / NANOS + REFRESH_TTL.as_secs(),
                bits: 0,
                random: &hex(&random),
                site: &site(host),
                prefix: &self.prefix(ip),
            },
        );
        let c = utf8_percent_encode(&text, QUERY_VALUE);
        let r = utf8_percent_encode(safe_return(back), QUERY_VALUE);
        format!("{REFRESH_PATH}?c={c}&r={r}")
    }

    /// The refresh URL's query checked: one MAC, then the binding; a
    /// token of any other difficulty is not one this tier wrote.
    pub fn follow_refresh(
        &self,
        query: &str,
        host: &str,
        ip: IpAddr,
        now: Nanos,
    ) -> Result<Solved, TokenFault> {
        let s = Solution::from_form(query.as_bytes());
        let checked = token::read_challenge(&s.challenge, &self.keys).and_then(|c| {
            bound(c.expires, c.site, c.prefix, self, host, ip, now)?;
            if c.bits != 0 {
                return Err(TokenFault::Malformed);
            }
            Ok(c)
        });
        match checked {
            Ok(c) => {
                inc(&self.metrics.solved_refresh);
                Ok(Solved {
                    random: c.random.to_string(),
                    site: c.site.to_string(),
                    prefix: c.prefix.to_string(),
                    bits: 0,
                    back: safe_return(&s.back).to_string(),
                })
            }
            Err(r) => {
                inc(&self.metrics.failed[r as usize]);
                Err(r)
            }
        }
    }
}

/// The page: a refresh to `url` at once, and a link to it for a browser
/// whose user turned refreshes off.
pub fn render(url: &str) -> String {
    let url = url.replace('&', "&amp;");
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"refresh\" content=\"0; url={url}\">\n\
         <meta name=\"robots\" content=\"noindex, nofollow\">\n<title>One moment…</title>\n\
         </head>\n<body>\n<p>Checking that your browser keeps cookies… \
         <a href=\"{url}\">Continue</a></p>\n</body>\n</html>\n"
    )
}

/// The headers the page goes out with: nothing may load, never cached, never indexed.
pub fn headers(headers: &mut HeaderMap) {
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    headers.remove(http::header::CONTENT_LENGTH);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_escapes_its_url_and_refreshes_at_once() {
        let page = render("/.well-known/tollgate/refresh?c=a~b&r=%2F\"x");
        assert!(page.contains("content=\"0; url=/.well-known/tollgate/refresh?c=a~b&amp;r="));
        assert_eq!(page.matches("&amp;r=").count(), 2);
    }
}
