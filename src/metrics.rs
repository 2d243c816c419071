//! Counters, gauges and histograms in the Prometheus text format.
//!
//! A series is created once (when a snapshot is built) and its handle kept
//! by the route, limiter or upstream that updates it, so the request path
//! does a few relaxed atomic adds and never looks anything up. Series outlive
//! reloads: the registry hands out the same handle for the same name and
//! labels. Label values come from config names and a fixed set of words, so
//! the number of series is bounded by the config.

pub mod episode;
mod histogram;
pub mod process;
pub mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use histogram::Histogram;

pub type Counter = Arc<AtomicU64>;

pub fn inc(c: &Counter) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A value that goes up and down (requests in flight, open connections).
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Counts one until the returned guard is dropped.
    pub fn enter(self: &Arc<Self>) -> GaugeGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone())
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct GaugeGuard(Arc<Gauge>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a request was decided: the one value the access log's `decision`,
/// the `decision` label of `tollgate_requests_total` and of
/// `tollgate_request_duration_seconds` all show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Every limiter allowed it (or the route has none).
    Allowed,
    /// A limiter rejected it (429, or the status its `reject` sets).
    Rejected,
    /// Refused outright before any limiter counted it: its key is banned (`ban:`).
    Banned,
    /// Allowed, but a `mode: shadow` limiter would have rejected it.
    ShadowRejected,
    /// The client is in `identity.exempt`: no limiter was asked.
    Exempt,
    /// The store failed and `on_error: deny` refused the request.
    StoreError,
    /// Refused before any limiter: bad request, unknown API key, no route, body too large.
    Error,
    /// A browser without a pass was answered with the proof-of-work page
    /// (`challenge: always`, or instead of a limiter's refusal).
    Challenged,
    /// A CrowdSec decision on the client's address (`identity.crowdsec`)
    /// refused it, or answered it with the challenge page.
    CrowdSec,
}

impl Decision {
    pub const ALL: [Decision; 9] = [
        Decision::Allowed,
        Decision::Rejected,
        Decision::Banned,
        Decision::ShadowRejected,
        Decision::Exempt,
        Decision::StoreError,
        Decision::Error,
        Decision::Challenged,
        Decision::CrowdSec,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Rejected => "rejected",
            Decision::Banned => "banned",
            Decision::ShadowRejected => "shadow_rejected",
            Decision::Exempt => "exempt",
            Decision::StoreError => "store_error",
            Decision::Error => "error",
            Decision::Challenged => "challenged",
            Decision::CrowdSec => "crowdsec",
        }
    }
}

/// An answer a site rule made (`tollgate_site_answers_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteAnswer {
    /// `redirect:` answered with a `Location`.
    Redirect,
    /// `respond:` answered.
    Respond,
    /// `access:` (the route's or the site's) refused the client's address: 403.
    Denied,
    /// `auth.basic:` found no valid user: 401.
    Unauthenticated,
}

impl SiteAnswer {
    pub const ALL: [SiteAnswer; 4] = [
        SiteAnswer::Redirect,
        SiteAnswer::Respond,
        SiteAnswer::Denied,
        SiteAnswer::Unauthenticated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SiteAnswer::Redirect => "redirect",
            SiteAnswer::Respond => "respond",
            SiteAnswer::Denied => "denied",
            SiteAnswer::Unauthenticated => "unauthenticated",
        }
    }
}

/// Responses by status code, one atomic per code: no lookup, no lock, and at
/// most 900 series per route whatever the upstream sends.
#[derive(Debug)]
pub struct StatusCounts([AtomicU64; 900]);

