//! Open client connections: the total and per-address caps, the first-byte and idle timers, and their metrics.
//!
//! A connection is admitted by taking a [`Permit`] (given back when it
//! closes) or refused and closed at once. The caps are read from the
//! snapshot for each new connection, so a reload changes them live; open
//! connections are never cut by a lower cap. Only the public listeners are
//! capped: the admin API has its own listener and the fd limit keeps room
//! for it, so it answers while the public side is full.
//!
//! At `max_connections` a new connection makes room instead of being
//! refused: it displaces a connection with nothing in progress, chosen by
//! [`waiting::Waiting`] so that it falls on a flood (the address holding
//! the most, one that never completed a request first) and last on a
//! client holding one connection that has completed requests. A connection
//! with a request in progress is never displaced, so only when every open
//! connection is busy is the newcomer refused. Without this, a flood of
//! connections that say nothing would hold the public port shut until
//! `request_header_timeout` closed them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::metrics::{inc, Counter, Metrics};

mod timers;
mod waiting;
pub use timers::{watch, Closing, Watched};
use waiting::Waiting;

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: std::net::SocketAddr,
    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub proto: &'static str,
    /// The local port the client connected to, for `X-Forwarded-Port`.
    pub port: u16,
    /// The worker runtime serving the connection (1-based; 0 = the runtime
    /// `run` was called on): it picks that worker's upstream connections.
    pub worker: usize,
}

/// File descriptors kept out of the default `max_connections`: the listeners,
/// the admin API's connections, SQLite, logs, Redis.
const RESERVED_FDS: usize = 128;

/// The open public connections, in total and per client address.
pub struct Connections {
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Whether `waiting` ranks the connections now (see [`Waiting`]): read
    /// without its lock at every request's start and end, which take the
    /// lock only while it is set.
    ranking: AtomicBool,
    /// Connections with nothing in progress, the ones a newcomer may displace.
    waiting: Mutex<Waiting>,
    refused_total: Counter,
    refused_per_ip: Counter,
    closed_silent: Counter,
    closed_slow_head: Counter,
    closed_idle: Counter,
    closed_send_timeout: Counter,
    /// Displaced at the cap, by [`waiting::Stage`].
    displaced: [Counter; 2],
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionRefusal {
    /// `server.max_connections` are open, each with a request in progress.
    Full,
    /// `server.max_connections_per_ip` are open from this address.
    PerIp,
}

/// One admitted connection; dropping it frees its place.
pub struct Permit {
    connections: Arc<Connections>,
    /// The address counted against the per-IP cap; `None` when exempt.
    ip: Option<IpAddr>,
    /// Whether it holds a place in the total.
    counted: bool,
    activity: Arc<Activity>,
}

impl Connections {
    pub fn new(metrics: &Metrics) -> Arc<Connections> {
        let refused =
            |reason| metrics.counter("tollgate_connections_refused_total", &[("reason", reason)]);
        let closed =
            |reason| metrics.counter("tollgate_connections_closed_total", &[("reason", reason)]);
        Arc::new(Connections {
            open: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            ranking: AtomicBool::new(false),
            refused_total: refused("max_connections"),
            refused_per_ip: refused("max_connections_per_ip"),
            closed_silent: closed("no_request"),
            closed_slow_head: closed("request_header_timeout"),
            closed_idle: closed("idle"),
            closed_send_timeout: closed("send_timeout"),
            waiting: Mutex::new(Waiting::default()),
            displaced: ["no_request", "idle"].map(|state| {
                metrics.counter("tollgate_connections_displaced_total", &[("state", state)])
            }),
        })
    }

