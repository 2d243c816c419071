//! The CrowdSec Local API as tollgate speaks it: the decision stream (a bouncer's key), machine login and alerts (a watcher's password), each call under a timeout and a bound on what is read.

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Deserialize;

/// The header a bouncer's key goes in.
const API_KEY: &str = "x-api-key";

/// One decision as the stream lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct LapiDecision {
    #[serde(default)]
    pub id: i64,
    #[serde(default)]
    pub scope: String,
    #[serde(default)]
    pub value: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Time left, in Go's duration form (`59m58.47s`; negative once deleted).
    #[serde(default)]
    pub duration: String,
}

/// One answer of `GET /v1/decisions/stream`.
#[derive(Debug, Default, Deserialize)]
pub struct Delta {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub new: Vec<LapiDecision>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub deleted: Vec<LapiDecision>,
}

/// The stream writes `null` for an empty list.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<LapiDecision>, D::Error> {
    Ok(Option::<Vec<LapiDecision>>::deserialize(d)?.unwrap_or_default())
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum LapiError {
    #[error("the Local API did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the Local API: {0}")]
    Unreachable(String),
    #[error("the Local API refused the credentials ({0})")]
    Unauthorized(StatusCode),
    #[error("the Local API answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("the Local API's answer is not what was expected: {0}")]
    Answer(String),
}

/// A client of one Local API.
pub struct Lapi {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: String,
    api_key: HeaderValue,
    timeout: Duration,
    /// The most of one answer that is read.
    limit: usize,
}

impl Lapi {
    /// `limit`: the most of one answer read (a startup stream holds every decision).
    pub fn new(url: &Uri, api_key: &str, timeout: Duration, limit: usize) -> Lapi {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.enforce_http(false);
        let tls = crate::tls::upstream_client_config(&crate::config::UpstreamTls::SystemRoots);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Lapi {
            client,
            base: url.to_string().trim_end_matches('/').to_string(),
            // A key with bytes a header cannot carry is sent empty: the API refuses it, and says so.
            api_key: HeaderValue::from_str(api_key).unwrap_or(HeaderValue::from_static("")),
            timeout,
            limit,
        }
    }

    /// `GET /v1/decisions/stream`: everything in force (`startup`), or what changed since the last call.
    pub async fn stream(&self, startup: bool) -> Result<Delta, LapiError> {
        let path = if startup {
            "/v1/decisions/stream?startup=true"
        } else {
            "/v1/decisions/stream"
        };
        let body = self
            .call(Method::GET, path, (API_KEY, self.api_key.clone()), None)
            .await?;
        serde_json::from_slice(&body).map_err(|e| LapiError::Answer(e.to_string()))
    }

    /// `POST /v1/watchers/login`: a machine's token.
    pub async fn login(&self, machine_id: &str, password: &str) -> Result<String, LapiError> {
        #[derive(Deserialize)]
        struct Token {
            token: String,
        }
        let body =
            serde_json::json!({"machine_id": machine_id, "password": password, "scenarios": []});
        let answer = self
            .call(
                Method::POST,
                "/v1/watchers/login",
                (
                    CONTENT_TYPE.as_str(),
                    HeaderValue::from_static("application/json"),
                ),
                Some(body.to_string().into()),
            )
            .await?;
        let token: Token =
            serde_json::from_slice(&answer).map_err(|e| LapiError::Answer(e.to_string()))?;
        Ok(token.token)
    }

    /// `POST /v1/alerts` with a machine's token.
    pub async fn alerts(&self, token: &str, alerts: Bytes) -> Result<(), LapiError> {
        let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|e| LapiError::Answer(e.to_string()))?;
        self.call(
            Method::POST,
            "/v1/alerts",
            (AUTHORIZATION.as_str(), bearer),
            Some(alerts),
        )
        .await
        .map(drop)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        (name, value): (&str, HeaderValue),
        body: Option<Bytes>,
    ) -> Result<Bytes, LapiError> {
        let uri = format!("{}{path}", self.base);
        let mut req = Request::builder()
            .method(method)
            .uri(&uri)
            .header(USER_AGENT, concat!("tollgate/", env!("CARGO_PKG_VERSION")))
            .header(name, value);
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| LapiError::Unreachable(e.to_string()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| LapiError::Unreachable(crate::proxy::connect_reason(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), self.limit)
                .collect()
                .await
                .map_err(|e| LapiError::Answer(e.to_string()))?
                .to_bytes();
            match status {
                s if s.is_success() => Ok(body),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    Err(LapiError::Unauthorized(status))
                }
                status => Err(LapiError::Status {
                    status,
                    body: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                }),
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(LapiError::Timeout(self.timeout)))
    }
}

/// A Go duration (`1h2m3.5s`, `-37.09ms`, `720h0m0s`) in nanoseconds; `None` when it is not one.
pub fn go_duration(s: &str) -> Option<i128> {
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total: i128 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let per: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let whole: i128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut part = whole.checked_mul(per)?;
        let mut scale = per;
        for digit in fraction.bytes().take(18) {
            scale /= 10;
            part += i128::from(digit - b'0') * scale;
        }
        total = total.checked_add(part)?;
        rest = next;
    }
    Some(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_the_local_api_writes_them() {
        assert_eq!(go_duration("59m58.476023429s"), Some(3_598_476_023_429));
        assert_eq!(go_duration("-37.094337ms"), Some(-37_094_337));
        assert_eq!(go_duration("1h59m58.5s"), Some(7_198_500_000_000));
        assert_eq!(go_duration("720h0m0s"), Some(720 * 3_600_000_000_000));
        assert_eq!(go_duration("1.5µs"), Some(1_500));
        assert_eq!(go_duration("0"), Some(0));
        for bad in ["", "h", "1x", "1", "--1s", "1.2.3s"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_empty_list_written_as_null_is_empty() {
        let d: Delta = serde_json::from_str(r#"{"deleted":null,"new":null}"#).unwrap();
        assert!(d.new.is_empty() && d.deleted.is_empty());
    }
}
