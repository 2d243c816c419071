//! Upstream keys for several servers: `servers`, `balance`, passive and active health, `max_conns` and its queue, tunnels.

use std::time::Duration;

use http::Uri;
use serde::Deserialize;

use super::{dur, Dur, Text, Validator};

/// `health:` on an upstream: an active check run in the background.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub path: Text,
    pub interval: Option<Dur>,
}

/// How a request picks one of the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastConn,
}

/// An active health check: `GET path` every `interval`; 2xx or 3xx is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
}

/// The validated balancing of one upstream over its servers.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceConfig {
    /// Every server, in the order written (`url:` is a list of one).
    pub servers: Vec<Uri>,
    pub policy: Policy,
    /// Failures within `fail_timeout` that take a server out; 0 = never.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// Requests in flight per server; `None` = unbounded.
    pub max_conns: Option<u32>,
    /// Requests that may wait for a free server when all are at `max_conns`.
    pub queue: u32,
    pub queue_timeout: Duration,
    pub health: Option<HealthCheck>,
    /// An upgraded connection (WebSocket) with no byte either way for this long is closed.
    pub tunnel_idle_timeout: Duration,
}

/// The raw keys of this module, as they sit on `RawUpstream`.
pub struct RawBalance<'a> {
    pub servers: &'a Option<Vec<Text>>,
    pub balance: &'a Option<Text>,
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<Dur>,
    pub max_conns: Option<u32>,
    pub queue: Option<u32>,
    pub queue_timeout: Option<Dur>,
    pub health: &'a Option<RawHealth>,
    pub tunnel_idle_timeout: Option<Dur>,
}

