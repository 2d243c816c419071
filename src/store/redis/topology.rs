//! Where the Redis store's commands go — one node, the primary Sentinel names, or a Redis Cluster — and what each node's health is.
//!
//! The store above sees one [`RedisConnection`] whatever the topology: a connection
//! manager to one node (`store.url`, or the primary a sentinel named), or
//! the `redis` crate's cluster connection, which follows `MOVED`/`ASK` and
//! refreshes its slot map by itself. Finding the primary again after a
//! Sentinel failover, and reading the cluster's nodes for `/readyz` and
//! `/metrics`, happen here, from the store's background probe, never on a
//! request's path.

use std::time::Duration;

use ::redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use ::redis::cluster::{ClusterClient, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisFuture, Value};

use crate::config::RedisTopology;
use crate::store::StoreError;

/// At most this many nodes are reported (status and metrics stay bounded
/// whatever a cluster announces).
pub const MAX_REPORTED_NODES: usize = 64;

/// How the store reaches Redis, fixed at start.
pub(super) enum Link {
    // Clients are boxed: each holds whole connection infos (and TLS settings).
    Node(Box<::redis::Client>),
    Sentinel {
        master: String,
        sentinels: Vec<ConnectionInfo>,
    },
    Cluster {
        client: Box<ClusterClient>,
        /// The first seed's settings (TLS, credentials): what a connection
        /// of its own to one node is made with (see [`Link::dial`]).
        seed: Box<ConnectionInfo>,
        /// Every seed as `host:port`: whom the ban list asks for the nodes
        /// before any probe has read them (see [`Link::seed_nodes`]).
        seeds: Vec<String>,
    },
}

/// One connection, whatever the topology: cheap to clone, shared by every request.
#[derive(Clone)]
pub(super) enum RedisConnection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

/// One node as the last probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    /// `host:port`.
    pub addr: String,
    /// `primary`, `replica` or `sentinel`.
    pub role: &'static str,
    pub healthy: bool,
    /// A cluster primary's slot ranges, inclusive (empty otherwise).
    pub slots: Vec<(u16, u16)>,
    /// A cluster primary taking slots over in a migration (`[slot-<-id]`):
    /// some of their keys are here already, before it serves them.
    pub importing: bool,
    /// A cluster primary's own circuit breaker: `Some(true)` while open;
    /// `None` for nodes without one (sentinels, replicas, Sentinel's primary,
    /// which the store-wide breaker covers).
    pub breaker_open: Option<bool>,
}

impl Link {
    pub(super) fn open(topology: &RedisTopology, timeout: Duration) -> Result<Link, StoreError> {
        match topology {
            RedisTopology::Node(url) => Ok(Link::Node(Box::new(
                ::redis::Client::open(url.as_str()).map_err(super::failed)?,
            ))),
            RedisTopology::Sentinel { master, nodes } => Ok(Link::Sentinel {
                master: master.clone(),
                sentinels: nodes
                    .iter()
                    .map(|u| u.as_str().into_connection_info())
                    .collect::<Result<_, _>>()
                    .map_err(super::failed)?,
            }),
            RedisTopology::Cluster(seeds) => {
                let seed = seeds
                    .first()
                    .map(String::as_str)
                    .unwrap_or_default()
                    .into_connection_info()
                    .map_err(super::failed)?;
                // Retries are quick and few: `store.timeout` bounds each call
                // anyway, and a slot map being refreshed answers in milliseconds.
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .retries(4)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .connection_timeout(background(timeout))
                    .response_timeout(background(timeout))
                    .build()
                    .map_err(super::failed)?;
                let seeds = seeds
                    .iter()
                    .map(|s| s.as_str().into_connection_info().map(|i| addr_text(i.addr())))
                    .collect::<Result<_, _>>()
                    .map_err(super::failed)?;
                Ok(Link::Cluster {
                    client: Box::new(client),
                    seed: Box::new(seed),
                    seeds,
                })
            }
        }
    }

    /// The connection requests use until a probe finds a better one: lazy,
    /// so opening the store never waits for Redis. A Sentinel topology has
    /// no primary before the first discovery: `None` until then.
    pub(super) fn first(&self, timeout: Duration) -> Result<Option<RedisConnection>, StoreError> {
        match self {
            Link::Node(client) => Ok(Some(RedisConnection::Node(manager(client, timeout)?))),
            Link::Sentinel { .. } => Ok(None),
            Link::Cluster { client, .. } => Ok(Some(RedisConnection::Cluster(
                client.get_pending_async_connection_with_config(cluster_config(timeout)),
            ))),
        }
    }

