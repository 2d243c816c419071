//! A real `php -S` on 127.0.0.1 port 0, running one router script or serving a document root, counting the requests that reach PHP.

use std::io::BufRead;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `php -S 127.0.0.1:0 <script>`: the script answers every path. It sees
/// `TOLLGATE_TEST_HITS` (a file it may append one line per request to).
pub struct PhpServer {
    pub addr: SocketAddr,
    hits: PathBuf,
    child: std::process::Child,
}

impl PhpServer {
    /// Starts PHP with `workers` processes (`PHP_CLI_SERVER_WORKERS`), so
    /// requests can really run in parallel.
    pub fn start(script: &Path, dir: &Path, workers: usize) -> PhpServer {
        let mut command = std::process::Command::new("php");
        command.args(["-S", "127.0.0.1:0"]).arg(script);
        PhpServer::spawn(command, dir, workers)
    }

    /// `php -S 127.0.0.1:0 -t <root>` without a router script: PHP itself
    /// resolves each path to a script (with its PATH_INFO) or a file under root.
    pub fn serve_root(root: &Path, dir: &Path) -> PhpServer {
        let mut command = std::process::Command::new("php");
        command.args(["-S", "127.0.0.1:0", "-t"]).arg(root);
        PhpServer::spawn(command, dir, 1)
    }

    fn spawn(mut command: std::process::Command, dir: &Path, workers: usize) -> PhpServer {
        let hits = dir.join("php-hits.log");
        let spawned = command
            .env("TOLLGATE_TEST_HITS", &hits)
            .env("PHP_CLI_SERVER_WORKERS", workers.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            // Its own process group: with workers, php forks, and the
            // workers must go when the test ends, not only the parent.
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "php is not installed: these tests need php-cli (.ci/test installs it; or apt-get install php-cli)"
            ),
            Err(e) => panic!("cannot start php -S: {e}"),
        };
        // php prints "Development Server (http://127.0.0.1:PORT) started" on
        // stderr; the thread keeps draining it so php never blocks on a full pipe.
        let stderr = child.stderr.take().unwrap();
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
        PhpServer { addr, hits, child }
    }

    /// The lines the script appended, one per request that reached PHP.
    pub fn hits(&self) -> Vec<String> {
        std::fs::read_to_string(&self.hits)
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

impl Drop for PhpServer {
    fn drop(&mut self) {
        // The whole group: the parent and every worker it forked.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
