//! One upstream over several servers: picking a server (round robin, least
//! connections), passive and active health, `max_conns` with a bounded wait
//! queue, and retrying a request that never left to the next server.
//!
//! Each server is a [`proxy::Upstream`](crate::proxy::Upstream) of its own,
//! so forwarding stays about one server; this module only decides which one.
//! A server's place (`in_flight`) is taken before the request is sent and
//! given back when the response body is done (the place rides on the body's
//! guard, like a concurrency slot), so `max_conns` bounds what the server is
//! really busy with, streaming included.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{BalanceConfig, Policy, UpstreamConfig};
use crate::forward_error::{ForwardError, Kind};
use crate::metrics::{inc, text, Counter, Metrics};
use crate::proxy::{Outbound, SendError, Sent, Upstream};

/// Passive health of one server, nginx's way: `max_fails` failures within
/// `fail_timeout` take it out for `fail_timeout`. Pure: time is an argument.
#[derive(Debug, Default, Clone)]
pub struct Passive {
    fails: u32,
    /// When the current counting window began.
    since: Option<Instant>,
    down_until: Option<Instant>,
}

impl Passive {
    pub fn available(&self, now: Instant) -> bool {
        self.down_until.is_none_or(|t| now >= t)
    }

    /// Failures counted in the current window.
    pub fn fails(&self) -> u32 {
        self.fails
    }

    /// Counts a failure; true when it takes the server out.
    pub fn failed(&mut self, now: Instant, max_fails: u32, fail_timeout: Duration) -> bool {
        if max_fails == 0 {
            return false;
        }
        if self
            .since
            .is_none_or(|s| now.duration_since(s) >= fail_timeout)
        {
            self.fails = 0;
            self.since = Some(now);
        }
        self.fails += 1;
        if self.fails >= max_fails {
            self.fails = 0;
            self.since = None;
            self.down_until = Some(now + fail_timeout);
            return true;
        }
        false
    }
}

/// One server of an upstream and what is known about it.
pub struct Server {
    pub forwarder: Upstream,
    /// The URL as configured, for /status, /metrics and logs.
    pub label: String,
    in_flight: AtomicU32,
    passive: Mutex<Passive>,
    /// The active check's verdict (true when there is none).
    probe_up: AtomicBool,
    /// Woken when a place frees up, for requests in the queue.
    freed: Arc<Notify>,
    failures: Counter,
}