    /// A fresh connection that has answered (the probe's), with what it
    /// saw of the nodes. Sentinel: asks the sentinels for the primary,
    /// then checks that it says it is one (`ROLE`), so a demoted primary is
    /// never written to.
    /// A cluster is re-read through `current` (the connection requests
    /// use) when it answers, not through a fresh one to every node; `known`
    /// are the nodes (`host:port`) to ask when a random one does not answer.
    pub(super) async fn probe(
        &self,
        current: Option<&RedisConnection>,
        known: &[String],
        timeout: Duration,
    ) -> (Option<RedisConnection>, Vec<NodeHealth>) {
        match self {
            Link::Node(client) => {
                let Ok(mut con) = manager(client, timeout) else {
                    return (None, Vec::new());
                };
                let pong: ::redis::RedisResult<String> =
                    ::redis::cmd("PING").query_async(&mut con).await;
                (pong.ok().map(|_| RedisConnection::Node(con)), Vec::new())
            }
            Link::Sentinel { master, sentinels } => {
                sentinel_probe(master, sentinels, timeout).await
            }
            Link::Cluster { client, .. } => {
                // The connection in use reconnects and re-reads the slot map
                // by itself: a fresh one (connecting to every node again, on
                // the first requests) only when it does not answer.
                if let Some(RedisConnection::Cluster(con)) = current {
                    let mut con = con.clone();
                    if let Ok(nodes) = self.cluster_nodes(&mut con, known, timeout).await {
                        return (Some(RedisConnection::Cluster(con)), nodes);
                    }
                }
                let Ok(mut con) = client
                    .get_async_connection_with_config(cluster_config(timeout))
                    .await
                else {
                    return (None, Vec::new());
                };
                match self.cluster_nodes(&mut con, known, timeout).await {
                    Ok(nodes) => (Some(RedisConnection::Cluster(con)), nodes),
                    Err(_) => (None, Vec::new()),
                }
            }
        }
    }

    /// Whether a healthy store still re-checks its topology every probe
    /// interval (a Sentinel failover may change the primary without any
    /// error reaching a request; a cluster's node list feeds `/readyz`).
    pub(super) fn watched(&self) -> bool {
        !matches!(self, Link::Node(_))
    }

    /// `node`, `sentinel` or `cluster`.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Link::Node(_) => "node",
            Link::Sentinel { .. } => "sentinel",
            Link::Cluster { .. } => "cluster",
        }
    }
}

/// Background (re)connections neither give up on a slow link nor hang;
/// `store.timeout` bounds every request on its own.
fn background(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(1))
}

fn cluster_config(timeout: Duration) -> ClusterConfig {
    ClusterConfig::new()
        .set_connection_timeout(background(timeout))
        .set_response_timeout(background(timeout))
}

