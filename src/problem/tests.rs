//! The answers tollgate writes itself: bodies, headers and negotiation, without sockets.

use super::*;
use crate::config::HeaderSets;
use crate::limiter::Quota;
use http::HeaderMap;
use http_body_util::BodyExt;

const S: Nanos = NANOS_PER_SEC;

fn quota(limit: u64, remaining: u64, reset: u64) -> Quota {
    Quota {
        limit,
        window: Some(60 * S),
        remaining,
        reset_after: reset * S,
    }
}

#[test]
fn headers_follow_the_limiter_with_the_fewest_remaining() {
    let mut h = HeaderMap::new();
    let now = 1_767_225_620 * S;
    set_rate_limit_headers(
        &mut h,
        &[
            LimitView {
                name: "strict",
                quota: quota(5, 2, 40),
            },
            LimitView {
                name: "global",
                quota: quota(100, 97, 40),
            },
        ],
        now,
        HeaderSets::Both,
        &crate::reject::PolicyCache::default(),
    );
    assert_eq!(h["x-ratelimit-limit"], "5");
    assert_eq!(h["x-ratelimit-remaining"], "2");
    assert_eq!(h["x-ratelimit-reset"], "1767225660");
    assert_eq!(
        h["ratelimit-policy"],
        "\"strict\";q=5;w=60, \"global\";q=100;w=60"
    );
    assert_eq!(h["ratelimit"], "\"strict\";r=2;t=40");
}

#[tokio::test]
async fn a_rate_limited_answer_is_problem_json_with_retry_after() {
    let resp = Problem::RateLimited(Box::new(Denial {
        index: 0,
        limiter: "strict".into(),
        quota: quota(5, 0, 40),
        policy: "5 requests per 60s".into(),
        retry_after: 39 * S + 1,
        violated: vec!["strict".into()],
        key: "ip:203.0.113.9".into(),
    }))
    .into_response();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()[RETRY_AFTER], "40");
    assert_eq!(resp.headers()[CONTENT_TYPE], "application/problem+json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "rate-limit-exceeded");
    assert_eq!(
        v["detail"],
        "Rate limit of 5 requests per 60s exceeded for key 'ip:203.0.113.9'."
    );
    assert_eq!(v["window_seconds"], 60);
    assert_eq!(v["retry_after"], 40);
    assert_eq!(v["violated-policies"], json!(["strict"]));
}

#[tokio::test]
async fn every_problem_body_names_the_request_and_a_template_is_escaped() {
    let resp = Problem::NoRoute.respond(&Answering {
        request_id: Some("abc-1"),
        ..Answering::default()
    });
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["request_id"], "abc-1");

    let shape = RejectShape {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: RejectBody::Template {
            text: "<p>{{limiter}} {{retry_after}} {{status}} {{request_id}} {{other}}</p>".into(),
            content_type: "text/html".into(),
        },
    };
    let denial = Denial {
        index: 0,
        limiter: "a<b".into(),
        quota: quota(1, 0, 5),
        policy: "".into(),
        retry_after: 5 * S,
        violated: vec![],
        key: String::new(),
    };
    let resp = Problem::RateLimited(Box::new(denial)).respond(&Answering {
        request_id: Some("x-1"),
        shape: Some(&shape),
        ..Answering::default()
    });
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()[RETRY_AFTER], "5");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"<p>a&lt;b 5 503 x-1 {{other}}</p>");
}

#[tokio::test]
async fn a_banned_answer_names_the_ban_and_its_end_with_the_chosen_status() {
    let resp = Problem::Banned(Box::new(BanDenial {
        index: 0,
        limiter: "failed_logins".into(),
        key: "ip:203.0.113.9".into(),
        until: 1_767_229_200 * S,
        retry_after: 3599 * S + 1,
        status: StatusCode::FORBIDDEN,
        source: crate::problem::BanSource::Limiter,
    }))
    .into_response();
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()[RETRY_AFTER], "3600");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "client-banned");
    assert_eq!(v["banned_until"], 1_767_229_200u64);
    assert_eq!(
        v["detail"],
        "Key 'ip:203.0.113.9' is banned until 2026-01-01T01:00:00Z after repeated rejections by 'failed_logins'."
    );
}

#[tokio::test]
async fn an_admin_error_is_problem_json_of_its_own_type() {
    let resp = admin_error(StatusCode::NOT_FOUND, "Admin paths: /status.");
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.headers()[CONTENT_TYPE], "application/problem+json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v,
        json!({"type": "admin-error", "title": "Not Found", "status": 404, "detail": "Admin paths: /status."})
    );
}

#[test]
fn retry_after_is_never_zero() {
    let resp = Problem::RateLimited(Box::new(Denial {
        index: 0,
        limiter: "l".into(),
        quota: quota(1, 0, 0),
        policy: "".into(),
        retry_after: 1,
        violated: vec![],
        key: String::new(),
    }))
    .into_response();
    assert_eq!(resp.headers()[RETRY_AFTER], "1");
}

#[tokio::test]
async fn a_page_replaces_the_json_body_and_keeps_every_header() {
    let pages = crate::page::Pages::default();
    let busy = || Problem::UpstreamBusy {
        upstream: "app".into(),
        retry_after: 7,
    };
    let json = busy().respond(&Answering {
        request_id: Some("r-9"),
        negotiation: Negotiation::Problem,
        ..Answering::default()
    });
    let page = busy().respond(&Answering {
        request_id: Some("r-9"),
        negotiation: Negotiation::Page(pages),
        ..Answering::default()
    });
    assert_eq!(page.status(), 503);
    assert_eq!(page.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
    assert_eq!(json.headers()[CONTENT_TYPE], "application/problem+json");
    for resp in [&json, &page] {
        assert_eq!(resp.headers()[RETRY_AFTER], "7");
        assert_eq!(resp.headers()[VARY], "accept");
    }
    let body = page.into_body().collect().await.unwrap().to_bytes();
    let body = std::str::from_utf8(&body).unwrap();
    assert!(body.contains("<h1>Service Unavailable</h1>"), "{body}");
    assert!(body.contains("Please wait 7 seconds"), "{body}");
    assert!(body.contains("request r-9"), "{body}");
    assert!(
        body.contains("Every server of the upstream &#39;app&#39; is busy"),
        "{body}"
    );
}

#[test]
fn an_answer_written_without_its_request_carries_its_problem_and_no_vary() {
    let resp = Problem::FileNotFound.into_response();
    assert!(!resp.headers().contains_key(VARY));
    assert!(matches!(
        resp.extensions().get::<Unanswered>(),
        Some(Unanswered(Problem::FileNotFound))
    ));
}
