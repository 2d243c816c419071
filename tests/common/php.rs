//! A real PHP backend for tests: `php -S 127.0.0.1:0` (php-cli) serving one router script.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// `php -S` on a free loopback port; stopped when dropped.
pub struct PhpServer {
    pub addr: SocketAddr,
    child: std::process::Child,
}

impl PhpServer {
    /// Serves every request with `script` (the router script of `php -S`).
    pub fn start(script: &Path, env: &[(&str, &Path)]) -> PhpServer {
        let mut cmd = std::process::Command::new("php");
        cmd.args(["-S", "127.0.0.1:0"])
            .arg(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "php is not installed: these tests need php-cli (.ci/test installs it; or apt-get install php-cli)"
            ),
            Err(e) => panic!("cannot start php -S: {e}"),
        };
        // php prints "Development Server (http://127.0.0.1:PORT) started" on stderr;
        // the thread keeps draining stderr so php never blocks on a full pipe.
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if let Some(addr) = line
                    .split("(http://")
                    .nth(1)
                    .and_then(|rest| rest.split(')').next())
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("php -S did not report its address"));
        PhpServer { addr, child }
    }
}

impl Drop for PhpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
