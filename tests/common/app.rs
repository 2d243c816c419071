//! The app as a value, without sockets: built from YAML on a memory store, with a clock that tokio's (paused) time drives.
//!
//! A test that runs on `#[tokio::test(start_paused = true)]` and builds its
//! app with [`app`] moves one clock only: tokio's. The limiters read
//! [`TokioClock`], which counts from `T0` as far as tokio's clock has moved,
//! so a leaky-bucket wait, a window's end, a ban's end and an upstream
//! timeout all happen in virtual time, and `tokio::time::advance` (or a
//! sleep, which a paused runtime skips) moves both at once.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tollgate::app::{App, ConnInfo};
use tollgate::body::Body;
use tollgate::clock::{Clock, Nanos};
use tollgate::store::Store;

use super::T0;

/// Unix time that follows tokio's clock: `T0` at creation, plus however
/// far tokio's clock (paused and advanced, or real) has moved since.
///
/// Read outside a runtime (a plain thread) tokio's clock is the real one:
/// the apps built here run everything on their test's runtime.
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> Arc<TokioClock> {
        Arc::new(TokioClock {
            origin: tokio::time::Instant::now(),
        })
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        T0 + self.origin.elapsed().as_nanos() as Nanos
    }
}

/// An app from `yaml` (memory store unless `yaml` names one, no access log
/// unless `yaml` has a `log:` section: its records would go to the test's
/// stdout), on a [`TokioClock`] that starts at `T0`.
pub fn app(yaml: &str) -> App {
    let yaml = if yaml.starts_with("log:") || yaml.contains("\nlog:") {
        yaml.to_string()
    } else {
        format!("log: {{ access: false }}\n{yaml}")
    };
    let yaml = if yaml.contains("store:") {
        yaml
    } else {
        format!("store: {{ backend: memory }}\n{yaml}")
    };
    let config = tollgate::config::parse(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(&config.store, &config.limiters, T0).expect("store opens");
    App::new(config, store, TokioClock::new(), None)
}

/// A connection from `peer` to port 8080, as the server would describe it.
pub fn from(peer: &str) -> ConnInfo {
    ConnInfo {
        peer: peer.parse::<SocketAddr>().expect("peer address"),
        proto: "http",
        port: 8080,
        worker: 0,
    }
}

/// `GET path` with `Host: shop.example` and the given headers.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request<Bytes> {
    let mut req = Request::get(path).header("host", "shop.example");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Bytes::new()).expect("request")
}

pub async fn text(resp: Response<Body>) -> String {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8 body")
}