    /// Public connections open right now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Takes a place for a connection from `ip`, displacing a waiting
    /// connection when all `max_total` are taken, or says why there is none.
    /// `per_ip` is `None` for a peer exempt from the per-address cap.
    pub fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        max_total: usize,
        per_ip: Option<usize>,
    ) -> Result<Permit, ConnectionRefusal> {
        let mut permit = Permit {
            connections: self.clone(),
            ip: None,
            counted: false,
            activity: Activity::new(self.clone(), address_key(ip)),
        };
        // The per-address cap first: a connection it refuses displaces nobody.
        if let Some(max) = per_ip {
            let key = permit.activity.ip;
            let mut table = self.per_ip.lock();
            let n = table.entry(key).or_insert(0);
            if *n >= max {
                drop(table);
                inc(&self.refused_per_ip);
                return Err(ConnectionRefusal::PerIp);
            }
            *n += 1;
            permit.ip = Some(key);
        }
        let mut waiting = self.waiting.lock();
        // Before any displacement: a reload may have lowered the cap.
        if waiting.admitting(max_total) {
            // Set before the ranking reads which connections are busy: a
            // request starting or ending beside it then either sees the flag
            // and waits for the lock, or is seen (see `Activity::request`).
            self.ranking.store(true, Ordering::SeqCst);
            waiting.start();
        }
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_total).then_some(n + 1)
            });
        if taken.is_err() && !self.displace(&mut waiting) {
            drop(waiting);
            inc(&self.refused_total);
            return Err(ConnectionRefusal::Full);
        }
        permit.counted = true;
        waiting.opened(&permit.activity);
        Ok(permit)
    }

    /// Frees the place of the connection [`Waiting::victim`] names for the
    /// caller to take: its permit no longer counts, and it is told to
    /// close. False when every connection is busy.
    fn displace(&self, waiting: &mut Waiting) -> bool {
        let Some((victim, stage)) = waiting.victim() else {
            return false;
        };
        victim.released.store(true, Ordering::Relaxed);
        victim.displaced.cancel();
        inc(&self.displaced[stage as usize]);
        true
    }

    pub fn count_closed_silent(&self) {
        inc(&self.closed_silent);
    }

    pub fn count_closed_slow_head(&self) {
        inc(&self.closed_slow_head);
    }

    pub fn count_closed_idle(&self) {
        inc(&self.closed_idle);
    }
}

impl Permit {
    /// The connection's timers and its place among the waiting.
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let released = {
            let mut waiting = self.connections.waiting.lock();
            // Only a counted permit was opened there (a refused one never was).
            if self.counted {
                waiting.closed(&self.activity);
            }
            if waiting.should_stop() {
                self.connections.ranking.store(false, Ordering::SeqCst);
                waiting.stop();
            }
            self.activity.closed.store(true, Ordering::Relaxed);
            self.activity.released.load(Ordering::Relaxed)
        };
        if let Some(ip) = self.ip {
            let mut table = self.connections.per_ip.lock();
            if let Some(n) = table.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    // The table holds only addresses with a connection open,
                    // so it is never larger than `max_connections`.
                    table.remove(&ip);
                }
            }
        }
        // A displaced connection's place went to the one that displaced it.
        if self.counted && !released {
            self.connections.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The address a per-IP cap counts: IPv4 as is, IPv6 by its /64 (one
/// subscriber's prefix; counting single addresses would let one client
/// open a connection from each of its 2^64).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// The default `server.max_connections`: half of the descriptors the process
/// may open after a reserve, because each proxied connection may hold an
/// upstream connection too.
pub fn default_max_connections() -> usize {
    (fd_limit().saturating_sub(RESERVED_FDS) / 2).max(16)
}

/// The soft RLIMIT_NOFILE, read once.
fn fd_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own and reads nothing else.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
        if ok {
            usize::try_from(rl.rlim_cur).unwrap_or(usize::MAX)
        } else {
            1024
        }
    })
}

/// Raises the soft fd limit to the hard one (as Go's runtime and nginx's
/// `worker_rlimit_nofile` do): the soft default of 1024 is a relic that
/// would cap a proxy at a few hundred clients. Call before [`default_max_connections`].
pub fn raise_fd_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read or write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                tracing::debug!("cannot raise the file descriptor limit");
            }
        }
    }
}

