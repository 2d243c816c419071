//! Real Redis topologies for the fleet tests: a Redis Cluster (3 primaries, 1 replica each) and a Sentinel group (primary, replica, 3 sentinels), all on 127.0.0.1 free ports, started and stopped by the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually_blocking;

/// One `redis-server` (data node or sentinel) the test owns.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
}

impl Node {
    /// Starts `redis-server` with `args` in `dir`; waits until it answers `PING` on `--port`.
    pub fn spawn(args: &[String], dir: &Path) -> Node {
        let port = args
            .iter()
            .position(|a| a == "--port")
            .map(|i| args[i + 1].parse().unwrap())
            .unwrap_or(0);
        let child = Command::new("redis-server")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}): these tests need it"));
        let node = Node {
            port,
            child: Some(child),
        };
        let answered = eventually_blocking(Duration::from_secs(10), || {
            cli(node.port, &["PING"]).trim() == "PONG"
        });
        assert!(answered, "redis-server on {port} never answered PING");
        node
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL): a crash, as far as the others can tell.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends it a signal by name (`STOP` freezes it, `CONT` thaws it).
    pub fn signal(&self, name: &str) {
        super::redis_server::signal(self.child.as_ref().expect("running"), name);
    }

    /// One command through `redis-cli`; its raw output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli -p <port> <args…>`: the output, empty when it could not run.
