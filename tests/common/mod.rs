//! Test harness: a real tollgate on 127.0.0.1 port 0 from YAML, a stub upstream, raw HTTP helpers.
#![allow(dead_code)]

pub mod php_fpm;
pub mod redis_server;
pub mod tmpfs;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use tollgate::clock::{SharedClock, SystemClock};
use tollgate::store::Store;
use tollgate::{App, Listeners, RunOptions};

pub mod browser;
pub mod certs;
pub mod php;

/// A tollgate running in this process on real sockets.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The TLS listener, when the YAML has `server.tls.listen` (pinned like `addr`).
    pub tls_addr: Option<SocketAddr>,
    pub admin: SocketAddr,
    pub app: App,
    pub config_path: PathBuf,
    pub dir: tempfile::TempDir,
    shutdown: CancellationToken,
    handle: Option<JoinHandle<()>>,
}

/// Rewrites `yaml` so the proxy listens on the given addresses and keeps its
/// SQLite file in `dir` (unless the test chose a path).
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
    if !store.contains_key("path") {
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
    }
}

/// What the stub upstream saw.
#[derive(Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub arrivals: Mutex<Vec<Instant>>,
    pub last_headers: Mutex<Option<hyper::HeaderMap>>,
}

impl Seen {
    /// Waits (at most 5 s) until a request is being served by the upstream.
    pub async fn wait_for_in_flight(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.in_flight.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the request never reached the upstream"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A real HTTP upstream on 127.0.0.1 port 0. It answers with JSON describing
/// the request; `/slow/<ms>` waits first, `/echo` streams the body back,
/// `/big/<bytes>` answers that many bytes.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    stop: CancellationToken,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr` (a killed upstream's, to bring it back).
    pub async fn start_on(addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let stop = CancellationToken::new();
        let (s, st) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let seen = s.clone();
                let killed = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle_upstream(seen.clone(), req));
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    // Killed: the socket closes mid-exchange, like a crashed server.
                    tokio::select! {
                        _ = conn => {}
                        _ = killed.cancelled() => {}
                    }
                });
            }
        });
        Upstream { addr, seen, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and closes every open connection, like a crashed server.
    pub fn kill(&self) {
        self.stop.cancel();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct InFlight(Arc<Seen>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle_upstream(
    seen: Arc<Seen>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    seen.arrivals.lock().push(Instant::now());
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _guard = InFlight(seen.clone());
    *seen.last_headers.lock() = Some(req.headers().clone());
    let path = req.uri().path().to_string();
    if let Some(ms) = path
        .strip_prefix("/slow/")
        .and_then(|m| m.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(n) = path
        .strip_prefix("/big/")
        .and_then(|m| m.parse::<usize>().ok())
    {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let version = format!("{:?}", req.version());
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if path == "/echo" {
        return Ok(Response::new(Full::new(body)));
    }
    let json = serde_json::json!({
        "method": method, "uri": uri, "version": version, "headers": headers, "body_len": body.len(),
    });
    let mut resp = Response::new(Full::new(Bytes::from(json.to_string())));
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut()
        .insert("connection", "x-upstream-hop".parse().unwrap());
    resp.headers_mut()
        .insert("x-upstream-hop", "must-not-reach-client".parse().unwrap());
    Ok(resp)
}

/// A client without connection reuse surprises: a fresh pool per test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// Sends raw bytes and returns everything read until the server closes or `wait` passes.
pub async fn raw(addr: SocketAddr, request: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the first response in a raw HTTP/1.1 answer.
pub fn status_of(raw: &str) -> u16 {
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A free port nobody listens on (bound then released).
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

// ------------------------------------------------------------ the real binary

/// An address on 127.0.0.1 that was free a moment ago (bound, read, released).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// One HTTP/1.1 answer read by [`http`].
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One blocking HTTP/1.1 request on a fresh connection (for tests that drive
/// a child process without a runtime). Fails if nothing listens or answers in 5 s.
pub fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Reply> {
    http_with(addr, method, path, &[])
}

/// [`http`] with extra request headers.
pub fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Reply> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("no HTTP head in {text:?}"),
        )
    })?;
    let mut reply = Reply {
        status: status_of(head),
        head: head.to_string(),
        body: body.to_string(),
    };
    if reply
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        reply.body = dechunk(body);
    }
    Ok(reply)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The path of the `tollgate` binary cargo built for these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_tollgate");

/// A `tollgate serve` child process on free ports, its output in a log file.
pub struct Process {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

impl Process {
    /// Writes `yaml` (listeners pinned to free ports, SQLite file in `dir`
    /// unless it names one) to `dir/tollgate.yaml`, runs `tollgate serve
    /// --config` on it and waits until `/healthz` answers.
    pub fn serve(yaml: &str, dir: &std::path::Path) -> Process {
        let (addr, admin) = (free_addr(), free_addr());
        let config = dir.join("tollgate.yaml");
        std::fs::write(&config, pin_yaml(yaml, addr, admin, dir)).unwrap();
        let mut cmd = std::process::Command::new(BINARY);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .current_dir(dir);
        Process::spawn(cmd, addr, admin, dir)
    }

    /// Starts `cmd` (which must serve on `addr` / `admin`) with its output in
    /// a fresh log file in `dir`, and waits until it is healthy.
    pub fn spawn(
        mut cmd: std::process::Command,
        addr: SocketAddr,
        admin: SocketAddr,
        dir: &std::path::Path,
    ) -> Process {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let log = dir.join(format!(
            "tollgate-{}.log",
            RUNS.fetch_add(1, Ordering::SeqCst)
        ));
        let out = std::fs::File::create(&log).unwrap();
        cmd.stdout(out.try_clone().unwrap())
            .stderr(out)
            .env("TOLLGATE_LOG", "info");
        let child = cmd.spawn().expect("the tollgate binary starts");
        let mut p = Process {
            child,
            addr,
            admin,
            log,
        };
        p.wait_healthy();
        p
    }

    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http(self.admin, "GET", "/healthz") {
                if r.status == 200 {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tollgate exited early with {status}:\n{}", self.output());
            }
            assert!(
                Instant::now() < deadline,
                "tollgate never became healthy:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The child's resident memory in KiB (`VmRSS` in /proc/<pid>/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/<pid>/status is readable (Linux)");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// Sends a signal by name (`TERM`, `KILL`, `HUP`) with kill(1).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill(1) runs")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("tollgate did not exit within {limit:?}:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `tollgate <args>` to its exit (killed after `limit`): its status and its output.
pub fn run_to_exit(
    args: &[&std::ffi::OsStr],
    limit: Duration,
) -> (std::process::ExitStatus, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(BINARY)
        .args(args)
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .expect("the tollgate binary starts");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "tollgate {args:?} still ran after {limit:?}:\n{}",
                std::fs::read_to_string(out.path()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(out.path()).unwrap_or_default(),
    )
}

/// The value of the first Prometheus sample whose line starts with `series`:
/// a name (end it with a space to exclude longer names), or a name and the
/// start of its labels.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// With the real clock: if less than `room` is left in the current window of
/// length `window` (aligned to the Unix epoch), sleeps into the next one, so
/// a scenario that takes less than `room` never straddles two windows.
pub fn wait_for_window_room(window: Duration, room: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = Duration::from_nanos((now.as_nanos() % window.as_nanos()) as u64);
    let left = window - into;
    if left < room {
        std::thread::sleep(left + Duration::from_millis(100));
    }
}

/// The Unix start (s) of the current window of length `window`, with the real clock.
pub fn window_start_now(window: Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now - now % window.as_secs()
}

/// Sends `n` GETs to `url` at once and returns their statuses, in completion order.
pub async fn burst(c: &reqwest::Client, url: &str, n: usize) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { c.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// GETs `url` and returns the body as text, whatever the status.
pub async fn get_text(c: &reqwest::Client, url: &str) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

/// GETs `url` and parses the body as JSON, whatever the status.
pub async fn get_json(c: &reqwest::Client, url: &str) -> serde_json::Value {
    let text = c.get(url).send().await.unwrap().text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// GETs `url` with `headers` and returns the status code.
pub async fn status(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = c.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The bytes one relayed connection carried towards the upstream.
pub type Recording = Arc<Mutex<Vec<u8>>>;

/// A TCP relay in front of an upstream that records, per connection, the exact
/// bytes tollgate sent: what a loosely-parsing backend would have read.
pub struct Tap {
    pub addr: SocketAddr,
    /// Client-to-upstream bytes, one entry per connection, in accept order.
    pub streams: Arc<Mutex<Vec<Recording>>>,
    stop: CancellationToken,
}

impl Tap {
    pub async fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let streams: Arc<Mutex<Vec<Recording>>> = Arc::default();
        let stop = CancellationToken::new();
        let (all, st) = (streams.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let inbound = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let record = Arc::new(Mutex::new(Vec::new()));
                all.lock().push(record.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut in_read, mut in_write) = inbound.into_split();
                    let (mut out_read, mut out_write) = outbound.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            match in_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    record.lock().extend_from_slice(&buf[..n]);
                                    if out_write.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = out_write.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
                        let _ = in_write.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Tap {
            addr,
            streams,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What each upstream connection has carried so far.
    pub fn recorded(&self) -> Vec<Vec<u8>> {
        self.streams
            .lock()
            .iter()
            .map(|r| r.lock().clone())
            .collect()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
// ------------------------------------------------------------ the access log

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
    /// Redirects `proxy`'s access log here from the next record on.
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
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let lines = self.lines();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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

/// A WebSocket upstream on 127.0.0.1 port 0 that echoes every message and
/// counts the sessions it opened and saw closed.
pub struct WsEcho {
    pub addr: SocketAddr,
    pub opened: Arc<AtomicUsize>,
    pub closed: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl WsEcho {
    pub async fn start() -> WsEcho {
        use futures_util::{SinkExt, StreamExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stop = CancellationToken::new();
        let (o, c, st) = (opened.clone(), closed.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let (o, c) = (o.clone(), c.clone());
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    o.fetch_add(1, Ordering::SeqCst);
                    while let Some(Ok(msg)) = ws.next().await {
                        if msg.is_close() {
                            break;
                        }
                        if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                            break;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        WsEcho {
            addr,
            opened,
            closed,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WsEcho {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Waits (at most `limit`) until `check` holds; panics with `what` if it never does.
pub async fn eventually(limit: Duration, what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
