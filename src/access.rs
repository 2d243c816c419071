//! The access log: one record per request, formatted and written by a thread of its own, to stdout or a file reopened on request.
//!
//! The request path only moves an [`AccessRecord`] into a bounded queue
//! (`try_send`, never a wait). When the writer falls behind — a slow disk, a
//! stalled pipe — records are dropped and counted
//! (`tollgate_access_log_dropped_total`); memory stays bounded by the queue.
//! A write that fails (a full disk) loses its batch: counted as dropped, and
//! the failure in `tollgate_access_log_write_errors_total`. With
//! `log.access_file`, the writer thread itself (re)opens the file, when
//! [`AccessLog::reopen`] asks (SIGUSR1, after logrotate moved it), so no
//! request ever waits on the file system.
//! Records hold the client's display form only (API keys shortened) and the
//! path without its query, so no secret a client sends ends up in the log.

use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;

use http::{HeaderValue, Method, Version};
use parking_lot::Mutex;

use crate::clock::SharedClock;
use crate::config::{LogFormat, RefusalLog};
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::metrics::Decision;
use crate::problem::Origin;
use crate::request_id::RequestId;

/// Records waiting for the writer; beyond this they are dropped.
pub const QUEUE: usize = 8_192;

/// Records the writer formats into one write at most, so what it holds
/// besides the queue is bounded too, however fast records arrive.
pub const BATCH: usize = 1_024;

type Sink = Box<dyn Write + Send>;

/// What the writer thread is handed: a record, or a request to say when
/// everything before it is written.
// Records are the traffic and `Flush` comes once, at shutdown: boxing the
// record to even the sizes would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Record(AccessRecord),
    Flush(SyncSender<()>),
    /// Nothing to write: a reopen was asked for, and an idle writer acts on it now.
    Wake,
}

/// Everything the log says about one request, filled in as the request goes.
#[derive(Debug, Clone)]
pub struct AccessRecord {
    pub format: LogFormat,
    /// Unix time (ns) the request head was read.
    pub time: Nanos,
    /// The request's id: the value its `X-Request-Id` carries, not a copy.
    pub request_id: RequestId,
    // The client and path are shared, not copied, with the request's audit
    // row (`app/upstream.rs`): the same text, written twice.
    /// The display form (`ip:…`, `key:3f2a9c01…`); `None` before identity ran.
    pub client: Option<Arc<str>>,
    /// The resolved client IP (the peer until identity ran).
    pub ip: IpAddr,
    pub method: Method,
    /// The path as sent, without the query; `None` where no access log line
    /// and no audit row will say it (it is not copied for nothing).
    pub path: Option<Arc<str>>,
    pub version: Version,
    pub route: Option<Arc<str>>,
    pub status: u16,
    pub decision: Decision,
    pub limiter: Option<std::sync::Arc<str>>,
    /// Seconds, on a rejection.
    pub retry_after: Option<u64>,
    pub upstream: Option<String>,
    pub upstream_ms: Option<f64>,
    /// Where the failure the answer reports came from; `None` when tollgate
    /// answered no problem (the upstream's own answers included).
    pub error_origin: Option<Origin>,
    pub duration_ms: f64,
    pub bytes_out: u64,
    pub referer: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    /// The site rule that answered or changed the request (`redirect`,
    /// `respond`, `rewrite`, `access`, `site.access`, `auth`); written only when set.
    pub rule: Option<&'static str>,
    /// The client's ASN and country, when `identity.geoip` is configured.
    pub network: Option<crate::geodb::Network>,
    /// `log.refusals` when the request began: whether a refusal may be folded.
    pub refusals: RefusalLog,
}

/// The queue to the writer thread, and what it dropped.
pub struct AccessLog {
    tx: SyncSender<Msg>,
    out: Arc<Out>,
}

/// What the request path and the writer thread share besides the queue.
struct Out {
    sink: Mutex<Sink>,
    /// `log.access_file`: what a reopen opens (`None`: stdout or a test's capture).
    /// Locked before `sink` wherever both are.
    file: Mutex<Option<PathBuf>>,
    /// Set by [`AccessLog::reopen`]; the writer reopens before its next write.
    reopen: AtomicBool,
    dropped: AtomicU64,
    write_errors: AtomicU64,
    /// Refusals counted in a summary line instead of written (`log.refusals: first`).
    folded: AtomicU64,
    /// `log.refusals: first`'s windows open now.
    windows: AtomicU64,
}