pub fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// A port that is free now, whose cluster bus port (10000 above) is free too.
fn port() -> u16 {
    loop {
        let p = super::free_addr().port();
        // `free_addr` stays below 32768, so the bus port is a valid port too.
        if std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// 3 primaries (and 3 replicas unless started without), every slot covered,
/// `cluster-node-timeout` 1 s.
pub struct Cluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// 3 primaries, each with a replica.
    pub fn start() -> Cluster {
        Cluster::create(1, &[])
    }

    /// 3 primaries and no replica, serving what slots they can when one is
    /// lost (`cluster-require-full-coverage no`): a dead primary's slots stay
    /// unserved and the others keep answering.
    pub fn without_replicas() -> Cluster {
        Cluster::create(0, &["--cluster-require-full-coverage", "no"])
    }

    /// 3 primaries, each with a replica, serving what slots they can while
    /// one is lost and its replica not yet promoted.
    pub fn with_replicas_serving_partially() -> Cluster {
        Cluster::create(1, &["--cluster-require-full-coverage", "no"])
    }

    /// A `redis-cli --cluster create` that has not joined the nodes within
    /// 30 s (it can wait forever, e.g. when a bus port was taken by another
    /// test's server between choosing and binding it) is abandoned and a
    /// fresh cluster started on new ports, up to 3 times.
    fn create(replicas: usize, extra: &[&str]) -> Cluster {
        for attempt in 1..=3 {
            match Cluster::try_create(replicas, extra) {
                Some(cluster) => return cluster,
                None => eprintln!("redis-cli --cluster create hung (attempt {attempt}); new ports"),
            }
        }
        panic!("a Redis Cluster never formed in 3 attempts");
    }

    fn try_create(replicas: usize, extra: &[&str]) -> Option<Cluster> {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<Node> = (0..3 * (1 + replicas))
            .map(|i| {
                let (p, bus) = (port(), port());
                let args: Vec<String> = [
                    "--port",
                    &p.to_string(),
                    "--cluster-port",
                    &bus.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{i}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]
                .map(String::from)
                .to_vec();
                let args: Vec<String> = args
                    .into_iter()
                    .chain(extra.iter().map(|a| a.to_string()))
                    .collect();
                Node::spawn(&args, dir.path())
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(Node::addr).collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli runs");
        let done = eventually_blocking(Duration::from_secs(30), || {
            matches!(create.try_wait(), Ok(Some(_)))
        });
        if !done {
            let _ = create.kill();
            let _ = create.wait();
            return None;
        }
        let out = create.wait_with_output().expect("redis-cli's output");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes, _dir: dir };
        cluster.wait_ok();
        Some(cluster)
    }

    /// Every node says `cluster_state:ok` and sees 3 primaries with slots.
    pub fn wait_ok(&self) {
        let ok = eventually_blocking(Duration::from_secs(30), || {
            self.nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
                && self.primaries().len() == 3
        });
        assert!(ok, "the cluster never became ok:\n{}", self.nodes_text());
    }

    fn live(&self) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
    }

    pub fn nodes_text(&self) -> String {
        self.live().cli(&["CLUSTER", "NODES"])
    }

    /// Ports of the primaries that hold slots.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes_text()
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 8 && f[2].contains("master") && !f[2].contains("fail")
            })
            .filter_map(|l| port_of(l.split_whitespace().nth(1)?))
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The replica of the primary on `primary`.
    pub fn replica_of(&self, primary: u16) -> u16 {
        let text = self.nodes_text();
        let id = text
            .lines()
            .find(|l| l.split_whitespace().nth(1).and_then(port_of) == Some(primary))
            .and_then(|l| l.split_whitespace().next())
            .expect("the primary is listed")
            .to_string();
        text.lines()
            .find(|l| l.split_whitespace().nth(3) == Some(id.as_str()))
            .and_then(|l| port_of(l.split_whitespace().nth(1)?))
            .expect("the primary has a replica")
    }

    pub fn node(&self, port: u16) -> &Node {
        self.nodes.iter().find(|n| n.port == port).expect("a node")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node")
    }

    pub fn slot(&self, key: &str) -> u16 {
        self.live()
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot number")
    }

    /// The primary that serves `slot` now.
    pub fn owner(&self, slot: u16) -> u16 {
        self.nodes_text()
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .find(|l| {
                l.split_whitespace().skip(8).any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    match (a.parse::<u16>(), b.parse::<u16>()) {
                        (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                        _ => false,
                    }
                })
            })
            .and_then(|l| port_of(l.split_whitespace().nth(1)?))
            .expect("every slot has a primary")
    }

    /// Keys whose name starts with `prefix` on the node on `port`.
    pub fn keys_on(&self, port: u16, prefix: &str) -> Vec<String> {
        self.node(port)
            .cli(&["--scan", "--pattern", &format!("{prefix}*")])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Moves `slot` (and its keys) from one primary to another, the way
    /// `redis-cli --cluster reshard` does: SETSLOT importing/migrating,
    /// MIGRATE the keys, SETSLOT NODE everywhere.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        let id = |p: u16| self.node(p).cli(&["CLUSTER", "MYID"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        let s = slot.to_string();
        let (src, dst) = (self.node(from), self.node(to));
        dst.cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        src.cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
        loop {
            let keys = src.cli(&["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            src.cli(&args);
        }
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            n.cli(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
    }
}

fn port_of(addr: &str) -> Option<u16> {
    addr.split(['@', ','])
        .next()?
        .rsplit_once(':')?
        .1
        .parse()
        .ok()
}

/// A primary, its replica and 3 sentinels (quorum 2) watching it as `mymaster`,
/// with `down-after-milliseconds` 500 and `failover-timeout` 2 s.
pub struct Sentinel {
    pub primary: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    _dir: tempfile::TempDir,
}

pub const MASTER: &str = "mymaster";

impl Sentinel {
    pub fn start() -> Sentinel {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = |p: u16, extra: &[String]| {
            let mut args: Vec<String> = [
                "--port",
                &p.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(String::from)
            .to_vec();
            args.extend_from_slice(extra);
            Node::spawn(&args, dir.path())
        };
        let primary = data(port(), &[]);
        let replica = data(
            port(),
            &[
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port.to_string(),
            ],
        );
        let synced = eventually_blocking(Duration::from_secs(10), || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        assert!(synced, "the replica never synced");
        let sentinels = (0..3)
            .map(|i| {
                let p = port();
                let conf = sentinel_conf(dir.path(), i, p, primary.port);
                let args = [
                    conf.display().to_string(),
                    "--sentinel".into(),
                    "--port".into(),
                    p.to_string(),
                ];
                Node::spawn(&args, dir.path())
            })
            .collect::<Vec<Node>>();
        // A sentinel promotes only a replica it has learned of (from the
        // primary's INFO) and only with the votes of sentinels it has heard
        // (their hellos, every 2 s): a primary killed before that is never
        // replaced. Seen once on a loaded machine; wait for both.
        let replica_name = format!("127.0.0.1:{}", replica.port);
        let ready = eventually_blocking(Duration::from_secs(30), || {
            sentinels.iter().all(|s| {
                s.cli(&["SENTINEL", "replicas", MASTER])
                    .contains(&replica_name)
                    && s.cli(&["SENTINEL", "sentinels", MASTER])
                        .lines()
                        .filter(|l| *l == "runid")
                        .count()
                        == 2
            })
        });
        assert!(
            ready,
            "the sentinels never learned of the replica and of each other"
        );
        Sentinel {
            primary,
            replica,
            sentinels,
            _dir: dir,
        }
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The primary's `host:port` as the first sentinel names it now.
    pub fn named_primary(&self) -> String {
        self.sentinels[0]
            .cli(&["SENTINEL", "get-master-addr-by-name", MASTER])
            .lines()
            .collect::<Vec<_>>()
            .join(":")
    }
}

fn sentinel_conf(dir: &Path, i: usize, port: u16, primary: u16) -> PathBuf {
    let path = dir.join(format!("sentinel-{i}.conf"));
    let text = format!(
        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
         sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {MASTER} 500\n\
         sentinel failover-timeout {MASTER} 2000\n\
         sentinel parallel-syncs {MASTER} 1\n",
        dir = dir.display()
    );
    std::fs::write(&path, text).expect("write the sentinel config");
    path
}
