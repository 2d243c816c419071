//! A real `redis-server` child per test, on a free port, that a test can stop, freeze and restart.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually_blocking;

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` without persistence on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        let mut server = RedisServer::unstarted();
        server.restart();
        server
    }

    /// A free port where Redis will run once [`RedisServer::restart`] is called.
    pub fn unstarted() -> RedisServer {
        RedisServer {
            port: super::free_addr().port(),
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts it again on the same port (after [`RedisServer::stop`]), empty.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server is already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-server ({e}): these tests need it on PATH \
                     (Debian/Ubuntu: apt-get install -y redis-server)"
                )
            });
        self.child = Some(child);
        let answered = eventually_blocking(Duration::from_secs(10), || {
            self.command(&["PING"]).as_deref() == Some("+PONG")
        });
        assert!(answered, "redis-server never answered PING");
    }

    /// Kills it (its data is gone: it never persists).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes it (SIGSTOP): connections stay open but nothing answers.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        signal(self.child.as_ref().expect("running"), name);
    }

    /// One command over a fresh connection; the first line of the reply.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        text.lines().next().map(str::to_string)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.thaw();
        }
        self.stop();
    }
}

/// Sends a server a signal by name (`kill -STOP`, `-CONT`, …).
pub fn signal(child: &std::process::Child, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill(1) runs")
        .success();
    assert!(ok, "kill -{name} failed");
}