impl Default for StatusCounts {
    fn default() -> StatusCounts {
        StatusCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl StatusCounts {
    pub fn inc(&self, status: u16) {
        if let Some(c) = self.0.get(usize::from(status).wrapping_sub(100)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, status: u16) -> u64 {
        self.0
            .get(usize::from(status).wrapping_sub(100))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Responses with a status in `range` (e.g. `500..=599`).
    pub fn sum(&self, range: std::ops::RangeInclusive<u16>) -> u64 {
        range.map(|s| self.get(s)).sum()
    }
}

/// What one route updates for every request it answers.
pub struct RouteSeries {
    /// Indexed by `Decision as usize`.
    pub duration: [Arc<Histogram>; Decision::ALL.len()],
    pub statuses: Arc<StatusCounts>,
}

impl RouteSeries {
    pub fn observe(&self, decision: Decision, status: u16, elapsed: std::time::Duration) {
        self.duration[decision as usize].observe(elapsed);
        self.statuses.inc(status);
    }

    /// The `q` quantile (0..=1) of every request's duration since start, in
    /// seconds, whatever its decision; `None` before the first request.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let all: Vec<&Histogram> = self.duration.iter().map(|h| &**h).collect();
        histogram::quantile(&all, q)
    }
}

/// The label of requests that matched no route.
pub const NO_ROUTE: &str = "(none)";

/// The `kind`s of `tollgate_upstream_errors_total` every upstream starts
/// with (the common failures); rarer kinds appear when they first happen.
pub const UPSTREAM_ERRORS_AT_ZERO: [&str; 3] = ["connect", "timeout", "other"];

pub const REQUEST_DURATION: &str = "tollgate_request_duration_seconds";
pub const UPSTREAM_DURATION: &str = "tollgate_upstream_duration_seconds";

#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), Counter>>,
    histograms: Mutex<BTreeMap<(&'static str, String), Arc<Histogram>>>,
    /// Route name → its status counts.
    statuses: Mutex<BTreeMap<String, Arc<StatusCounts>>>,
    pub in_flight: Arc<Gauge>,
    pub episodes: episode::Episodes,
}

/// Request headers tollgate did not forward (`proxy::drop_underscore_names`).
pub const HEADERS_DROPPED: &str = "tollgate_headers_dropped_total";

const HELP: &[(&str, &str)] = &[
    ("tollgate_requests_total", "Requests by route and decision (allowed, rejected, banned, shadow_rejected, exempt, store_error, challenged)."),
    ("tollgate_limiter_decisions_total", "Limiter verdicts by limiter and result (allowed, delayed, rejected, would_reject for shadow limiters, banned, not_counted for count: requests given back because their answer did not match or tollgate refused them)."),
    ("tollgate_connections_refused_total", "Client connections closed at once because a cap was reached, by reason (max_connections, max_connections_per_ip)."),
    ("tollgate_connections_displaced_total", "Client connections closed to make room for a new one at max_connections, by what they were waiting for (no_request: their first request head; idle: their next request)."),
    ("tollgate_connections_closed_total", "Client connections closed by a timer, by reason (no_request: nothing sent within request_header_timeout; request_header_timeout: a request head begun and not finished within it; idle: idle_timeout; send_timeout: a write to the client blocked for send_timeout)."),
    ("tollgate_request_body_timeouts_total", "Requests answered 408 because their body stalled for request_body_timeout or fell below request_body_min_rate."),
    ("tollgate_request_bodies_spilled_total", "Request bodies larger than request_body_buffer, set aside in a temp file before forwarding."),
    ("tollgate_upstream_share_waits_total", "Requests that waited for a place because their connection had upstream_requests_per_connection exchanges in flight (HTTP/2)."),
    ("tollgate_unknown_api_keys_total", "Requests with an API key no key source lists, by result (refused: 401; limited: 429 after too many from one IP)."),
    ("tollgate_bans_total", "Bans started, by limiter (ban: after N rejections within the window)."),
    ("tollgate_upstream_errors_total", "Failed forwards by upstream and kind (connect, timeout, body_too_large, body_spill, share_timeout, other, no_live_server, queue_full, queue_timeout)."),
    ("tollgate_store_errors_total", "Store calls that failed, by backend and the on_error policy applied."),
    ("tollgate_store_unsaved_dropped_total", "SQLite: keys whose change was given up because too many waited for a failing disk (exact in memory; saved when they change again)."),
    ("tollgate_store_fallback_total", "Requests decided by the on_error policy (allow, deny, local) because the store failed."),
    ("tollgate_lease_calls_saved_total", "Requests decided from leased quotas alone, without a Redis call (lease:)."),
    ("tollgate_leases_taken_total", "Leases taken from Redis (lease:), each in the call of the request that asked for it."),
    ("tollgate_lease_units_total", "Leased units by outcome: granted, spent, returned (given back when the lease ended), lost (never spent and not given back: a token bucket's, or a give-back that failed)."),
    ("tollgate_lease_table_full_total", "Keys checked per request without asking for a lease because the lease table was full (65536 keys)."),
    ("tollgate_lease_waits_total", "Requests that waited for their key's lease being fetched by another request and found a lease open after it."),
    ("tollgate_config_reloads_total", "Config reloads by result (ok, error)."),
    ("tollgate_tls_handshake_failures_total", "TLS handshakes that failed, by reason (error, timeout)."),
    ("tollgate_lingering_closes_total", "Connections closed the lingering way after an answer sent before the request body's end, by how the discarding ended (eof, reset, timeout, time, size, error, cut)."),
    (REQUEST_DURATION, "Time from the request head to the last byte of the response, by route and decision (allowed, rejected, banned, shadow_rejected, exempt, store_error, error, challenged)."),
    (UPSTREAM_DURATION, "Time until the upstream's response head arrived (or the forward failed), by upstream."),
    ("tollgate_upstream_server_failures_total", "Failed forwards counted against one server of an upstream (connect, timeout, broken exchange)."),
    ("tollgate_upstream_retries_total", "Requests sent again to the next server because the first could not be reached."),
    ("tollgate_compressed_responses_total", "Responses compressed on the fly, by encoding."),
    ("tollgate_compression_bytes_total", "Bytes into and out of the response encoders, by encoding and direction."),
    ("tollgate_headers_dropped_total", "Request headers not forwarded, by reason (underscore: a name with `_`, which a CGI gateway would read as the same variable as its dashed twin)."),
    ("tollgate_challenges_issued_total", "Proof-of-work challenge pages served to browsers without a pass."),
    ("tollgate_challenges_solved_total", "Challenges solved and turned into a pass, by the SHA-256 the page used (subtle: WebCrypto; js: its own, on plain HTTP)."),
    ("tollgate_challenges_failed_total", "Posted solutions refused, by reason (malformed, unknown_key, forged, expired, other_site, other_prefix, unsolved)."),
    ("tollgate_passes_verified_total", "Requests that carried a valid pass cookie."),
    ("tollgate_passes_rejected_total", "Pass cookies treated as no pass, by reason (malformed, unknown_key, forged, expired, other_site, other_prefix)."),
    ("tollgate_challenge_solve_seconds", "Time the challenge page reported it took to solve (the browser's own measure, capped at the challenge's lifetime)."),
    ("tollgate_pass_issue_refused_total", "Solved challenges whose address block had used its allowance of new passes (identity.pass.issue_limit per ttl): the pass given counts as the client's address."),
    ("tollgate_crawler_checks_total", "Crawler checks of requests that would be challenged, by result (cidr, confirmed and refused by forward-confirmed reverse DNS, cached, error)."),
    ("tollgate_proxy_protocol_accepted_total", "Connections from a server.proxy_protocol peer whose PROXY header was read, by version (1, 2)."),
    ("tollgate_proxy_protocol_refused_total", "Connections from a server.proxy_protocol peer closed without a valid PROXY header, by reason (missing, invalid, too_long, timeout, closed)."),
    ("tollgate_acme_orders_total", "ACME certificate orders by result (ok, error, rate_limited: the CA said rateLimited)."),
    ("tollgate_cache_requests_total", "Requests on caching routes by route and result (hit: answered from the cache, also when another request's render was shared; miss: asked the upstream; stale: a stale answer served while it refreshes or because the upstream failed; bypass: not for the cache, by method, Authorization or a bypass cookie)."),
    ("tollgate_cache_evictions_total", "Cache entries (stored answers, Vary records, keys remembered as not storable) evicted to make room within cache.max_size."),
    ("tollgate_cache_stored_total", "Answers stored in the cache."),
    ("tollgate_upstream_busy_total", "Requests answered 503 because every server was at max_conns and the queue was full or timed out."),
];

fn help(name: &str) -> &'static str {
    HELP.iter().find(|(n, _)| *n == name).map_or("", |(_, h)| h)
}

/// One sample of a counter or gauge the caller keeps itself (rendered by [`Metrics::render`]).
pub struct Extra<'a> {
    pub name: &'a str,
    pub help: &'a str,
    pub kind: &'a str,
    pub value: f64,
}

impl<'a> Extra<'a> {
    pub fn gauge(name: &'a str, help: &'a str, value: f64) -> Self {
        Extra {
            name,
            help,
            kind: "gauge",
            value,
        }
    }