impl Server {
    fn try_take(&self, max_conns: Option<u32>) -> bool {
        match max_conns {
            None => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(max) => self
                .in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// A server's place, held as long as the response body (or tunnel) is.
pub struct Place(Arc<Server>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// An active health check's client and schedule.
struct HealthProbe {
    path: String,
    interval: Duration,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    next_due: Mutex<Instant>,
}

/// One upstream: its servers and how a request picks one.
pub struct Balancer {
    pub name: String,
    pub servers: Vec<Arc<Server>>,
    balance: BalanceConfig,
    /// Passive health applies only with two or more servers: with one, there
    /// is nothing better to send to (nginx does the same).
    passive_health: bool,
    next: AtomicUsize,
    waiting: AtomicU32,
    freed: Arc<Notify>,
    health: Option<HealthProbe>,
    retries: Counter,
    busy: Counter,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("name", &self.name)
            .field("servers", &self.servers.len())
            .finish()
    }
}

/// The config of one server: the upstream's, with that server's URL.
fn server_config(config: &UpstreamConfig, url: &http::Uri) -> UpstreamConfig {
    let mut c = config.clone();
    c.url = url.clone();
    c
}

impl Balancer {
    /// `workers`: the worker runtimes (`server.workers`), for the servers' pools.
    pub fn new(config: &UpstreamConfig, metrics: &Metrics, workers: usize) -> Balancer {
        let freed = Arc::new(Notify::new());
        let servers = config
            .balance
            .servers
            .iter()
            .map(|url| {
                let label = url.to_string();
                Arc::new(Server {
                    forwarder: Upstream::new(&server_config(config, url), metrics, workers),
                    failures: metrics.counter(
                        "tollgate_upstream_server_failures_total",
                        &[("upstream", &config.name), ("server", &label)],
                    ),
                    label,
                    in_flight: AtomicU32::new(0),
                    passive: Mutex::new(Passive::default()),
                    probe_up: AtomicBool::new(true),
                    freed: freed.clone(),
                })
            })
            .collect::<Vec<_>>();
        let health = config.balance.health.as_ref().map(|h| HealthProbe {
            path: h.path.clone(),
            interval: h.interval,
            client: probe_client(config),
            next_due: Mutex::new(Instant::now()),
        });
        Balancer {
            name: config.name.clone(),
            passive_health: servers.len() > 1,
            servers,
            balance: config.balance.clone(),
            next: AtomicUsize::new(0),
            waiting: AtomicU32::new(0),
            freed,
            health,
            retries: metrics.counter(
                "tollgate_upstream_retries_total",
                &[("upstream", &config.name)],
            ),
            busy: metrics.counter(
                "tollgate_upstream_busy_total",
                &[("upstream", &config.name)],
            ),
        }
    }

    /// Whether this balancer can serve `config` unchanged (a reload keeps its
    /// pools warm and its servers' health).
    pub fn serves(&self, config: &UpstreamConfig) -> bool {
        self.name == config.name
            && self.balance == config.balance
            && self
                .servers
                .iter()
                .zip(&config.balance.servers)
                .all(|(s, url)| s.forwarder.serves(&server_config(config, url)))
    }

    /// How long an upgraded connection may stay silent.
    pub fn tunnel_idle_timeout(&self) -> Duration {
        self.balance.tunnel_idle_timeout
    }

    /// Requests waiting in the queue for a free server.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Whether server `i` is taken into account now (`up` in /status).
    pub fn is_up(&self, server: &Server, now: Instant) -> bool {
        server.probe_up.load(Ordering::Acquire)
            && (!self.passive_health || server.passive.lock().available(now))
    }

    /// Failures counted against `server` in its current window.
    pub fn fails(&self, server: &Server) -> u32 {
        server.passive.lock().fails()
    }

    /// Sends the request to a server: retried on the next one when it
    /// could not be sent at all and the method is idempotent.
    pub async fn forward(&self, mut outbound: Box<Outbound>) -> Result<Sent, ForwardError> {
        let retryable = idempotent(outbound.method());
        let mut tried: Vec<usize> = Vec::new();
        let mut last: Option<ForwardError> = None;
        loop {
            let (index, place) = match self.acquire(&tried).await {
                Ok(p) => p,
                // No other server left to try: the last failure is the answer.
                Err(e) => return Err(last.unwrap_or(e)),
            };
            let server = &self.servers[index];
            match server.forwarder.send(outbound).await {
                Ok((resp, connection)) => {
                    return Ok((resp, crate::body::join(connection, Some(Box::new(place)))));
                }
                Err(SendError { error, back }) => {
                    if error.counts_against_server() {
                        self.failed(server);
                    }
                    // Only a request that never left (`retry`, its body
                    // handed `back`) may go to another server.
                    let more = tried.len() + 1 < self.servers.len();
                    match back.filter(|_| error.retry && retryable && more) {
                        Some(back) => {
                            tracing::info!(upstream = %self.name, server = %server.label, %error, "retrying on the next server");
                            inc(&self.retries);
                            tried.push(index);
                            outbound = back;
                            last = Some(error);
                        }
                        None => return Err(error),
                    }
                }
            }
        }
    }

    fn failed(&self, server: &Server) {
        inc(&server.failures);
        if !self.passive_health {
            return;
        }
        let down = server.passive.lock().failed(
            Instant::now(),
            self.balance.max_fails,
            self.balance.fail_timeout,
        );
        if down {
            tracing::warn!(upstream = %self.name, server = %server.label, fail_timeout = ?self.balance.fail_timeout, "server marked down");
        }
    }

    /// A place on a live server not in `tried`, waiting in the queue when
    /// every live one is at `max_conns`.
    async fn acquire(&self, tried: &[usize]) -> Result<(usize, Place), ForwardError> {
        match self.pick(tried) {
            Pick::Got(i) => return Ok((i, Place(self.servers[i].clone()))),
            Pick::NoneAlive => return Err(self.no_live_server()),
            Pick::Busy => {}
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.balance.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            inc(&self.busy);
            return Err(ForwardError::new(
                Kind::QueueFull,
                format!(
                    "every server of upstream {} is at max_conns and its queue is full",
                    self.name
                ),
            )
            .on(&self.name));
        }
        struct WaitingGuard<'a>(&'a AtomicU32);
        impl Drop for WaitingGuard<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = WaitingGuard(&self.waiting);
        let deadline = tokio::time::Instant::now() + self.balance.queue_timeout;
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            // Registered before looking, so a place freed meanwhile is not missed.
            notified.as_mut().enable();
            match self.pick(tried) {
                Pick::Got(i) => return Ok((i, Place(self.servers[i].clone()))),
                Pick::NoneAlive => return Err(self.no_live_server()),
                Pick::Busy => {}
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                inc(&self.busy);
                return Err(ForwardError::new(
                    Kind::QueueTimeout,
                    format!(
                        "no server of upstream {} came free within {:?}",
                        self.name, self.balance.queue_timeout
                    ),
                )
                .on(&self.name));
            }
        }
    }

    fn no_live_server(&self) -> ForwardError {
        ForwardError::new(
            Kind::NoLiveServer,
            format!("every server of upstream {} is marked down", self.name),
        )
        .on(&self.name)
    }

    /// Picks a live server with room, by the policy; takes its place.
    fn pick(&self, tried: &[usize]) -> Pick {
        let n = self.servers.len();
        let now = Instant::now();
        if n == 1 {
            // The common single-server upstream: no ordering, no allocation.
            let server = &self.servers[0];
            return if !tried.is_empty() || !self.is_up(server, now) {
                Pick::NoneAlive
            } else if server.try_take(self.balance.max_conns) {
                Pick::Got(0)
            } else {
                Pick::Busy
            };
        }
        // A retry goes on from the server that failed, without taking
        // another request's turn.
        let start = match tried.last() {
            Some(&last) => last + 1,
            None => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        let mut order: Vec<usize> = (0..n)
            .map(|k| (start + k) % n)
            .filter(|i| !tried.contains(i) && self.is_up(&self.servers[*i], now))
            .collect();
        if order.is_empty() {
            return Pick::NoneAlive;
        }
        if self.balance.policy == Policy::LeastConn {
            // Stable: among equals, the round-robin order decides.
            order.sort_by_key(|&i| self.servers[i].in_flight());
        }
        for i in order {
            if self.servers[i].try_take(self.balance.max_conns) {
                return Pick::Got(i);
            }
        }
        Pick::Busy
    }

    /// Runs the active check on every server if it is due; returns when the next one is.
    fn probe_if_due(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let health = self.health.as_ref()?;
        let mut due = health.next_due.lock();
        if now >= *due {
            *due = now + health.interval;
            for server in &self.servers {
                let (me, server) = (self.clone(), server.clone());
                tokio::spawn(async move { me.probe(&server).await });
            }
        }
        Some(*due)
    }

    async fn probe(&self, server: &Server) {
        let Some(health) = &self.health else { return };
        let up = probe_once(&health.client, &server.label, &health.path, health.interval).await;
        let was = server.probe_up.swap(up, Ordering::AcqRel);
        if was != up {
            if up {
                tracing::info!(upstream = %self.name, server = %server.label, "health check passes again: server up");
            } else {
                tracing::warn!(upstream = %self.name, server = %server.label, path = %health.path, "health check failed: server down");
            }
        }
    }

    /// Labeled gauges for /metrics, appended to `out` (Prometheus text).
    pub fn render_metrics(balancers: &[Arc<Balancer>], out: &mut String) {
        let now = Instant::now();
        let families: [(&str, &str); 3] = [
            (
                "tollgate_upstream_server_up",
                "1 when the server takes requests (passive and active health), else 0.",
            ),
            (
                "tollgate_upstream_server_in_flight",
                "Requests (and tunnels) a server is busy with.",
            ),
            (
                "tollgate_upstream_server_fails",
                "Failures counted against a server in its current fail_timeout window.",
            ),
        ];
        for (f, (name, help)) in families.iter().enumerate() {
            text::family(out, name, help, "gauge");
            for b in balancers {
                for s in &b.servers {
                    let v = match f {
                        0 => u32::from(b.is_up(s, now)),
                        1 => s.in_flight(),
                        _ => b.fails(s),
                    };
                    let labels = text::labels(&[("upstream", &b.name), ("server", &s.label)]);
                    text::sample(out, name, &labels, v);
                }
            }
        }
        let name = "tollgate_upstream_queue_waiting";
        let help = "Requests waiting for a server under max_conns.";
        text::family(out, name, help, "gauge");
        for b in balancers {
            text::sample(
                out,
                name,
                &text::labels(&[("upstream", &b.name)]),
                b.waiting(),
            );
        }
    }

    /// Each server's state for /status.
    pub fn status(&self) -> serde_json::Value {
        let now = Instant::now();
        serde_json::json!({
            "name": self.name,
            "balance": match self.balance.policy { Policy::RoundRobin => "round_robin", Policy::LeastConn => "least_conn" },
            "max_conns": self.balance.max_conns,
            "queue": {"waiting": self.waiting(), "size": self.balance.queue},
            "servers": self.servers.iter().map(|s| serde_json::json!({
                "url": s.label,
                "state": if self.is_up(s, now) { "up" } else { "down" },
                "in_flight": s.in_flight(),
                "fails": self.fails(s),
                "health_check": self.health.as_ref().map(|_| if s.probe_up.load(Ordering::Acquire) { "pass" } else { "fail" }),
            })).collect::<Vec<_>>(),
        })
    }
}

enum Pick {
    Got(usize),
    Busy,
    NoneAlive,
}

/// Methods RFC 9110 §9.2.2 calls idempotent: safe to send again.
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

fn probe_client(config: &UpstreamConfig) -> Client<HttpsConnector<HttpConnector>, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.enforce_http(false);
    let tls = crate::tls::upstream_client_config(&config.tls);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        // One probe at a time per server: nothing worth keeping idle.
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// One `GET path` on the server at `base`: 2xx or 3xx within `limit` is up.
async fn probe_once(
    client: &Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    base: &str,
    path: &str,
    limit: Duration,
) -> bool {
    let url = format!("{}{}", base.trim_end_matches('/'), path);
    let Ok(req) = Request::get(url)
        .header(http::header::USER_AGENT, "tollgate-health-check")
        .body(Empty::<Bytes>::new())
    else {
        return false;
    };
    match tokio::time::timeout(limit, client.request(req)).await {
        Ok(Ok(resp)) => resp.status().is_success() || resp.status().is_redirection(),
        _ => false,
    }
}

/// Runs the active health checks of every upstream `current` returns (the
/// snapshot in force, so a reload is picked up) until `stop`; never on the
/// request path.
pub async fn health_checks<F>(current: F, stop: CancellationToken)
where
    F: Fn() -> Vec<Arc<Balancer>> + Send + 'static,
{
    loop {
        let now = Instant::now();
        let next = current()
            .iter()
            .filter_map(|b| b.probe_if_due(now))
            .min()
            // Looked at again at least every second, for a reload's new checks.
            .map_or(Duration::from_secs(1), |due| {
                due.saturating_duration_since(now)
                    .min(Duration::from_secs(1))
            });
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(next.max(Duration::from_millis(10))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn max_fails_within_fail_timeout_take_a_server_out_for_fail_timeout() {
        let t0 = Instant::now();
        let mut p = Passive::default();
        assert!(!p.failed(t0, 3, 10 * S));
        assert!(!p.failed(t0 + S, 3, 10 * S));
        assert!(p.available(t0 + S));
        assert!(p.failed(t0 + 2 * S, 3, 10 * S));
        assert!(!p.available(t0 + 2 * S));
        assert!(!p.available(t0 + 11 * S));
        assert!(p.available(t0 + 12 * S));
    }

    #[test]
    fn failures_spread_wider_than_fail_timeout_never_add_up() {
        let t0 = Instant::now();
        let mut p = Passive::default();
        for k in 0..10 {
            assert!(!p.failed(t0 + k * 11 * S, 2, 10 * S));
        }
        assert!(p.available(t0 + 200 * S));
    }

    #[test]
    fn max_fails_zero_never_marks_a_server_down() {
        let t0 = Instant::now();
        let mut p = Passive::default();
        for _ in 0..100 {
            assert!(!p.failed(t0, 0, 10 * S));
        }
        assert!(p.available(t0));
    }

    #[test]
    fn only_idempotent_methods_are_retried() {
        assert!(idempotent(&Method::GET));
        assert!(idempotent(&Method::PUT));
        assert!(!idempotent(&Method::POST));
        assert!(!idempotent(&Method::PATCH));
    }
}
