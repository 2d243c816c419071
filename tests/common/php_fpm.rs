//! A real php-fpm (Debian's `php-fpm` package) for the tests: its own config, a unix socket and a TCP port, a document root.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::eventually_blocking;

/// An "image" an attacker uploaded: PHP code that marks, two directories
/// up from where it lies, that it ran (the file `evil-ran`).
pub const EVIL_UPLOAD: &str =
    r#"<?php file_put_contents(__DIR__ . '/../../evil-ran', 'yes'); echo 'EVIL RAN';"#;

/// One php-fpm master with two pools over the same scripts: `unix` on a
/// socket and `tcp` on 127.0.0.1; killed on drop.
pub struct PhpFpm {
    pub socket: PathBuf,
    pub tcp: SocketAddr,
    pub root: PathBuf,
    pub log: PathBuf,
    child: std::process::Child,
}

/// The php-fpm binary: `/usr/sbin/php-fpm*` (php-fpm8.2 on Debian 12).
pub fn binary() -> PathBuf {
    let found = std::fs::read_dir("/usr/sbin").ok().and_then(|dir| {
        let mut names: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("php-fpm"))
            })
            .collect();
        names.sort();
        names.pop()
    });
    found.unwrap_or_else(|| {
        panic!("php-fpm is not installed: these tests need it (.ci/test installs it; or apt-get install php-fpm)")
    })
}

impl PhpFpm {
    /// Starts php-fpm on `root` (the document root), with `extra` lines
    /// added to each pool (e.g. `security.limit_extensions = .php .jpg`).
    pub fn start(dir: &Path, root: &Path, children: usize, extra: &str) -> PhpFpm {
        let socket = dir.join("php-fpm.sock");
        let tcp = super::free_addr();
        let log = dir.join("php-fpm.log");
        let pool = |name: &str, listen: &str| {
            format!(
                "[{name}]\nlisten = {listen}\npm = static\npm.max_children = {children}\n\
                 catch_workers_output = yes\ndecorate_workers_output = no\n\
                 php_admin_value[output_buffering] = 0\n\
                 php_admin_value[post_max_size] = 64M\n{extra}\n"
            )
        };
        let conf = format!(
            "[global]\nerror_log = {}\ndaemonize = no\npid = {}\n\n{}\n{}",
            log.display(),
            dir.join("php-fpm.pid").display(),
            pool("unix", &socket.display().to_string()),
            pool("tcp", &tcp.to_string()),
        );
        let conf_path = dir.join("php-fpm.conf");
        std::fs::write(&conf_path, conf).unwrap();
        // -n: no php.ini, so the machine's settings cannot change the test;
        // -R: allowed to run as root (CI containers do).
        let child = std::process::Command::new(binary())
            .arg("-n")
            .arg("-R")
            .arg("-F")
            .arg("-y")
            .arg(&conf_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("php-fpm starts");
        let mut fpm = PhpFpm {
            socket,
            tcp,
            root: root.to_path_buf(),
            log,
            child,
        };
        fpm.wait_ready();
        fpm
    }

    fn wait_ready(&mut self) {
        let listening = eventually_blocking(Duration::from_secs(20), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "php-fpm exited with {status}:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && std::net::TcpStream::connect(self.tcp).is_ok()
        });
        assert!(listening, "php-fpm never listened");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PhpFpm {
    /// SIGTERM, not SIGKILL: the master then stops its children; killed
    /// outright it would leave them running, orphaned.
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let stopped = eventually_blocking(Duration::from_secs(10), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if stopped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