    pub fn counter(name: &'a str, help: &'a str, value: u64) -> Self {
        Extra {
            name,
            help,
            kind: "counter",
            value: value as f64,
        }
    }
}

impl Metrics {
    /// The counter for `name` with `labels` (label values are escaped on output).
    pub fn counter(&self, name: &'static str, labels: &[(&str, &str)]) -> Counter {
        self.counters
            .lock()
            .entry((name, text::labels(labels)))
            .or_default()
            .clone()
    }

    pub fn histogram(&self, name: &'static str, labels: &[(&str, &str)]) -> Arc<Histogram> {
        self.histograms
            .lock()
            .entry((name, text::labels(labels)))
            .or_default()
            .clone()
    }

    /// Creates at zero the series of events that may not have happened yet,
    /// so every family is there from the first scrape: a dashboard or an
    /// alert on `rate()` sees 0, not "no data", and a typo in a query is
    /// told from a quiet proxy. Per snapshot (idempotent): `upstreams` are the
    /// configured upstream names, `backend`, `error_policy` (the `policy`
    /// of its errors: `on_error` where a request can find it unreachable,
    /// else `none`) and `on_error` the store's labels.
    pub fn start_at_zero(
        &self,
        upstreams: &[&str],
        backend: &str,
        error_policy: &str,
        on_error: &str,
    ) {
        for name in [
            "tollgate_request_body_timeouts_total",
            "tollgate_request_bodies_spilled_total",
            "tollgate_upstream_share_waits_total",
        ] {
            self.counter(name, &[]);
        }
        self.counter(HEADERS_DROPPED, &[("reason", "underscore")]);
        for result in ["ok", "error"] {
            self.counter("tollgate_config_reloads_total", &[("result", result)]);
        }
        for reason in ["error", "timeout"] {
            self.counter(
                "tollgate_tls_handshake_failures_total",
                &[("reason", reason)],
            );
        }
        self.counter(
            "tollgate_store_errors_total",
            &[("backend", backend), ("policy", error_policy)],
        );
        self.counter("tollgate_store_fallback_total", &[("policy", on_error)]);
        for upstream in upstreams {
            for kind in UPSTREAM_ERRORS_AT_ZERO {
                self.counter(
                    "tollgate_upstream_errors_total",
                    &[("upstream", upstream), ("kind", kind)],
                );
            }
        }
    }

