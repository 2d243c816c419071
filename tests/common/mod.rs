//! Test harness: a real tollgate on 127.0.0.1 port 0 from YAML, and the support every test file shares.
//!
//! One way to do each job: [`app`] for the app called without sockets
//! (on tokio's possibly paused clock), [`free_addr`] for a port nobody listens on,
//! [`requests`] to talk to a server (reqwest, raw bytes, blocking), [`upstream`]
//! for stub servers, [`wait`] for polling ([`eventually`]), [`process`] for the
//! real binary, [`certs`] for TLS.
#![allow(dead_code)]

/// 2026-01-01T00:00:00Z in nanoseconds of Unix time: the start of every
/// window up to a day long.
pub const WINDOW_START: u64 = 1_767_225_600 * 1_000_000_000;

/// 20 s into a minute (2026-01-01T00:00:20Z), where a test's manual clock
/// starts: a 60 s window ends 40 s later, so windows never roll over mid-test.
pub const T0: u64 = WINDOW_START + 20 * 1_000_000_000;

pub mod acme;
pub mod app;
pub mod browser;
pub mod bytes;
pub mod cdp;
pub mod certs;
pub mod crowdsec;
pub mod dnsmasq;
pub mod geoip;
pub mod origin;
pub mod pebble;
pub mod php;
pub mod php_fpm;
pub mod process;
pub mod redis_cluster;
pub mod redis_server;
pub mod requests;
pub mod tmpfs;
pub mod upstream;
pub mod wait;

// Every test file names these as `common::…`; each uses only some.
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use requests::*;
#[allow(unused_imports)]
pub use upstream::*;
#[allow(unused_imports)]
pub use wait::*;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use tollgate::clock::{SharedClock, SystemClock};
use tollgate::store::Store;
use tollgate::{App, Listeners, RunOptions};

/// A tollgate running in this process on real sockets.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The TLS listener, when the YAML has `server.tls.listen` (pinned like `addr`).
    pub tls_addr: Option<SocketAddr>,
    pub admin: SocketAddr,
    pub app: App,
    pub config_path: PathBuf,
    pub dir: tempfile::TempDir,
    /// The access log, kept here instead of printed: a green run stays quiet,
    /// a failing test shows it (see `Drop`), and a test can read it.
    pub access: AccessCapture,
    shutdown: CancellationToken,
    handle: Option<JoinHandle<()>>,
}

/// Rewrites `yaml` so the proxy listens on the given addresses and keeps its
/// SQLite file in `dir` (unless the test chose a path or another backend).
pub fn pin_yaml(
    yaml: &str,
    listen: SocketAddr,
    admin: SocketAddr,
    dir: &std::path::Path,
) -> String {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("test YAML parses");
    if doc.is_null() {
        doc = serde_yaml::Value::Mapping(Default::default());
    }
    let map = doc.as_mapping_mut().expect("top level is a map");
    let section = |map: &mut serde_yaml::Mapping, name: &str| -> serde_yaml::Mapping {
        map.get(name)
            .and_then(|v| v.as_mapping())
            .cloned()
            .unwrap_or_default()
    };
    let mut server = section(map, "server");
    server.insert("listen".into(), vec![listen.to_string()].into());
    map.insert("server".into(), server.into());
    let mut admin_section = section(map, "admin");
    admin_section.insert("listen".into(), admin.to_string().into());
    map.insert("admin".into(), admin_section.into());
    let mut store = section(map, "store");
    // `path` belongs to the SQLite store only (another backend refuses it).
    let sqlite = store
        .get("backend")
        .and_then(|b| b.as_str())
        .is_none_or(|b| b == "sqlite");
    if sqlite && !store.contains_key("path") {
        store.insert(
            "path".into(),
            dir.join("tollgate.db").display().to_string().into(),
        );
    }
    map.insert("store".into(), store.into());
    serde_yaml::to_string(&doc).expect("serializes")
}

