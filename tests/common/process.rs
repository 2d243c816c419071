//! The real `tollgate` binary as a child process: started on free ports, signalled, waited for.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{eventually_blocking, free_addr, http, pin_yaml};

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
        let healthy = eventually_blocking(Duration::from_secs(20), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tollgate exited early with {status}:\n{}", self.output());
            }
            http(self.admin, "GET", "/healthz").is_ok_and(|r| r.status == 200)
        });
        assert!(healthy, "tollgate never became healthy:\n{}", self.output());
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The child's resident memory in KiB (`VmRSS` in /proc/<pid>/status).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
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
        let mut status = None;
        let exited = eventually_blocking(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        // Killed (by drop) only after the output is read.
        assert!(
            exited,
            "tollgate did not exit within {limit:?}:\n{}",
            self.output()
        );
        status.expect("exited")
    }
}

/// The resident memory of process `pid` in KiB (`VmRSS` in /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc/<pid>/status is readable (Linux)");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
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
    let mut status = None;
    let exited = eventually_blocking(limit, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "tollgate {args:?} still ran after {limit:?}:\n{}",
            std::fs::read_to_string(out.path()).unwrap_or_default()
        );
    }
    let status = status.expect("exited");
    (
        status,
        std::fs::read_to_string(out.path()).unwrap_or_default(),
    )
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `total` requests from `total` threads at once, alternating between
/// the proxies; returns how many got 200 (anything but 200 or 429 fails the test).
pub fn concurrent(fleet: &[&Process], path: &str, total: usize) -> usize {
    let ok = Arc::new(AtomicUsize::new(0));
    let addrs: Vec<_> = fleet.iter().map(|p| p.addr).collect();
    let start = Arc::new(std::sync::Barrier::new(total));
    let threads: Vec<_> = (0..total)
        .map(|i| {
            let (ok, start, addr, path) = (
                ok.clone(),
                start.clone(),
                addrs[i % addrs.len()],
                path.to_string(),
            );
            std::thread::spawn(move || {
                start.wait();
                let r = super::http(addr, "GET", &path).expect("the proxy answers");
                assert!(
                    matches!(r.status, 200 | 429),
                    "unexpected {}: {}",
                    r.status,
                    r.body
                );
                if r.status == 200 {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("request thread");
    }
    ok.load(Ordering::SeqCst)
}