    /// The series a route updates per request (also for [`NO_ROUTE`]).
    pub fn route_series(&self, route: &str) -> RouteSeries {
        RouteSeries {
            duration: Decision::ALL.map(|d| {
                self.histogram(
                    REQUEST_DURATION,
                    &[("route", route), ("decision", d.as_str())],
                )
            }),
            statuses: self
                .statuses
                .lock()
                .entry(route.to_string())
                .or_default()
                .clone(),
        }
    }

    /// Requests per route and decision so far, from `tollgate_requests_total`
    /// (for the dashboard: rates are differences of two readings).
    pub fn route_totals(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for ((name, labels), c) in self.counters.lock().iter() {
            if *name != "tollgate_requests_total" {
                continue;
            }
            let (Some(route), Some(decision)) = (label(labels, "route"), label(labels, "decision"))
            else {
                continue;
            };
            *out.entry(route).or_default().entry(decision).or_default() +=
                c.load(Ordering::Relaxed);
        }
        out
    }

    /// Responses per route and status so far, from `tollgate_responses_total`.
    pub fn route_statuses(&self) -> BTreeMap<String, BTreeMap<u16, u64>> {
        self.statuses
            .lock()
            .iter()
            .map(|(route, counts)| {
                let by_status = (100..1000u16)
                    .map(|s| (s, counts.get(s)))
                    .filter(|(_, n)| *n > 0)
                    .collect::<BTreeMap<_, _>>();
                (route.clone(), by_status)
            })
            .collect()
    }