impl Validator<'_> {
    /// Validates the balancing keys of upstream `name`; `servers` are its
    /// already validated URLs.
    pub(super) fn balance(
        &mut self,
        name: &str,
        raw: RawBalance<'_>,
        servers: Vec<Uri>,
    ) -> Option<BalanceConfig> {
        let at = |field: &str| format!("upstreams.{name}.{field}");
        let policy = self.balance_policy(name, raw.balance)?;
        if raw.max_conns == Some(0) {
            self.err(
                at("max_conns"),
                "must be at least 1 (leave it out for no limit)",
            );
            return None;
        }
        if raw.max_conns.is_none() && (raw.queue.is_some() || raw.queue_timeout.is_some()) {
            self.err(
                at("queue"),
                "a queue waits for a server under `max_conns`; set `max_conns` too",
            );
            return None;
        }
        let fail_timeout = dur(raw.fail_timeout, Duration::from_secs(10));
        if fail_timeout.is_zero() {
            self.err(at("fail_timeout"), "must be longer than 0");
            return None;
        }
        let queue_timeout = dur(raw.queue_timeout, Duration::from_secs(10));
        if queue_timeout.is_zero() {
            self.err(at("queue_timeout"), "must be longer than 0");
            return None;
        }
        let tunnel_idle_timeout = dur(raw.tunnel_idle_timeout, Duration::from_secs(300));
        if tunnel_idle_timeout.is_zero() {
            self.err(at("tunnel_idle_timeout"), "must be longer than 0");
            return None;
        }
        let health = match raw.health {
            None => None,
            Some(h) => Some(self.health_check(name, h)?),
        };
        Some(BalanceConfig {
            servers,
            policy,
            max_fails: raw.max_fails.unwrap_or(1),
            fail_timeout,
            max_conns: raw.max_conns,
            queue: raw.queue.unwrap_or(0),
            queue_timeout,
            health,
            tunnel_idle_timeout,
        })
    }

    /// `balance`: how a request picks a server; round robin unless written.
    fn balance_policy(&mut self, name: &str, written: &Option<Text>) -> Option<Policy> {
        match written.as_ref().map(|t| t.0.as_str()) {
            None | Some("round_robin") => Some(Policy::RoundRobin),
            Some("least_conn") => Some(Policy::LeastConn),
            Some(other) => {
                self.err(
                    format!("upstreams.{name}.balance"),
                    format!("unknown balance {other:?}; use round_robin or least_conn"),
                );
                None
            }
        }
    }

    /// `health`: the path asked, and how often (an interval of 100 ms or more).
    fn health_check(&mut self, name: &str, h: &RawHealth) -> Option<HealthCheck> {
        let at = |field: &str| format!("upstreams.{name}.{field}");
        if !h.path.0.starts_with('/') {
            self.err(at("health.path"), "must start with /");
            return None;
        }
        let interval = dur(h.interval, Duration::from_secs(5));
        if interval < Duration::from_millis(100) {
            self.err(at("health.interval"), "must be at least 100ms");
            return None;
        }
        Some(HealthCheck {
            path: h.path.0.clone(),
            interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn each_bad_balancing_key_is_reported_with_its_path() {
        let table: [(&str, &str); 9] = [
            ("{ servers: [] }", "upstreams.app.servers: lists no server"),
            (
                "{ url: \"http://a\", servers: [\"http://b\"] }",
                "upstreams.app: `url` and `servers` contradict",
            ),
            (
                "{ balance: round_robin }",
                "upstreams.app: needs `url` or `servers`",
            ),
            (
                "{ servers: [\"http://a\", \"ftp://b\"] }",
                "upstreams.app.servers[1]",
            ),
            ("{ servers: [\"http://a\", \"https://b\"] }", "same scheme"),
            (
                "{ url: \"http://a\", balance: random }",
                "upstreams.app.balance: unknown balance \"random\"",
            ),
            (
                "{ url: \"http://a\", max_conns: 0 }",
                "upstreams.app.max_conns: must be at least 1",
            ),
            (
                "{ url: \"http://a\", queue: 10 }",
                "upstreams.app.queue: a queue waits",
            ),
            (
                "{ url: \"http://a\", health: { path: health } }",
                "upstreams.app.health.path: must start with /",
            ),
        ];
        for (upstream, expected) in table {
            let yaml = format!("upstreams:\n  app: {upstream}\n");
            let errs = problems(&yaml);
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected:?} not in {errs:?}"
            );
        }
        let unknown = problems("upstreams:\n  app: { url: \"http://a\", max_connections: 3 }\n");
        assert!(
            unknown.iter().any(|e| e.contains("max_connections")),
            "{unknown:?}"
        );
    }

    #[test]
    fn one_url_is_one_server_with_nginx_defaults() {
        let c = parse("upstreams:\n  app: { url: \"http://a:8080\" }\n").unwrap();
        let b = &c.upstreams[0].balance;
        assert_eq!(b.servers.len(), 1);
        assert_eq!(b.policy, Policy::RoundRobin);
        assert_eq!((b.max_fails, b.fail_timeout), (1, Duration::from_secs(10)));
        assert_eq!((b.max_conns, b.queue), (None, 0));
        assert_eq!(b.tunnel_idle_timeout, Duration::from_secs(300));
        assert!(b.health.is_none());
    }

    #[test]
    fn servers_and_their_keys_are_read() {
        let c = parse(
            "upstreams:\n  app:\n    servers: [\"http://a:1\", \"http://b:2/base\"]\n    balance: least_conn\n    max_fails: 3\n    fail_timeout: 30s\n    max_conns: 8\n    queue: 100\n    queue_timeout: 2s\n    health: { path: /healthz, interval: 2s }\n    tunnel_idle_timeout: 1m\n",
        )
        .unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.url, "http://a:1");
        let b = &u.balance;
        assert_eq!(b.servers[1], "http://b:2/base");
        assert_eq!(b.policy, Policy::LeastConn);
        assert_eq!((b.max_fails, b.fail_timeout), (3, Duration::from_secs(30)));
        assert_eq!(
            (b.max_conns, b.queue, b.queue_timeout),
            (Some(8), 100, Duration::from_secs(2))
        );
        assert_eq!(
            b.health,
            Some(HealthCheck {
                path: "/healthz".into(),
                interval: Duration::from_secs(2)
            })
        );
        assert_eq!(b.tunnel_idle_timeout, Duration::from_secs(60));
    }
}
