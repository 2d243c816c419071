use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};

use super::*;
use crate::config::{PassKey, PassKeys};

const NOW: Nanos = 1_767_225_600 * NANOS;
const OLD: &str = "an old secret that is long enough for the file";
const NEW: &str = "a new secret that is also long enough for the file";

fn gate(secrets: &[&str]) -> (ChallengeGate, Metrics) {
    let metrics = Metrics::default();
    let config = PassConfig {
        secret_file: "/dev/null".into(),
        keys: Arc::new(PassKeys(
            secrets.iter().map(|s| PassKey::new(s.as_bytes())).collect(),
        )),
        ttl: Duration::from_secs(7 * 86_400),
        ipv4_prefix: 24,
        ipv6_prefix: 64,
        issue_limit: 2,
        crawlers: Default::default(),
    };
    (ChallengeGate::new(&config, &metrics).unwrap(), metrics)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Solves `challenge` the way the page does.
fn solve(challenge: &str, bits: u8) -> Solution {
    let nonce = (0u64..)
        .find(|n| {
            let d = Sha256::new()
                .chain_update(challenge.as_bytes())
                .chain_update(n.to_string().as_bytes())
                .finalize();
            token::leading_zero_bits(&d) >= u32::from(bits)
        })
        .unwrap();
    Solution {
        challenge: challenge.into(),
        nonce: nonce.to_string(),
        back: "/wiki/Main_Page?x=1".into(),
        solve_ms: Some(120),
        via: "js".into(),
    }
}

fn cookie_header(granted: &Granted) -> HeaderMap {
    let value = granted.cookie.split(';').next().unwrap();
    let mut h = HeaderMap::new();
    h.insert(
        COOKIE,
        HeaderValue::from_str(&format!("a=b; {value}")).unwrap(),
    );
    h
}

fn counter(m: &Metrics, name: &'static str, labels: &[(&str, &str)]) -> u64 {
    m.counter(name, labels)
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn a_solved_challenge_earns_a_pass_for_the_same_site_and_address_block() {
    let (g, m) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 8, NOW);
    let granted = g
        .redeem(
            &solve(&c, 8),
            "wiki.example",
            ip("203.0.113.77"),
            NOW,
            false,
        )
        .unwrap();
    assert_eq!(granted.back, "/wiki/Main_Page?x=1");
    assert!(granted.cookie.contains("HttpOnly; SameSite=Lax"));
    assert!(!granted.cookie.contains("Secure"));
    let h = cookie_header(&granted);
    let pass = g.pass_of(&h, "wiki.example", ip("203.0.113.200"), NOW + NANOS);
    let pass = pass.unwrap();
    assert!(pass.key.unwrap().starts_with("pass:"));
    assert_eq!(pass.bits, 8, "the difficulty it was solved at");
    assert_eq!(counter(&m, SOLVED, &[("via", "js")]), 1);
    assert_eq!(counter(&m, VERIFIED, &[]), 1);
}

#[test]
fn a_pass_is_no_pass_on_another_site_block_or_after_it_expires() {
    let (g, m) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    let granted = g
        .redeem(&solve(&c, 4), "wiki.example", ip("203.0.113.9"), NOW, true)
        .unwrap();
    assert!(granted.cookie.ends_with("; Secure"));
    let h = cookie_header(&granted);
    assert_eq!(g.pass_of(&h, "shop.example", ip("203.0.113.9"), NOW), None);
    assert_eq!(g.pass_of(&h, "wiki.example", ip("198.51.100.9"), NOW), None);
    let week = 7 * 86_400 * NANOS;
    assert_eq!(
        g.pass_of(&h, "wiki.example", ip("203.0.113.9"), NOW + week),
        None
    );
    for reason in ["other_site", "other_prefix", "expired"] {
        assert_eq!(counter(&m, REJECTED, &[("reason", reason)]), 1, "{reason}");
    }
}

#[test]
fn a_solution_for_another_block_an_unsolved_or_an_expired_challenge_is_refused() {
    let (g, m) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 8, NOW);
    let s = solve(&c, 8);
    let at = |who: &str, when| g.redeem(&s, "wiki.example", ip(who), when, false);
    assert_eq!(at("198.51.100.1", NOW), Err(TokenFault::OtherPrefix));
    let later = NOW + CHALLENGE_TTL.as_nanos() as u64;
    assert_eq!(at("203.0.113.9", later), Err(TokenFault::Expired));
    let mut wrong = s.clone();
    wrong.nonce = (s.nonce.parse::<u64>().unwrap() + 1).to_string();
    let wrong_result = g.redeem(&wrong, "wiki.example", ip("203.0.113.9"), NOW, false);
    // The next nonce may happen to solve it too (1 in 256): then it is no test.
    if let Err(r) = wrong_result {
        assert_eq!(r, TokenFault::Unsolved);
    }
    let mut easier = s.clone();
    easier.challenge = c.replacen("~8~", "~1~", 1);
    let forged = g.redeem(&easier, "wiki.example", ip("203.0.113.9"), NOW, false);
    assert_eq!(forged, Err(TokenFault::Forged));
    assert_eq!(counter(&m, FAILED, &[("reason", "forged")]), 1);
}