    /// The text exposition: every series, then `extra` (gauges and counters
    /// others keep), the build info and, if given, the process metrics.
    pub fn render(&self, extra: &[Extra<'_>], process: Option<&process::Sample>) -> String {
        let mut out = String::with_capacity(8192);
        self.render_counters(&mut out);
        self.render_statuses(&mut out);
        self.render_histograms(&mut out);
        let gauges = [Extra {
            name: "tollgate_in_flight_requests",
            help: "Requests being served now.",
            kind: "gauge",
            value: self.in_flight.get() as f64,
        }];
        for e in gauges.iter().chain(extra) {
            text::family(&mut out, e.name, e.help, e.kind);
            text::sample(&mut out, e.name, "", e.value);
        }
        let build = "tollgate_build_info";
        text::family(&mut out, build, "The running version (always 1).", "gauge");
        let version = text::labels(&[("version", env!("CARGO_PKG_VERSION"))]);
        text::sample(&mut out, build, &version, 1);
        if let Some(p) = process {
            p.render(&mut out);
        }
        out
    }

    fn render_counters(&self, out: &mut String) {
        let counters = self.counters.lock();
        let mut last = "";
        for ((name, labels), value) in counters.iter() {
            if *name != last {
                text::family(out, name, help(name), "counter");
                last = name;
            }
            text::sample(out, name, labels, value.load(Ordering::Relaxed));
        }
    }

    fn render_statuses(&self, out: &mut String) {
        let name = "tollgate_responses_total";
        let help = format!(
            "Responses by route and status code ({NO_ROUTE} for requests that matched no route)."
        );
        text::family(out, name, &help, "counter");
        for (route, counts) in self.statuses.lock().iter() {
            for status in 100..1000u16 {
                let n = counts.get(status);
                if n > 0 {
                    let labels = text::labels(&[("route", route), ("status", &status.to_string())]);
                    text::sample(out, name, &labels, n);
                }
            }
        }
    }

    fn render_histograms(&self, out: &mut String) {
        let histograms = self.histograms.lock();
        let mut last = "";
        for ((name, labels), h) in histograms.iter() {
            if *name != last {
                text::family(out, name, help(name), "histogram");
                last = name;
            }
            h.render(out, name, labels);
        }
    }
}

/// The value of `name` in a label key built by [`text::labels`] (unescaped).
fn label(labels: &str, name: &str) -> Option<String> {
    let start = labels
        .split(',')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\""))?;
    // Values are escaped; route and decision names hold no quotes or commas.
    Some(start.strip_suffix('"').unwrap_or(start).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_and_labels_share_one_counter_across_snapshots() {
        let m = Metrics::default();
        let a = m.counter(
            "tollgate_requests_total",
            &[("route", "ping"), ("decision", "allowed")],
        );
        let b = m.counter(
            "tollgate_requests_total",
            &[("route", "ping"), ("decision", "allowed")],
        );
        inc(&a);
        inc(&b);
        let text = m.render(
            &[Extra {
                name: "tollgate_tracked_keys",
                help: "Keys.",
                kind: "gauge",
                value: 3.0,
            }],
            None,
        );
        assert!(
            text.contains("tollgate_requests_total{route=\"ping\",decision=\"allowed\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE tollgate_requests_total counter"));
        assert!(text.contains("tollgate_tracked_keys 3"));
        assert_eq!(m.route_totals()["ping"]["allowed"], 2);
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.counter("tollgate_requests_total", &[("route", "a\"b")]);
        assert!(m.render(&[], None).contains("route=\"a\\\"b\""));
    }

    #[test]
    fn statuses_are_counted_per_route_and_out_of_range_codes_ignored() {
        let m = Metrics::default();
        let s = m.route_series("api");
        s.observe(Decision::Allowed, 200, std::time::Duration::from_millis(2));
        s.observe(
            Decision::Rejected,
            429,
            std::time::Duration::from_micros(50),
        );
        s.statuses.inc(42);
        let text = m.render(&[], None);
        assert!(text.contains("tollgate_responses_total{route=\"api\",status=\"429\"} 1"));
        assert!(text.contains(
            "tollgate_request_duration_seconds_count{route=\"api\",decision=\"rejected\"} 1"
        ));
        assert_eq!(m.route_statuses()["api"].len(), 2);
    }

    #[test]
    fn a_gauge_guard_counts_while_it_lives() {
        let m = Metrics::default();
        let g = m.in_flight.enter();
        assert_eq!(m.in_flight.get(), 1);
        drop(g);
        assert_eq!(m.in_flight.get(), 0);
    }
}
