//! A real CrowdSec Local API (Debian's `crowdsec` package) per test, offline: its own config, database and port; a machine and a bouncer registered with `cscli`; killed on drop.
//!
//! Only the API runs (`crowdsec -no-cs`): without systemd's journal the
//! agent's acquisition would fail, and a bouncer needs nothing else. The
//! config is the package's own with the Central API block removed, the
//! listener on a free port, the database, data and logs in a temporary
//! directory and Prometheus off (so tests running at once do not fight
//! over its port).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually_blocking;

/// The machine tollgate pushes as, and its password.
pub const MACHINE: &str = "tollgate-test";
pub const PASSWORD: &str = "tollgate-test-password-0123456789";

pub struct Lapi {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    config: PathBuf,
    child: Option<Child>,
    /// The bouncer key `cscli bouncers add` printed.
    pub api_key: String,
}

impl Lapi {
    /// Starts the Local API and registers a machine and a bouncer.
    pub fn start() -> Lapi {
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = super::free_addr();
        let config = write_config(dir.path(), addr);
        let mut lapi = Lapi {
            addr,
            config,
            dir,
            child: None,
            api_key: String::new(),
        };
        lapi.cscli(&[
            "machines",
            "add",
            MACHINE,
            "--password",
            PASSWORD,
            "--force",
        ]);
        lapi.restart();
        lapi.api_key = lapi
            .cscli(&["bouncers", "add", "tollgate", "-o", "raw"])
            .trim()
            .to_string();
        assert!(!lapi.api_key.is_empty(), "cscli printed no bouncer key");
        lapi
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes the bouncer key and the machine password where a config can name them.
    pub fn secret_files(&self) -> (PathBuf, PathBuf) {
        let key = self.dir.path().join("bouncer.key");
        let password = self.dir.path().join("machine.password");
        std::fs::write(&key, format!("{}\n", self.api_key)).unwrap();
        std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
        (key, password)
    }

    /// Starts the API (again, after [`Lapi::kill`]) and waits until it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the Local API is running");
        let log = std::fs::File::create(self.dir.path().join("lapi.out")).unwrap();
        let child = Command::new("crowdsec")
            .arg("-c")
            .arg(&self.config)
            .arg("-no-cs")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("crowdsec is installed (.ci/test installs it)");
        self.child = Some(child);
        let addr = self.addr;
        let up = eventually_blocking(Duration::from_secs(30), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
        assert!(up, "the Local API never listened:\n{}", self.log());
    }

    /// Kills the API process (a crash: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `cscli` on this API's config; its standard output.
    pub fn cscli(&self, args: &[&str]) -> String {
        let out = Command::new("cscli")
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("cscli is installed");
        assert!(
            out.status.success(),
            "cscli {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `cscli decisions list -o json`, every decision's `value`.
    pub fn decision_values(&self) -> Vec<String> {
        let text = self.cscli(&["decisions", "list", "-o", "json"]);
        let alerts: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_default();
        alerts
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["decisions"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["value"].as_str().map(str::to_string))
            .collect()
    }

    pub fn log(&self) -> String {
        let out = std::fs::read_to_string(self.dir.path().join("lapi.out")).unwrap_or_default();
        let api =
            std::fs::read_to_string(self.dir.path().join("crowdsec_api.log")).unwrap_or_default();
        format!("{out}\n{api}")
    }
}

impl Drop for Lapi {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- CrowdSec Local API log ---\n{}", self.log());
        }
        self.kill();
    }
}

/// The package's config, pointed at `dir` and `addr`, without the Central API.
fn write_config(dir: &Path, addr: SocketAddr) -> PathBuf {
    let text = std::fs::read_to_string("/etc/crowdsec/config.yaml")
        .expect("/etc/crowdsec/config.yaml: crowdsec is installed (.ci/test installs it)");
    let mut c: serde_yaml::Value =
        serde_yaml::from_str(&text).expect("the package's config parses");
    let path = |p: &str| dir.join(p).display().to_string();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    c["common"]["daemonize"] = false.into();
    c["common"]["log_dir"] = path("").into();
    c["config_paths"]["data_dir"] = path("data").into();
    c["db_config"]["db_path"] = path("crowdsec.db").into();
    c["api"]["client"]["credentials_path"] = path("credentials.yaml").into();
    std::fs::write(dir.join("credentials.yaml"), "").unwrap();
    let server = c["api"]["server"].as_mapping_mut().expect("api.server");
    server.remove("online_client");
    server.insert("listen_uri".into(), addr.to_string().into());
    c["prometheus"]["enabled"] = false.into();
    let config = dir.join("config.yaml");
    std::fs::write(&config, serde_yaml::to_string(&c).unwrap()).unwrap();
    config
}