#[test]
fn replaying_a_solution_gives_the_same_pass_id_not_a_fresh_one() {
    let (g, _) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    let s = solve(&c, 4);
    let a = g.redeem(&s, "wiki.example", ip("203.0.113.9"), NOW, false);
    let b = g.redeem(&s, "wiki.example", ip("203.0.113.9"), NOW, false);
    let id = |g2: &Granted| g.pass_of(&cookie_header(g2), "wiki.example", ip("203.0.113.9"), NOW);
    assert_eq!(id(&a.unwrap()), id(&b.unwrap()));
}

#[test]
fn the_newest_key_signs_every_key_verifies_and_a_removed_key_is_refused() {
    let (old_only, _) = gate(&[OLD]);
    let (rotated, _) = gate(&[OLD, NEW]);
    let (new_only, m) = gate(&[NEW]);
    let c = old_only.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    let granted = old_only
        .redeem(&solve(&c, 4), "wiki.example", ip("203.0.113.9"), NOW, false)
        .unwrap();
    let h = cookie_header(&granted);
    let at = |g: &ChallengeGate| g.pass_of(&h, "wiki.example", ip("203.0.113.9"), NOW);
    assert!(
        at(&rotated).is_some(),
        "a fleet sharing the file accepts it"
    );
    assert_eq!(at(&new_only), None);
    assert_eq!(counter(&m, REJECTED, &[("reason", "unknown_key")]), 1);
    let fresh = rotated.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    assert!(fresh.starts_with(&PassKey::new(NEW.as_bytes()).id));
}

#[test]
fn only_a_path_on_this_site_is_followed_after_a_solution() {
    for (back, followed) in [
        ("/wiki/x?y=1", "/wiki/x?y=1"),
        ("//evil.example/x", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
        ("/a b", "/"),
        ("", "/"),
    ] {
        assert_eq!(safe_return(back), followed, "{back:?}");
    }
}

#[test]
fn a_browser_is_a_client_that_asks_for_html() {
    let accept = |v: &'static str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, HeaderValue::from_static(v));
        prefers_html(&h)
    };
    assert!(accept(
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    ));
    assert!(!accept("*/*"));
    assert!(!accept("application/json"));
    assert!(!accept("text/html;q=0, application/json"));
    // Parameter names are case-insensitive; a zero weight in any spelling refuses.
    assert!(!accept("text/html;Q=0"));
    assert!(!accept("text/html ; Q = 0.000, application/json"));
    assert!(accept("text/html;Q=0.5"));
    assert!(!prefers_html(&HeaderMap::new()));
}

#[test]
fn a_form_is_read_with_its_percent_encoding() {
    let s = Solution::from_form(b"c=k%7E1&n=42&r=%2Fwiki%3Fa%3Db+c&ms=812&via=subtle&x=1");
    assert_eq!(s.challenge, "k~1");
    assert_eq!(s.nonce, "42");
    assert_eq!(s.back, "/wiki?a=b c");
    assert_eq!(s.solve_ms, Some(812));
    assert_eq!(s.via, "subtle");
}

#[test]
fn past_the_allowance_a_pass_still_holds_but_counts_as_its_address() {
    let (g, m) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    let solved = g
        .solve(&solve(&c, 4), "wiki.example", ip("203.0.113.9"), NOW)
        .unwrap();
    assert_eq!(solved.prefix, "203.0.113.0/24");
    let shared = g.grant(&solved, false, NOW, false);
    let held = g.pass_of(
        &cookie_header(&shared),
        "wiki.example",
        ip("203.0.113.9"),
        NOW,
    );
    assert_eq!(held, Some(CarriedPass { key: None, bits: 4 }));
    assert_eq!(counter(&m, ISSUE_REFUSED, &[]), 1);
}

#[test]
fn the_first_valid_pass_cookie_wins_whatever_comes_before_it_within_the_bound() {
    let (g, _) = gate(&[NEW]);
    let c = g.issue("wiki.example", ip("203.0.113.9"), 4, NOW);
    let granted = g
        .redeem(&solve(&c, 4), "wiki.example", ip("203.0.113.9"), NOW, false)
        .unwrap();
    let good = granted.cookie.split(';').next().unwrap().to_string();
    let with_bad = |bad: usize| {
        let mut h = HeaderMap::new();
        let planted = vec!["tollgate_pass=planted"; bad].join("; ");
        h.append(COOKIE, HeaderValue::from_str(&planted).unwrap());
        h.append(COOKIE, HeaderValue::from_str(&good).unwrap());
        g.pass_of(&h, "wiki.example", ip("203.0.113.9"), NOW)
    };
    assert!(
        with_bad(1).is_some(),
        "a planted cookie does not hide the pass"
    );
    assert!(with_bad(MAX_PASS_COOKIES - 1).is_some());
    assert!(
        with_bad(MAX_PASS_COOKIES).is_none(),
        "at most {MAX_PASS_COOKIES} are checked"
    );
}

#[test]
fn only_the_pass_cookie_is_taken_out_of_the_cookie_headers() {
    let mut h = HeaderMap::new();
    for v in [
        "a=1; tollgate_pass=x; b=2",
        "tollgate_pass=y",
        "c=3",
        "tollgate_passport=4",
    ] {
        h.append(COOKIE, HeaderValue::from_static(v));
    }
    strip_pass_cookies(&mut h);
    let left: Vec<&str> = h
        .get_all(COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(left, ["a=1; b=2", "c=3", "tollgate_passport=4"]);
}