/// Whether `yaml` asks for TLS listeners of their own (`server.tls.listen`).
fn wants_tls_listener(yaml: &str) -> bool {
    let doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("test YAML parses");
    doc.get("server")
        .and_then(|s| s.get("tls"))
        .and_then(|t| t.get("listen"))
        .is_some()
}

/// Points `server.tls.listen` at `tls`, when there is one.
fn pin_tls_listen(yaml: String, tls: Option<SocketAddr>) -> String {
    let Some(tls) = tls else { return yaml };
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&yaml).expect("pinned YAML parses");
    doc["server"]["tls"]["listen"] = vec![tls.to_string()].into();
    serde_yaml::to_string(&doc).expect("serializes")
}

impl Proxy {
    pub async fn start(yaml: &str) -> Proxy {
        Proxy::start_with_clock(yaml, Arc::new(SystemClock)).await
    }

    pub async fn start_with_clock(yaml: &str, clock: SharedClock) -> Proxy {
        Proxy::start_in(yaml, clock, tempfile::tempdir().expect("temp dir"), None).await
    }

    /// Starts in `dir` (so a second proxy can reopen the same SQLite file);
    /// `watch` polls the config file at that interval.
    pub async fn start_in(
        yaml: &str,
        clock: SharedClock,
        dir: tempfile::TempDir,
        watch: Option<Duration>,
    ) -> Proxy {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Logs show up with a failing test's output (`TOLLGATE_LOG=debug` for more).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, admin_addr) = (public.local_addr().unwrap(), admin.local_addr().unwrap());
        let mut public = vec![public];
        let mut tls_addr = None;
        if wants_tls_listener(yaml) {
            let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tls_addr = Some(tls.local_addr().unwrap());
            public.push(tls);
        }
        let config_path = dir.path().join("tollgate.yaml");
        let pinned = pin_tls_listen(pin_yaml(yaml, addr, admin_addr, dir.path()), tls_addr);
        std::fs::write(&config_path, pinned).unwrap();
        let (config, text) =
            tollgate::config::load_file_text(&config_path).unwrap_or_else(|e| panic!("{e}"));
        let store = Store::open(&config.store, &config.limiters, clock.now()).expect("store opens");
        let source = tollgate::app::ConfigSource {
            path: config_path.clone(),
            text,
        };
        let app = App::new(config, store, clock, Some(source));
        let access = AccessCapture::default();
        app.shared.access.redirect(Box::new(access.clone()));
        let shutdown = CancellationToken::new();
        let listeners = Listeners { public, admin };
        let options = RunOptions {
            config_path: Some(config_path.clone()),
            watch_every: watch,
            workers: None,
        };
        let handle = tokio::spawn(tollgate::run(
            listeners,
            app.clone(),
            options,
            shutdown.clone(),
        ));
        Proxy {
            addr,
            tls_addr,
            admin: admin_addr,
            app,
            config_path,
            dir,
            access,
            shutdown,
            handle: Some(handle),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// The admin listener's `/metrics` text.
    pub async fn metrics(&self) -> String {
        get_text(&client(), &self.admin_url("/metrics")).await
    }

    /// The value of one series in `GET /metrics` (see [`metric`] for `series`).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric(&self.metrics().await, series)
    }

    /// `POST /reload` on the admin listener: its status and JSON body.
    pub async fn reload(&self) -> (u16, serde_json::Value) {
        let answer = send(client().post(self.admin_url("/reload"))).await;
        (answer.status, answer.json())
    }

    /// Rewrites the config file with `yaml` (listeners and store path pinned as at start).
    pub fn write_config(&self, yaml: &str) {
        let pinned = pin_yaml(yaml, self.addr, self.admin, self.dir.path());
        std::fs::write(&self.config_path, pin_tls_listen(pinned, self.tls_addr)).unwrap();
    }

    /// Starts a graceful shutdown and returns the task that finishes it.
    pub fn begin_shutdown(&mut self) -> JoinHandle<()> {
        self.shutdown.cancel();
        self.handle.take().expect("not yet stopped")
    }

    /// Shuts down gracefully and returns the temp dir (with the SQLite file).
    pub async fn stop(mut self) -> tempfile::TempDir {
        let h = self.begin_shutdown();
        tokio::time::timeout(Duration::from_secs(15), h)
            .await
            .expect("shutdown finishes")
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // Printed through the test harness, which shows it for a failing test only.
        if std::thread::panicking() {
            for line in self.access.lines() {
                println!("access: {line}");
            }
        }
    }
}

/// The `errors` of a rejected reload's answer (see [`Proxy::reload`]).
pub fn reload_errors(body: &serde_json::Value) -> Vec<&str> {
    body["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors in {body}"))
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect()
}

