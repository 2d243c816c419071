//! The binary as installers run it: a Kubernetes ConfigMap volume's update, systemd's readiness protocol, `--version`.

mod common;

use std::os::unix::fs::symlink;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use common::{eventually_blocking, free_addr, http, pin_yaml, ping_yaml, run_to_exit, Process};

/// Writes `yaml` into a fresh timestamped directory of `root`, as the kubelet
/// does for each version of a ConfigMap volume (`..2026_12_01_15_04_05.123456789`).
fn kubelet_write(root: &Path, stamp: &str, yaml: &str) -> String {
    let dir = format!("..2026_12_01_{stamp}.{:09}", std::process::id());
    std::fs::create_dir(root.join(&dir)).unwrap();
    std::fs::write(root.join(&dir).join("tollgate.yaml"), yaml).unwrap();
    dir
}

#[test]
fn a_kubelet_configmap_update_reaches_the_running_binary() {
    let root = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    // The volume as the kubelet lays it out: the key is a symlink into `..data`,
    // itself a symlink to the directory of the version in force.
    let first = kubelet_write(
        root.path(),
        "15_04_05",
        &pin_yaml(&ping_yaml(1), addr, admin, state.path()),
    );
    symlink(&first, root.path().join("..data")).unwrap();
    symlink("..data/tollgate.yaml", root.path().join("tollgate.yaml")).unwrap();
    let mut cmd = std::process::Command::new(common::BINARY);
    cmd.arg("serve")
        .arg("--config")
        .arg(root.path().join("tollgate.yaml"));
    let mut tollgate = Process::spawn(cmd, addr, admin, state.path());
    let ping = || http(addr, "GET", "/ping").unwrap().status;
    assert_eq!(ping(), 200);
    assert_eq!(ping(), 429, "the limit of 1 from the first version");

    // The update: a new timestamped directory, `..data_tmp` pointed at it and
    // renamed over `..data` (one atomic step), then the old directory removed.
    let second = kubelet_write(
        root.path(),
        "15_05_10",
        &pin_yaml(&ping_yaml(1000), addr, admin, state.path()),
    );
    symlink(&second, root.path().join("..data_tmp")).unwrap();
    std::fs::rename(root.path().join("..data_tmp"), root.path().join("..data")).unwrap();
    std::fs::remove_dir_all(root.path().join(&first)).unwrap();

    // Waited for by the reload itself: a 200 alone could be the next minute's
    // window under the old limit (seen in a loaded run).
    let reloaded = eventually_blocking(Duration::from_secs(10), || {
        tollgate.output().contains("config reloaded")
    });
    assert!(
        reloaded,
        "the new version never applied:\n{}",
        tollgate.output()
    );
    // Two in a row: under the old limit of 1 a minute, the second would be a 429.
    assert_eq!((ping(), ping()), (200, 200), "{}", tollgate.output());
    tollgate.signal("TERM");
    assert!(tollgate.wait_exit(Duration::from_secs(15)).success());
}

/// Receives one datagram from `socket`, at most `limit` later.
fn next_state(socket: &UnixDatagram, limit: Duration) -> String {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("a state within the limit");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn the_binary_tells_systemd_it_is_ready_once_listening_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify");
    let systemd = UnixDatagram::bind(&socket_path).unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(&config, pin_yaml(&ping_yaml(5), addr, admin, dir.path())).unwrap();
    let mut cmd = std::process::Command::new(common::BINARY);
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket_path);
    let mut tollgate = Process::spawn(cmd, addr, admin, dir.path());
    assert_eq!(next_state(&systemd, Duration::from_secs(5)), "READY=1");
    assert_eq!(http(addr, "GET", "/ping").unwrap().status, 200);
    tollgate.signal("TERM");
    assert_eq!(next_state(&systemd, Duration::from_secs(5)), "STOPPING=1");
    assert!(tollgate.wait_exit(Duration::from_secs(15)).success());
}

#[test]
fn version_names_the_crate_version_and_how_it_was_built() {
    let (status, out) = run_to_exit(&["--version".as_ref()], Duration::from_secs(10));
    assert!(status.success(), "{out}");
    let expected = format!("tollgate {} (", env!("CARGO_PKG_VERSION"));
    assert!(out.starts_with(&expected), "{out}");
    // A plain `cargo build` (these tests' binary) sets no commit: it says so.
    if option_env!("TOLLGATE_BUILD_COMMIT").is_none() {
        assert!(out.contains("built from source"), "{out}");
    }
}
