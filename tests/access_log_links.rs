//! The access log file is only ever a regular file: a symbolic link planted at its path (between logrotate's move and SIGUSR1) is not followed, and a FIFO is refused.

use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Version};
use tollgate::access::{open_file, AccessLog, AccessRecord};
use tollgate::clock::SystemClock;
use tollgate::config::{LogFormat, RefusalLog};
use tollgate::metrics::Decision;
use tollgate::request_id::RequestId;

fn record(path: &str) -> AccessRecord {
    AccessRecord {
        format: LogFormat::Text,
        time: 1_767_225_600_000_000_000,
        request_id: RequestId::from_static("r-1"),
        client: None,
        ip: "203.0.113.9".parse().unwrap(),
        method: Method::GET,
        path: Some(path.into()),
        version: Version::HTTP_11,
        route: None,
        status: 200,
        decision: Decision::Allowed,
        limiter: None,
        retry_after: None,
        upstream: None,
        upstream_ms: None,
        error_origin: None,
        duration_ms: 0.1,
        bytes_out: 0,
        referer: None,
        user_agent: None,
        rule: None,
        network: None,
        refusals: RefusalLog::Each,
    }
}

fn read(path: &Path) -> String {
    let mut s = String::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    s
}

#[test]
fn a_symlink_planted_at_the_log_path_before_sigusr1_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("access.log");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let log = AccessLog::new(Box::new(std::io::sink()), 16, Arc::new(SystemClock));
    log.to_file(log_path.clone());
    log.send(record("/before"));
    assert!(log.flush(Duration::from_secs(5)));
    assert!(read(&log_path).contains("/before"));
    // logrotate moves the file; someone plants a link before the SIGUSR1.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log_path, &rotated).unwrap();
    symlink(&victim, &log_path).unwrap();
    log.reopen();
    log.send(record("/after"));
    assert!(log.flush(Duration::from_secs(5)));
    assert_eq!(read(&victim), "precious\n", "the link was followed");
    assert_eq!(log.write_errors(), 1, "the refused reopen is counted");
    // The records go on where they went before, none lost.
    assert!(read(&rotated).contains("/after"));
}

#[test]
fn opening_the_log_refuses_a_symlink_and_a_fifo_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, "").unwrap();
    let link = dir.path().join("link.log");
    symlink(&target, &link).unwrap();
    let e = open_file(&link).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let fifo = dir.path().join("fifo.log");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Nobody reads it: without O_NONBLOCK this open would hang.
    let e = open_file(&fifo).unwrap_err();
    assert!(
        e.raw_os_error() == Some(libc::ENXIO) || e.to_string().contains("regular file"),
        "{e}"
    );
    // A regular file opens, and is created when missing.
    assert!(open_file(&dir.path().join("new.log")).is_ok());
}