/// When a connection last started or finished a request, whether the
/// client has sent a byte at all, and since when a request head has been
/// arriving: what the first-byte, header and idle timers read; and its place
/// among the connections a newcomer may displace.
pub struct Activity {
    /// [`now_ms`] when it was accepted.
    started: u64,
    /// Milliseconds after `started` of the last request start or end.
    last: AtomicU64,
    busy: AtomicUsize,
    read_any: AtomicBool,
    first_byte: tokio::sync::Notify,
    /// Milliseconds after `started` of the first byte read since the last
    /// request began ([`NO_HEAD`] when none): a request head in progress.
    head_since: AtomicU64,
    /// HTTP/2: bytes between requests are frames (PING, WINDOW_UPDATE), not
    /// the start of a head, so only the idle timer applies.
    multiplexed: AtomicBool,
    connections: Arc<Connections>,
    /// The client address it counts for in [`Waiting`] (IPv6: its /64).
    ip: IpAddr,
    /// Where it is filed in [`Waiting`] (its sequence number), 0 when not.
    /// This, `closed` and `released` change only under the `waiting` lock.
    filed: AtomicU64,
    /// Requests ended on it; changes only while it is not filed.
    completed: AtomicU64,
    /// Its permit was dropped: never filed again.
    closed: AtomicBool,
    /// Displaced: its place was given to a newcomer.
    released: AtomicBool,
    displaced: CancellationToken,
    /// A request has started on it.
    served: AtomicBool,
}