/// Everything under `/` goes to the upstream at `url`, with `extra` YAML appended.
pub fn forward_all(url: &str, extra: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{url}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n{extra}"
    )
}

/// `/ping` answers `pong` itself, behind one fixed window of `limit` per minute (`strict`).
pub fn ping_yaml(limit: u32) -> String {
    format!(
        "limiters:\n  strict: {{ limit: {limit}, window: 60s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [strict] }}\n"
    )
}

/// A limiter as a store opens it: keyed by client, enforcing, no overrides,
/// `count:` or `ban:`; a test changes what it needs with `..limiter(…)`.
pub fn limiter(
    name: &str,
    algorithm: tollgate::limiter::Algorithm,
) -> tollgate::config::LimiterConfig {
    tollgate::config::LimiterConfig {
        name: name.into(),
        algorithm,
        key: vec![tollgate::config::KeyPart::Client],
        shadow: false,
        overrides: vec![],
        reject: None,
        count: None,
        ban: None,
        lease: None,
    }
}

/// An address on 127.0.0.1 that was free a moment ago (bound, read, released):
/// for a server a test starts later, or for a port nobody listens on.
///
/// The port comes from below the kernel's ephemeral range, never from a
/// `:0` bind: the kernel hands ports of that range to every `:0` listener and
/// every outgoing connection of the machine, and one of them once took a
/// port between this call and the server's start (pebble, in CI: "bind:
/// address already in use"). Below the range only another `free_addr` can
/// take it, and within this process a counter never hands a port out twice.
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 15_000;
    let end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if end <= FIRST + 1_000 {
        // An unusual machine: fall back to what the kernel picks.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        return l.local_addr().unwrap();
    }
    let span = end - FIRST;
    // Test binaries run one after another, but a process's ports may linger
    // in TIME_WAIT: each process starts somewhere else in the span.
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (start + n) % span) as u16;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Free for TCP and UDP both: a DNS server takes the two.
        if std::net::TcpListener::bind(addr).is_ok() && std::net::UdpSocket::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port on 127.0.0.1 between {FIRST} and {end}");
}

/// The access log of an in-process [`Proxy`], captured instead of printed.
#[derive(Clone, Default)]
pub struct AccessCapture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for AccessCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AccessCapture {
    /// Redirects `proxy`'s access log here from the next record on (a
    /// capture of its own; [`Proxy::access`] holds everything since start).
    pub fn attach(proxy: &Proxy) -> AccessCapture {
        let c = AccessCapture::default();
        proxy.app.shared.access.redirect(Box::new(c.clone()));
        c
    }

    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (at most 5 s) until at least `n` lines were written, and returns them all.
    pub async fn wait_lines(&self, n: usize) -> Vec<String> {
        // A short count is the caller's to assert on: it sees the lines.
        let _enough =
            eventually(Duration::from_secs(5), || async { self.lines().len() >= n }).await;
        self.lines()
    }

    /// Waits (at most 5 s) for a JSON record that `wanted` accepts, and returns it.
    pub async fn wait_record(
        &self,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let find = || {
            self.lines()
                .iter()
                .filter_map(|l| serde_json::from_str(l).ok())
                .find(|r| wanted(r))
        };
        let _found = eventually(Duration::from_secs(5), || async { find().is_some() }).await;
        find()
    }

    /// Every line parsed as JSON (a line that is not JSON fails the test).
    pub async fn wait_records(&self, n: usize) -> Vec<serde_json::Value> {
        self.wait_lines(n)
            .await
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}