/// A connection manager that connects on first use and reconnects on I/O errors.
fn manager(client: &::redis::Client, timeout: Duration) -> Result<ConnectionManager, StoreError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(background(timeout)))
        .set_response_timeout(Some(background(timeout)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(super::failed)
}

/// Asks each sentinel in turn for the primary; the first whose answer is a
/// node that says `ROLE` master wins. Every sentinel is reported healthy
/// when it answered.
async fn sentinel_probe(
    master: &str,
    sentinels: &[ConnectionInfo],
    timeout: Duration,
) -> (Option<RedisConnection>, Vec<NodeHealth>) {
    let mut nodes = Vec::new();
    let mut found = None;
    for info in sentinels {
        let asked = ask_sentinel(info, master, timeout).await;
        nodes.push(NodeHealth {
            addr: addr_text(info.addr()),
            role: "sentinel",
            healthy: asked.is_ok(),
            slots: Vec::new(),
            importing: false,
            breaker_open: None,
        });
        let Ok(Some((host, port))) = asked else {
            continue;
        };
        if found.is_some() {
            continue;
        }
        let primary = info.clone().set_addr(with_host(info.addr(), host, port));
        let addr = addr_text(primary.addr());
        let verified = match ::redis::Client::open(primary) {
            Ok(client) => verify_primary(&client, timeout).await,
            Err(_) => None,
        };
        nodes.push(NodeHealth {
            addr,
            role: "primary",
            healthy: verified.is_some(),
            slots: Vec::new(),
            importing: false,
            breaker_open: None,
        });
        found = verified.map(RedisConnection::Node);
    }
    (found, nodes)
}

/// `SENTINEL get-master-addr-by-name`: `Ok(None)` when the sentinel knows no such master.
async fn ask_sentinel(
    info: &ConnectionInfo,
    master: &str,
    timeout: Duration,
) -> Result<Option<(String, u16)>, ()> {
    let ask = async {
        let client = ::redis::Client::open(info.clone()).ok()?;
        let mut con = client.get_multiplexed_async_connection().await.ok()?;
        let reply: Option<(String, u16)> = ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async(&mut con)
            .await
            .ok()?;
        Some(reply)
    };
    match tokio::time::timeout(background(timeout), ask).await {
        Ok(Some(reply)) => Ok(reply),
        _ => Err(()),
    }
}

/// A manager to the node once it says it is a primary.
async fn verify_primary(client: &::redis::Client, timeout: Duration) -> Option<ConnectionManager> {
    let mut con = manager(client, timeout).ok()?;
    let check = async {
        let role: Vec<Value> = ::redis::cmd("ROLE").query_async(&mut con).await.ok()?;
        match role.first() {
            Some(Value::BulkString(b)) if b == b"master" => Some(()),
            Some(Value::SimpleString(s)) if s == "master" => Some(()),
            _ => None,
        }
    };
    tokio::time::timeout(background(timeout), check)
        .await
        .ok()
        .flatten()?;
    Some(con)
}

fn with_host(addr: &ConnectionAddr, host: String, port: u16) -> ConnectionAddr {
    match addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    }
}

fn addr_text(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => "?".to_string(),
    }
}

impl Link {
    /// The cluster's nodes as one of them sees them (`CLUSTER NODES`): a
    /// random node first, on the connection requests use, then each of
    /// `known` (`host:port`) in turn on a connection of its own, so that a
    /// dead primary picked at random does not blind the probe.
    pub(super) async fn cluster_nodes(
        &self,
        con: &mut ClusterConnection,
        known: &[String],
        timeout: Duration,
    ) -> ::redis::RedisResult<Vec<NodeHealth>> {
        let cmd = ::redis::cmd("CLUSTER").arg("NODES").clone();
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let last = match con.route_command(cmd, random).await {
            Ok(reply) => return read_nodes(reply),
            Err(e) => e,
        };
        self.ask_each(known, timeout).await.map_err(|e| e.unwrap_or(last))
    }

    /// The cluster's nodes as the first configured seed that answers sees
    /// them, each asked on a connection of its own with the background
    /// timeouts (at least 1 s to connect, 1 s to answer), one after another.
    /// For a store that has not read the nodes yet: its cluster connection
    /// is still connecting to every seed (and waits for the slowest, up to
    /// that same second), so a random node asked through it cannot answer
    /// within `store.timeout`.
    pub(super) async fn seed_nodes(
        &self,
        timeout: Duration,
    ) -> ::redis::RedisResult<Vec<NodeHealth>> {
        let Link::Cluster { seeds, .. } = self else {
            return Ok(Vec::new());
        };
        self.ask_each(seeds, timeout).await.map_err(|e| {
            e.unwrap_or_else(|| (::redis::ErrorKind::Client, "no seed").into())
        })
    }

    /// `CLUSTER NODES` of each of `addrs` in turn until one answers; the
    /// last error otherwise (`None` when there was no one to ask).
    async fn ask_each(
        &self,
        addrs: &[String],
        timeout: Duration,
    ) -> Result<Vec<NodeHealth>, Option<::redis::RedisError>> {
        let cmd = ::redis::cmd("CLUSTER").arg("NODES").clone();
        let mut last = None;
        for addr in addrs {
            let asked = async { cmd.query_async(&mut self.dial(addr, timeout).await?).await };
            match asked.await.and_then(read_nodes) {
                Ok(nodes) => return Ok(nodes),
                Err(e) => last = Some(e),
            }
        }
        Err(last)
    }