/// Opens the access log file to append to, creating it (mode 0640, as
/// logrotate's `create 0640` would) when it is missing.
///
/// Only a regular file: a symbolic link at the path is not followed
/// (`O_NOFOLLOW`), and a FIFO or a device is refused (opened without
/// blocking, so a FIFO nobody reads cannot hang the writer). Whoever may
/// write to the log's directory could otherwise plant a link there between
/// logrotate's move and the SIGUSR1, and have tollgate append to any file it
/// may write.
pub fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{} is a symbolic link; the access log is opened only as a regular file, never through a link", path.display()),
            ))
        }
        Err(e) => return Err(e),
    };
    if !file.metadata()?.file_type().is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file (a FIFO, a socket or a device); the access log is written only to a regular file", path.display()),
        ));
    }
    Ok(file)
}

impl AccessLog {
    /// To stdout, the writer's idle windows ended by `clock`.
    pub fn stdout(clock: SharedClock) -> AccessLog {
        AccessLog::new(Box::new(std::io::stdout()), QUEUE, clock)
    }

    /// Starts the writer thread; it ends when the `AccessLog` is dropped.
    /// `clock` says when `log.refusals: first`'s windows end while no record comes.
    pub fn new(sink: Sink, capacity: usize, clock: SharedClock) -> AccessLog {
        let (tx, rx) = sync_channel(capacity);
        let out = Arc::new(Out {
            sink: Mutex::new(sink),
            file: Mutex::new(None),
            reopen: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            folded: AtomicU64::new(0),
            windows: AtomicU64::new(0),
        });
        let writer = out.clone();
        let spawned = std::thread::Builder::new()
            .name("tollgate-access".into())
            .spawn(move || Writer::new(&writer, clock).run(&rx));
        if let Err(e) = spawned {
            // Requests still work; every record is then counted as dropped.
            tracing::error!(error = %e, "cannot start the access log writer");
        }
        AccessLog { tx, out }
    }

    /// Sends the log somewhere else from the next record on (tests capture it this way).
    pub fn redirect(&self, sink: Sink) {
        let mut file = self.out.file.lock();
        *file = None;
        *self.out.sink.lock() = sink;
    }

    /// Writes to `path` (appended to, created if missing) from the next
    /// record on: the writer thread opens it (`log.access_file`). Until it
    /// has, and if it cannot, records go where they went before.
    pub fn to_file(&self, path: PathBuf) {
        *self.out.file.lock() = Some(path);
        self.reopen();
    }

