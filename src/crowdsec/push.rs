//! tollgate's own bans on their way to the Local API: a bounded queue the request path fills without waiting, and the alerts (each with its decision) that one task sends as a CrowdSec machine.

use std::collections::VecDeque;
use std::time::Duration;

use ipnet::IpNet;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::limiter::{Nanos, NANOS_PER_SEC};

/// One ban tollgate started, as CrowdSec will hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnBan {
    /// An address (`Ip`) or, for an IPv6 client counted by prefix, its network (`Range`).
    pub target: IpNet,
    /// The limiter that banned: the alert's scenario is `tollgate/<limiter>`.
    pub limiter: String,
    pub duration: Duration,
    /// When the ban started (Unix ns).
    pub at: Nanos,
}

impl OwnBan {
    /// `Ip` for a single address, `Range` for a network.
    fn scope_and_value(&self) -> (&'static str, String) {
        if self.target.prefix_len() == self.target.max_prefix_len() {
            ("Ip", self.target.addr().to_string())
        } else {
            ("Range", self.target.to_string())
        }
    }

    /// The alert `POST /v1/alerts` takes: every field CrowdSec 1.4 requires,
    /// its decision with origin `crowdsec` (so `cscli decisions list` shows it
    /// without `--all`) and the scenario naming tollgate's limiter.
    pub fn alert(&self) -> Value {
        let (scope, value) = self.scope_and_value();
        let at = crate::clock::iso8601(self.at / NANOS_PER_SEC);
        let scenario = format!("tollgate/{}", self.limiter);
        let mut source = json!({"scope": scope, "value": value});
        if scope == "Ip" {
            source["ip"] = json!(value);
        } else {
            source["range"] = json!(value);
        }
        json!({
            "scenario": scenario,
            "scenario_hash": "",
            "scenario_version": "",
            "message": format!("tollgate banned {scope} {value} (limiter {}) for {}s", self.limiter, self.duration.as_secs()),
            "events_count": 1,
            "start_at": at,
            "stop_at": at,
            "capacity": 0,
            "leakspeed": "0",
            "simulated": false,
            "events": [],
            "source": source,
            "decisions": [{
                "origin": "crowdsec",
                "type": "ban",
                "scope": scope,
                "value": value,
                "duration": format!("{}s", self.duration.as_secs().max(1)),
                "scenario": scenario,
            }],
        })
    }
}

/// Bans waiting to be pushed, at most `max`.
pub struct Queue {
    waiting: Mutex<VecDeque<OwnBan>>,
    max: usize,
    pub wake: tokio::sync::Notify,
}

impl Queue {
    pub fn new(max: usize) -> Queue {
        Queue {
            waiting: Mutex::new(VecDeque::new()),
            max,
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Queues `ban`; `false` (dropped) when the queue is full.
    pub fn offer(&self, ban: OwnBan) -> bool {
        let mut waiting = self.waiting.lock();
        if waiting.len() >= self.max {
            return false;
        }
        waiting.push_back(ban);
        drop(waiting);
        self.wake.notify_one();
        true
    }

    /// Up to `n` bans from the front, left in the queue until [`Queue::sent`].
    pub fn peek(&self, n: usize) -> Vec<OwnBan> {
        self.waiting.lock().iter().take(n).cloned().collect()
    }

    /// The first `n` are in the Local API now.
    pub fn sent(&self, n: usize) {
        let mut waiting = self.waiting.lock();
        let n = n.min(waiting.len());
        waiting.drain(..n);
    }

    pub fn len(&self) -> usize {
        self.waiting.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_prefix_is_pushed_as_a_range_and_an_address_as_an_ip() {
        let ban = |t: &str| OwnBan {
            target: t.parse().unwrap(),
            limiter: "login".into(),
            duration: Duration::from_secs(3600),
            at: 1_767_225_600 * NANOS_PER_SEC,
        };
        let v4 = ban("203.0.113.9/32").alert();
        assert_eq!(v4["source"]["scope"], "Ip");
        assert_eq!(v4["decisions"][0]["value"], "203.0.113.9");
        assert_eq!(v4["decisions"][0]["duration"], "3600s");
        assert_eq!(v4["scenario"], "tollgate/login");
        let v6 = ban("2001:db8:1:2::/64").alert();
        assert_eq!(v6["decisions"][0]["scope"], "Range");
        assert_eq!(v6["decisions"][0]["value"], "2001:db8:1:2::/64");
    }

    #[test]
    fn a_full_queue_drops_and_a_sent_batch_leaves_it() {
        let q = Queue::new(2);
        let ban = OwnBan {
            target: "192.0.2.1/32".parse().unwrap(),
            limiter: "l".into(),
            duration: Duration::from_secs(60),
            at: 0,
        };
        assert!(q.offer(ban.clone()) && q.offer(ban.clone()));
        assert!(!q.offer(ban));
        assert_eq!(q.peek(10).len(), 2);
        q.sent(1);
        assert_eq!(q.len(), 1);
    }
}