    /// A connection of its own to one cluster node (`host:port`), made with
    /// the first seed's settings, for a command that must reach that node
    /// (a breaker's `PING`, the ban list's `SCAN`, `CLUSTER NODES` when a
    /// random node does not answer). Not through the cluster connection: for
    /// an address it holds no live connection to (a dead primary, one it is
    /// still connecting to, one its slot map does not name), it fails with
    /// `ClusterConnectionNotFound`, and redis-rs answers that error by
    /// dropping every connection and reconnecting from the seeds, holding
    /// every request meanwhile. A breaker probe that pinged a dead primary
    /// through it made each live primary accept about ten new connections a
    /// second (`tests/cluster_breaker.rs` counts them now).
    pub(super) async fn dial(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> ::redis::RedisResult<MultiplexedConnection> {
        let Link::Cluster { seed, .. } = self else {
            return Err((::redis::ErrorKind::Client, "not a cluster").into());
        };
        let Some((host, Ok(port))) = addr.rsplit_once(':').map(|(h, p)| (h, p.parse())) else {
            return Err((::redis::ErrorKind::Client, "not host:port").into());
        };
        let info = (**seed)
            .clone()
            .set_addr(with_host(seed.addr(), host.to_string(), port));
        let config = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(background(timeout)))
            .set_response_timeout(Some(background(timeout)));
        ::redis::Client::open(info)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
}

fn read_nodes(reply: Value) -> ::redis::RedisResult<Vec<NodeHealth>> {
    let text: String = ::redis::from_redis_value(reply)?;
    Ok(parse_cluster_nodes(&text))
}

/// `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slots…>`:
/// a node is healthy unless flagged `fail`/`fail?`/`noaddr` or its link is down.
pub(super) fn parse_cluster_nodes(text: &str) -> Vec<NodeHealth> {
    let mut nodes: Vec<NodeHealth> = text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags, link) = (*f.get(1)?, *f.get(2)?, *f.get(7)?);
            let addr = addr.split(['@', ',']).next()?.to_string();
            let flags: Vec<&str> = flags.split(',').collect();
            let role = if flags.contains(&"master") {
                "primary"
            } else {
                "replica"
            };
            let failing = flags
                .iter()
                .any(|f| matches!(*f, "fail" | "fail?" | "noaddr" | "handshake"));
            let ranges = if role == "primary" {
                &f[8.min(f.len())..]
            } else {
                &[]
            };
            Some(NodeHealth {
                addr,
                role,
                healthy: !failing && link == "connected",
                slots: ranges.iter().filter_map(|r| slot_range(r)).collect(),
                importing: ranges.iter().any(|r| r.contains("-<-")),
                breaker_open: None,
            })
        })
        .collect();
    nodes.sort_by(|a, b| a.addr.cmp(&b.addr));
    nodes.truncate(MAX_REPORTED_NODES);
    nodes
}

/// `5461-10922` or `42`; `None` for a slot being migrated or imported (`[…]`).
fn slot_range(text: &str) -> Option<(u16, u16)> {
    let (from, to) = text.split_once('-').unwrap_or((text, text));
    Some((from.parse().ok()?, to.parse().ok()?))
}

/// Every command goes where its topology sends it; a cluster routes by key.
impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Node(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Node(c) => c.req_packed_commands(cmd, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Node(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_read_role_health_slots_and_imports_from_flags_link_and_ranges() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7002@17002 master,fail - 0 0 2 disconnected 5461-10921 10922
c3 127.0.0.1:7004@17004,host.example slave a1 0 0 1 connected
d4 127.0.0.1:7005@17005 master - 0 0 4 connected [5461-<-b2]
";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(
            nodes,
            vec![
                NodeHealth {
                    addr: "127.0.0.1:7001".into(),
                    role: "primary",
                    healthy: true,
                    slots: vec![(0, 5460)],
                    importing: false,
                    breaker_open: None,
                },
                NodeHealth {
                    addr: "127.0.0.1:7002".into(),
                    role: "primary",
                    healthy: false,
                    slots: vec![(5461, 10921), (10922, 10922)],
                    importing: false,
                    breaker_open: None,
                },
                NodeHealth {
                    addr: "127.0.0.1:7004".into(),
                    role: "replica",
                    healthy: true,
                    slots: Vec::new(),
                    importing: false,
                    breaker_open: None,
                },
                NodeHealth {
                    addr: "127.0.0.1:7005".into(),
                    role: "primary",
                    healthy: true,
                    slots: Vec::new(),
                    importing: true,
                    breaker_open: None,
                },
            ]
        );
    }
}