    /// Asks the writer to open the file again by its name before its next
    /// write (after logrotate moved it: SIGUSR1). Records written until
    /// then go to the file it had, under its new name; none is lost. Does
    /// nothing when the log goes to stdout.
    pub fn reopen(&self) {
        self.out.reopen.store(true, Ordering::Release);
        // A full queue is a busy writer: it sees the flag before its next write anyway.
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Queues a record; never waits.
    pub fn send(&self, record: AccessRecord) {
        match self.tx.try_send(Msg::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.out.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records lost: the queue was full, or their write failed.
    pub fn dropped(&self) -> u64 {
        self.out.dropped.load(Ordering::Relaxed)
    }

    /// Writes that failed (a full disk), and files that could not be (re)opened.
    pub fn write_errors(&self) -> u64 {
        self.out.write_errors.load(Ordering::Relaxed)
    }

    /// Refusals counted in a summary line instead of written on their own.
    pub fn refusals_folded(&self) -> u64 {
        self.out.folded.load(Ordering::Relaxed)
    }

    /// `log.refusals: first`'s windows open now (at most [`refusals::WINDOWS`]).
    pub fn refusal_windows(&self) -> u64 {
        self.out.windows.load(Ordering::Relaxed)
    }

    /// Waits, at most `limit`, until every record queued so far is written
    /// and every open refusal window summarized: shutdown calls it so the
    /// last requests are in the log. Blocks the thread.
    pub fn flush(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let (ack, done) = sync_channel(1);
        let mut msg = Msg::Flush(ack);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    // A writer stalled on its sink: give up at the deadline.
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    msg = back;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
        done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .is_ok()
    }
}

/// How long the writer rests after a batch that caught up with the queue.
/// Records that arrive meanwhile wait in the queue and go out together with
/// the next batch, so a busy proxy wakes this thread ~100 times a second
/// instead of once per request: measured, that was a futex wake-up and a
/// context switch per record on the request path's core. A writer that is
/// behind (a full batch) does not rest. A record reaches the log at most
/// this much later; shutdown waits for the queue ([`AccessLog::flush`]).
pub const REST: std::time::Duration = std::time::Duration::from_millis(10);

/// How often an idle writer with open refusal windows looks whether one ended.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The writer thread's state: the batch it formats, and what it remembers between batches.
struct Writer<'a> {
    out: &'a Out,
    clock: SharedClock,
    batch: String,
    times: ClfTime,
    windows: refusals::Windows,
    /// Whether the last write failed: a failing disk is reported once, not per batch.
    failing: bool,
    /// Whether a failed write left part of a record behind: the next write ends it first.
    torn: bool,
}

impl<'a> Writer<'a> {
    fn new(out: &'a Out, clock: SharedClock) -> Writer<'a> {
        Writer {
            out,
            clock,
            batch: String::with_capacity(64 * 1024),
            times: ClfTime::default(),
            windows: refusals::Windows::default(),
            failing: false,
            torn: false,
        }
    }

    fn run(mut self, rx: &Receiver<Msg>) {
        loop {
            let first = if self.windows.len() == 0 {
                rx.recv().ok()
            } else {
                match rx.recv_timeout(IDLE_CHECK) {
                    Ok(msg) => Some(msg),
                    Err(RecvTimeoutError::Timeout) => {
                        // No record came to end the windows past their end: the clock does.
                        let lines = self.end_windows(self.clock.now());
                        self.write(lines);
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            };
            let Some(first) = first else {
                return;
            };
            let mut next = Some(first);
            let mut acks = Vec::new();
            let mut records = 0;
            let mut lines = 0;
            // What is already queued goes out in one write (up to BATCH
            // records): stdout writes line by line otherwise, a syscall per record.
            while let Some(msg) = next {
                match msg {
                    Msg::Record(record) => {
                        lines += self.end_windows(record.time);
                        if self.windows.admit(&record) {
                            record.format_with(&mut self.batch, &mut self.times);
                            lines += 1;
                        } else {
                            self.out.folded.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Msg::Flush(ack) => {
                        lines += self.end_windows(Nanos::MAX);
                        acks.push(ack);
                    }
                    Msg::Wake => {}
                }
                records += 1;
                next = if records < BATCH {
                    rx.try_recv().ok()
                } else {
                    None
                };
            }
            self.write(lines);
            for ack in acks {
                let _ = ack.try_send(());
            }
            if records < BATCH {
                // Caught up: rest while the next records gather.
                std::thread::sleep(REST);
            }
        }
    }

    /// Summarizes the refusal windows over by `now` into the batch; returns the lines added.
    fn end_windows(&mut self, now: Nanos) -> u64 {
        if self.windows.next_end().is_none_or(|end| end > now) {
            return 0;
        }
        self.windows.end(now, &mut self.batch, &mut self.times)
    }

    /// Writes the batch (`lines` lines) and empties it.
    fn write(&mut self, lines: u64) {
        self.out
            .windows
            .store(self.windows.len() as u64, Ordering::Relaxed);
        if self.out.reopen.swap(false, Ordering::AcqRel) {
            self.out.open_again();
        }
        if !self.batch.is_empty() {
            let written = {
                let mut sink = self.out.sink.lock();
                write_batch(&mut *sink, &self.batch, &mut self.torn)
            };
            match written {
                Ok(()) if self.failing => {
                    self.failing = false;
                    tracing::info!("the access log is written again");
                }
                Ok(()) => {}
                Err(e) => {
                    self.out.write_errors.fetch_add(1, Ordering::Relaxed);
                    self.out.dropped.fetch_add(lines, Ordering::Relaxed);
                    if !self.failing {
                        self.failing = true;
                        // The proxy keeps serving; the lost records are counted.
                        tracing::error!(error = %e, "cannot write the access log; its records are dropped until it can");
                    }
                }
            }
        }
        // The batch buffer keeps a busy second's capacity, not a burst's.
        self.batch.clear();
        self.batch.shrink_to(64 * 1024);
    }
}

/// Writes `batch` whole. A write cut short (a full disk) leaves part of a
/// record in the file: `torn` says so, and the next batch starts with the
/// newline that ends it, so a reader finds one broken line, not two records
/// run together.
fn write_batch(sink: &mut dyn Write, batch: &str, torn: &mut bool) -> std::io::Result<()> {
    if *torn {
        sink.write_all(b"\n")?;
        *torn = false;
    }
    let mut rest = batch.as_bytes();
    while !rest.is_empty() {
        match sink.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Every record ends with a newline: cut anywhere else, one is torn.
                let done = batch.len() - rest.len();
                *torn = done > 0 && batch.as_bytes()[done - 1] != b'\n';
                return Err(e);
            }
        }
    }
    sink.flush()
}

impl Out {
    /// Opens `log.access_file` again by its name; when it cannot, the
    /// writer keeps the file it had (the records still land somewhere).
    fn open_again(&self) {
        let file = self.file.lock();
        let Some(path) = file.as_ref() else {
            return;
        };
        match open_file(path) {
            Ok(f) => *self.sink.lock() = Box::new(f),
            Err(e) => {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %path.display(), error = %e, "cannot open the access log file; writing on where it wrote before");
            }
        }
    }
}

impl AccessRecord {
    /// The path as sent, or nothing where it was not kept
    /// (`Config::keeps_request_path` says where it is).
    pub fn path(&self) -> &str {
        self.path.as_deref().unwrap_or_default()
    }

    /// One line, newline included, in the record's format.
    pub fn format_into(&self, out: &mut String) {
        self.format_with(out, &mut ClfTime::default());
    }

    /// [`format_into`](Self::format_into) with the writer's per-second time
    /// text, so a second's records format their time once.
    fn format_with(&self, out: &mut String, times: &mut ClfTime) {
        match self.format {
            LogFormat::Json => self.json_into(out),
            LogFormat::Text => self.text_into(out, times),
        }
        out.push('\n');
    }

    fn json_into(&self, out: &mut String) {
        let header = |v: &Option<HeaderValue>| {
            v.as_ref()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let mut v = serde_json::json!({
            "ts": rfc3339_millis(self.time),
            "log": "access",
            "request_id": self.request_id.as_str(),
            "client": self.client.as_deref(),
            "ip": self.ip.to_string(),
            "method": self.method.as_str(),
            "path": self.path(),
            "route": self.route.as_deref(),
            "status": self.status,
            "decision": self.decision.as_str(),
            "limiter": self.limiter.as_deref(),
            "retry_after": self.retry_after,
            "upstream": self.upstream,
            "upstream_ms": self.upstream_ms.map(round3),
            "error_origin": self.error_origin.map(Origin::as_str),
            "duration_ms": round3(self.duration_ms),
            "bytes_out": self.bytes_out,
            "proto": proto(self.version),
            "referer": header(&self.referer),
            "user_agent": header(&self.user_agent),
        });
        if let Some(rule) = self.rule {
            v["rule"] = rule.into();
        }
        if let Some(n) = &self.network {
            v["asn"] = serde_json::json!(n.asn);
            v["country"] = serde_json::json!(n.country.as_ref().map(|c| c.as_str()));
        }
        out.push_str(&v.to_string());
    }

    /// nginx's `combined` format, then the limiter's fields as `key=value`:
    /// `ip - client [time] "GET /p HTTP/1.1" status bytes "referer" "agent" rid=… route=… …`
    ///
    /// Written piece by piece rather than with `write!`: the formatter
    /// machinery was most of the writer thread's ~8,000 instructions a record.
    fn text_into(&self, out: &mut String, times: &mut ClfTime) {
        push_ip(out, self.ip);
        out.push_str(" - ");
        out.push_str(self.client.as_deref().unwrap_or("-"));
        out.push_str(" [");
        out.push_str(times.of(self.time));
        out.push_str("] \"");
        escaped(out, self.method.as_str());
        out.push(' ');
        escaped(out, self.path());
        out.push(' ');
        out.push_str(proto(self.version));
        out.push_str("\" ");
        push_u64(out, u64::from(self.status));
        out.push(' ');
        push_u64(out, self.bytes_out);
        out.push_str(" \"");
        header_or_dash(out, &self.referer);
        out.push_str("\" \"");
        header_or_dash(out, &self.user_agent);
        out.push_str("\" rid=");
        out.push_str(self.request_id.as_str());
        out.push_str(" route=");
        out.push_str(self.route.as_deref().unwrap_or("-"));
        out.push_str(" decision=");
        out.push_str(self.decision.as_str());
        out.push_str(" limiter=");
        out.push_str(self.limiter.as_deref().unwrap_or("-"));
        out.push_str(" retry_after=");
        match self.retry_after {
            Some(s) => push_u64(out, s),
            None => out.push('-'),
        }
        out.push_str(" upstream=");
        out.push_str(self.upstream.as_deref().unwrap_or("-"));
        out.push_str(" upstream_ms=");
        match self.upstream_ms {
            Some(ms) => push_millis(out, ms),
            None => out.push('-'),
        }
        out.push_str(" duration_ms=");
        push_millis(out, self.duration_ms);
        out.push_str(" error_origin=");
        out.push_str(self.error_origin.map_or("-", Origin::as_str));
        if let Some(rule) = self.rule {
            out.push_str(" rule=");
            out.push_str(rule);
        }
        if let Some(n) = &self.network {
            out.push_str(" asn=");
            match n.asn {
                Some(asn) => push_u64(out, u64::from(asn)),
                None => out.push('-'),
            }
            out.push_str(" country=");
            out.push_str(n.country.as_ref().map_or("-", |c| c.as_str()));
        }
    }
}

/// Decimal digits of `n`, as `Display` writes them.
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Zero-padded to two digits (`n` < 100).
fn push_2(out: &mut String, n: u64) {
    out.push(char::from(b'0' + (n / 10 % 10) as u8));
    out.push(char::from(b'0' + (n % 10) as u8));
}

/// Milliseconds with three decimals, like `{:.3}` (which rounds the exact
/// binary value, where this rounds `ms × 1000`: they can differ on a tie).
fn push_millis(out: &mut String, ms: f64) {
    if !(0.0..1e15).contains(&ms) {
        let _ = write!(out, "{ms:.3}");
        return;
    }
    let thousandths = (ms * 1000.0).round() as u64;
    push_u64(out, thousandths / 1000);
    out.push('.');
    let frac = thousandths % 1000;
    out.push(char::from(b'0' + (frac / 100) as u8));
    push_2(out, frac % 100);
}

fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_u64(out, u64::from(octet));
            }
        }
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}

fn round3(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

pub fn proto(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// `2026-11-30T10:05:19.123Z`
pub fn rfc3339_millis(ns: Nanos) -> String {
    let mut s = crate::clock::iso8601(ns / NANOS_PER_SEC);
    s.pop(); // the `Z`
    let _ = write!(s, ".{:03}Z", ns % NANOS_PER_SEC / 1_000_000);
    s
}

/// The text time of the last second a record was written in: records come
/// in thousands per second, and rendering the date (through humantime's
/// formatter) was ~500 instructions a record (callgrind, `bench/instructions.py`).
#[derive(Default)]
struct ClfTime {
    secs: Option<u64>,
    text: String,
}

impl ClfTime {
    fn of(&mut self, ns: Nanos) -> &str {
        let secs = ns / NANOS_PER_SEC;
        if self.secs != Some(secs) {
            self.secs = Some(secs);
            self.text.clear();
            push_clf_time(&mut self.text, ns);
        }
        &self.text
    }
}

/// nginx's `$time_local` in UTC: `30/Nov/2026:10:05:19 +0000`, rearranged
/// from the ISO 8601 form (`2026-11-30T10:05:19Z`).
fn push_clf_time(out: &mut String, ns: Nanos) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let iso = crate::clock::iso8601_bytes(ns / NANOS_PER_SEC);
    let digits = |r: std::ops::Range<usize>| std::str::from_utf8(&iso[r]).unwrap_or("00");
    let month =
        usize::from(iso[5].wrapping_sub(b'0')) * 10 + usize::from(iso[6].wrapping_sub(b'0'));
    out.push_str(digits(8..10));
    out.push('/');
    out.push_str(MONTHS[month.saturating_sub(1) % 12]);
    out.push('/');
    out.push_str(digits(0..4));
    out.push(':');
    out.push_str(digits(11..19));
    out.push_str(" +0000");
}

/// Like nginx: `"`, `\`, control and non-ASCII bytes as `\xHH`, so a client
/// cannot end a field or forge a line.
fn escaped_bytes(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(b as char);
        }
    }
}

fn escaped(out: &mut String, s: &str) {
    escaped_bytes(out, s.as_bytes());
}

fn header_or_dash(out: &mut String, v: &Option<HeaderValue>) {
    match v {
        Some(v) => escaped_bytes(out, v.as_bytes()),
        None => out.push('-'),
    }
}

mod refusals;

#[cfg(test)]
mod tests;