/// Milliseconds on the kernel's coarse monotonic clock: what a connection's
/// timers count in, read at every request's start and end. The coarse clock
/// is read without the TSC and lags by at most a tick (a few ms: the timers
/// sleep again for what is left), and whole milliseconds need no `Duration`
/// arithmetic; `Instant::elapsed` and its conversion were ~200 instructions
/// a read (callgrind).
fn now_ms() -> u64 {
    #[cfg(target_os = "linux")]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
    #[cfg(not(target_os = "linux"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the struct we own.
    unsafe { libc::clock_gettime(CLOCK, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1000 + nanos / 1_000_000
}

/// `head_since` when no request head is in progress.
const NO_HEAD: u64 = u64::MAX;

/// How an HTTP/2 connection starts (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl Activity {
    fn new(connections: Arc<Connections>, ip: IpAddr) -> Arc<Activity> {
        Arc::new(Activity {
            started: now_ms(),
            last: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            read_any: AtomicBool::new(false),
            first_byte: tokio::sync::Notify::new(),
            head_since: AtomicU64::new(NO_HEAD),
            multiplexed: AtomicBool::new(false),
            connections,
            ip,
            filed: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            displaced: CancellationToken::new(),
            served: AtomicBool::new(false),
        })
    }

    fn elapsed_ms(&self) -> u64 {
        now_ms().saturating_sub(self.started).min(NO_HEAD - 1)
    }

    /// The time since `mark` (an [`elapsed_ms`](Self::elapsed_ms) reading).
    fn since(&self, mark: u64) -> Duration {
        Duration::from_millis(self.elapsed_ms().saturating_sub(mark))
    }

    fn touch(&self) {
        self.last.store(self.elapsed_ms(), Ordering::Relaxed);
    }

    /// Marks a request in progress until the guard is dropped: its head has
    /// arrived, and from now on the connection cannot be displaced.
    ///
    /// Below half the cap nothing is ranked, and this is an atomic add. The
    /// ranking starts by setting `Connections::ranking` and only then reading
    /// which connections are busy, both sequentially consistent, as this adds
    /// to `busy` and only then reads the flag: so either this sees the flag and
    /// takes its connection out of the ranking under the lock, or the ranking
    /// sees it busy and never files it. (No `touch`: `idle_for` reads zero
    /// while a request is in progress, and the guard's drop touches.)
    pub fn request(self: &Arc<Self>) -> Busy {
        if self.busy.fetch_add(1, Ordering::SeqCst) == 0
            && self.connections.ranking.load(Ordering::SeqCst)
        {
            self.connections.waiting.lock().unfile(self);
        }
        self.head_since.store(NO_HEAD, Ordering::Relaxed);
        self.served.store(true, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// The connection speaks HTTP/2: no request head timer between requests.
    pub fn set_multiplexed(&self) {
        self.multiplexed.store(true, Ordering::Relaxed);
    }

    /// Bytes arrived: with no request in progress they start a request head
    /// (the timer reads `head_since` when it next wakes; see `timers::watch`).
    fn bytes_read(&self) {
        if self.busy.load(Ordering::Relaxed) == 0
            && !self.multiplexed.load(Ordering::Relaxed)
            && self.head_since.load(Ordering::Relaxed) == NO_HEAD
        {
            // The clock is read only for a head's first bytes, not for every read.
            let _ = self.head_since.compare_exchange(
                NO_HEAD,
                self.elapsed_ms(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// How long the request head in progress has been arriving, if one is.
    fn head_for(&self) -> Option<Duration> {
        let since = self.head_since.load(Ordering::Relaxed);
        if since == NO_HEAD || self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(self.since(since))
    }

    /// Resolves when a newcomer displaced this connection.
    pub fn displaced(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.displaced.cancelled()
    }

    /// Whether a request ever started on it (or is in progress now): such a
    /// connection is closed gracefully, one that never got that far at once.
    pub fn served_any(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    pub fn read_any(&self) -> bool {
        self.read_any.load(Ordering::Relaxed)
    }

    /// How long no request has been in progress (zero while one is).
    pub fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        self.since(self.last.load(Ordering::Relaxed))
    }
}

/// A request in progress on a connection (see [`Activity::request`]).
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.touch();
        // Counted before the connection can be filed: only an idle one is,
        // and it is not idle until `busy` falls to zero below.
        activity.completed.fetch_add(1, Ordering::Relaxed);
        // As in `Activity::request`: the count first, then the flag.
        if activity.busy.fetch_sub(1, Ordering::SeqCst) == 1
            && activity.connections.ranking.load(Ordering::SeqCst)
        {
            activity.connections.waiting.lock().file_idle(activity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_an_idle_connection_makes_room_and_a_busy_one_never_does() {
        let c = Connections::new(&Metrics::default());
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        let a = c.admit(ip, 2, None).unwrap();
        let b = c.admit(ip, 2, None).unwrap();
        // `b` served a request and is idle between requests; `a` sent nothing.
        drop(b.activity().request());
        let busy = a.activity().request();
        // `a` is busy now: the newcomer displaces `b`, and takes its place.
        let third = c.admit(ip, 2, None).unwrap();
        assert!(b.activity.displaced.is_cancelled());
        assert!(!a.activity.displaced.is_cancelled());
        drop(b);
        assert_eq!(c.open(), 2);
        // One that never completed a request goes first: `third` (waiting
        // since accepted) before `a` (idle since its request ended).
        drop(busy);
        let fourth = c.admit(ip, 2, None).unwrap();
        assert!(third.activity.displaced.is_cancelled());
        assert!(!a.activity.displaced.is_cancelled());
        drop(third);
        // Both busy: refused.
        let (_x, _y) = (a.activity().request(), fourth.activity().request());
        assert_eq!(c.admit(ip, 2, None).err(), Some(ConnectionRefusal::Full));
        assert_eq!(c.open(), 2);
        drop(a);
        assert_eq!(c.open(), 1);
        assert!(c.admit(ip, 2, None).is_ok());
    }

    #[test]
    fn the_per_address_cap_counts_an_ipv6_slash_64_as_one_client() {
        let c = Connections::new(&Metrics::default());
        let one: IpAddr = "2001:db8::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let _a = c.admit(one, 100, Some(1)).unwrap();
        assert_eq!(
            c.admit(same_64, 100, Some(1)).err(),
            Some(ConnectionRefusal::PerIp)
        );
        let b = c.admit(other, 100, Some(1)).unwrap();
        // A refused connection gave its total place back.
        assert_eq!(c.open(), 2);
        drop(b);
        assert!(
            c.per_ip.lock().len() == 1,
            "closed addresses leave the table"
        );
    }

    #[test]
    fn a_zero_cap_is_a_config_error_with_its_path() {
        let e = crate::config::parse(
            "server: { max_connections: 0, max_connections_per_ip: 0, idle_timeout: 5s }",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["server.max_connections", "server.max_connections_per_ip"]
        );
        let c = crate::config::parse("server: { max_connections: 10, idle_timeout: 5s }").unwrap();
        assert_eq!(c.server.max_connections, Some(10));
        assert_eq!(c.server.max_connections_per_ip, 256);
        assert_eq!(c.server.idle_timeout, Duration::from_secs(5));
    }

    #[test]
    fn the_default_cap_leaves_descriptors_for_upstreams_and_the_admin_api() {
        let n = default_max_connections();
        assert!(n >= 16);
        assert!(n * 2 + RESERVED_FDS <= fd_limit().max(16 * 2 + RESERVED_FDS));
    }
}
