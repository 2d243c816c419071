//! `log.refusals: first`: under a flood, a client's first refusal by a limiter is written in full and the rest of its window folded into one summary line.
//!
//! A client hammering a limited route is refused thousands of times a
//! minute; with `each` every refusal is an access record, and the log grows
//! with what the client chooses to send. With `first`, the writer thread
//! opens a *window* at a client's first refusal (per client, route, limiter
//! and decision) and writes that record as always; the refusals after it
//! within the window are only counted. When the window ends — its
//! `Retry-After`, at least [`SHORTEST`] and at most [`LONGEST`] — one
//! summary line says who was refused, by what, how often and until when;
//! a refusal after that opens a new window. A window with no refusal besides
//! its first writes no summary, so a client refused once reads as under `each`.
//!
//! Bounded: at most [`WINDOWS`] windows are open; when that many are, a
//! client without one has its refusals written in full, as under `each`
//! (nothing is lost, the log just is not folded for it), and
//! `tollgate_access_log_refusal_windows` shows the table is full. Everything
//! here runs on the writer thread, off the request path, on the records'
//! own times (the injected clock), so a test decides when a window ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::{push_ip, push_u64, rfc3339_millis, AccessRecord, ClfTime};
use crate::config::{LogFormat, RefusalLog};
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::metrics::Decision;

/// Windows open at most; beyond them refusals are written in full.
pub const WINDOWS: usize = 16_384;
/// The shortest window, for a `Retry-After` under a second (or none).
pub const SHORTEST: Nanos = NANOS_PER_SEC;
/// The longest window: a ban for an hour still gets a summary a minute.
pub const LONGEST: Nanos = 60 * NANOS_PER_SEC;

/// Who was refused by what: a window is per client, route, limiter and decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    client: Arc<str>,
    route: Option<Arc<str>>,
    limiter: Option<Arc<str>>,
    decision: Decision,
}

/// An open window: what its summary line says.
#[derive(Debug)]
struct Window {
    first: Nanos,
    last: Nanos,
    /// Refusals counted here instead of written (the first is not among them).
    folded: u64,
    ip: IpAddr,
    status: u16,
    format: LogFormat,
}

/// The open windows, and when each ends.
#[derive(Debug, Default)]
pub struct Windows {
    open: HashMap<Key, Window>,
    /// The windows by their end, earliest first: ending them never scans the table.
    ends: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Which key each entry of `ends` is (a sequence number keeps the heap's entries apart).
    keys: HashMap<u64, Key>,
    next: u64,
}

impl Windows {
    /// Whether `record` is written: `false` when it was folded into its
    /// client's open window. Opens a window at a client's first refusal.
    pub fn admit(&mut self, record: &AccessRecord) -> bool {
        if record.refusals != RefusalLog::First
            || !matches!(record.decision, Decision::Rejected | Decision::Banned)
        {
            return true;
        }
        let Some(client) = &record.client else {
            return true;
        };
        let key = Key {
            client: client.clone(),
            route: record.route.clone(),
            limiter: record.limiter.clone(),
            decision: record.decision,
        };
        if let Some(window) = self.open.get_mut(&key) {
            window.folded += 1;
            window.last = window.last.max(record.time);
            return false;
        }
        if self.open.len() >= WINDOWS {
            return true;
        }
        let span = record
            .retry_after
            .map_or(SHORTEST, |s| s.saturating_mul(NANOS_PER_SEC))
            .clamp(SHORTEST, LONGEST);
        let ends = record.time.saturating_add(span);
        let seq = self.next;
        self.next += 1;
        self.ends.push(Reverse((ends, seq)));
        self.keys.insert(seq, key.clone());
        self.open.insert(
            key,
            Window {
                first: record.time,
                last: record.time,
                folded: 0,
                ip: record.ip,
                status: record.status,
                format: record.format,
            },
        );
        true
    }

    /// Ends the windows over by `now` (all of them with `Nanos::MAX`),
    /// writing a summary line into `out` for each that folded a refusal.
    /// Returns the lines written.
    pub fn end(&mut self, now: Nanos, out: &mut String, times: &mut ClfTime) -> u64 {
        let mut lines = 0;
        while let Some(&Reverse((ends, seq))) = self.ends.peek() {
            if ends > now {
                break;
            }
            self.ends.pop();
            let Some(key) = self.keys.remove(&seq) else {
                continue;
            };
            if let Some(window) = self.open.remove(&key) {
                if window.folded > 0 {
                    lines += 1;
                    summary(&key, &window, out, times);
                }
            }
        }
        lines
    }

    /// When the earliest open window ends (`None`: none is open).
    pub fn next_end(&self) -> Option<Nanos> {
        self.ends.peek().map(|Reverse((ends, _))| *ends)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }
}

/// One line for a window: its first refusal's time, the client, what
/// refused it, and `refusals` — how many there were, the first included.
fn summary(key: &Key, w: &Window, out: &mut String, times: &mut ClfTime) {
    let refusals = w.folded + 1;
    match w.format {
        LogFormat::Json => {
            let v = serde_json::json!({
                "ts": rfc3339_millis(w.first),
                "log": "refusals",
                "client": &*key.client,
                "ip": w.ip.to_string(),
                "route": key.route.as_deref(),
                "status": w.status,
                "decision": key.decision.as_str(),
                "limiter": key.limiter.as_deref(),
                "refusals": refusals,
                "last": rfc3339_millis(w.last),
            });
            out.push_str(&v.to_string());
        }
        LogFormat::Text => {
            // The access line's shape, so a reader that splits those splits
            // this: no request (`"-"`), no bytes, then `log=refusals` and the counts.
            push_ip(out, w.ip);
            out.push_str(" - ");
            out.push_str(&key.client);
            out.push_str(" [");
            out.push_str(times.of(w.first));
            out.push_str("] \"-\" ");
            push_u64(out, u64::from(w.status));
            out.push_str(" 0 \"-\" \"-\" log=refusals route=");
            out.push_str(key.route.as_deref().unwrap_or("-"));
            out.push_str(" decision=");
            out.push_str(key.decision.as_str());
            out.push_str(" limiter=");
            out.push_str(key.limiter.as_deref().unwrap_or("-"));
            out.push_str(" refusals=");
            push_u64(out, refusals);
            out.push_str(" last=");
            out.push_str(&rfc3339_millis(w.last));
        }
    }
    out.push('\n');
}
