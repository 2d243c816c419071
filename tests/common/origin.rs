//! A scripted HTTP origin for the cache tests: each path answers the status, headers and delay a test set for it, with a body that counts its renders.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What a path answers.
#[derive(Clone, Default)]
pub struct Script {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
    /// Text repeated in the body (after `render N of PATH`).
    pub filler: String,
}

impl Script {
    pub fn ok(headers: &[(&str, &str)]) -> Script {
        Script {
            status: 200,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..Script::default()
        }
    }
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, Script>,
    renders: HashMap<String, usize>,
    /// Request headers of the last request per path.
    seen: HashMap<String, hyper::HeaderMap>,
}

/// The origin; killed on drop.
pub struct Origin {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Origin {
    pub async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<State>> = Arc::default();
        let stop = CancellationToken::new();
        let (st, stopped) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = stopped.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let (st, killed) = (st.clone(), stopped.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| serve(st.clone(), req));
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    tokio::select! {
                        _ = builder.serve_connection(TokioIo::new(stream), svc) => {}
                        _ = killed.cancelled() => {}
                    }
                });
            }
        });
        Origin { addr, state, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What `path` (without its query) answers from now on.
    pub fn script(&self, path: &str, script: Script) {
        self.state.lock().scripts.insert(path.to_string(), script);
    }

    /// How many times `path` (without its query) was rendered.
    pub fn renders(&self, path: &str) -> usize {
        self.state.lock().renders.get(path).copied().unwrap_or(0)
    }

    /// The headers the last request for `path` carried.
    pub fn seen(&self, path: &str) -> hyper::HeaderMap {
        self.state
            .lock()
            .seen
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// Stops accepting and drops every connection, like a crashed server.
    pub fn kill(&self) {
        self.stop.cancel();
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let (script, n) = {
        let mut s = state.lock();
        let n = {
            let r = s.renders.entry(path.clone()).or_default();
            *r += 1;
            *r
        };
        s.seen.insert(path.clone(), req.headers().clone());
        (
            s.scripts
                .get(&path)
                .cloned()
                .unwrap_or_else(|| Script::ok(&[])),
            n,
        )
    };
    if !script.delay.is_zero() {
        tokio::time::sleep(script.delay).await;
    }
    let body = format!("render {n} of {}{}", req.uri(), script.filler);
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(script.status.max(200)).unwrap();
    resp.headers_mut()
        .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
    for (name, value) in &script.headers {
        resp.headers_mut().append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Ok(resp)
}
