//! `log.access_file` on the real binary: logrotate's move-then-SIGUSR1 loses no record, a full disk is counted and survived, and a file that cannot be opened stops the start.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::tmpfs::Tmpfs;
use common::{eventually_blocking, http, metric, run_to_exit, Process};

fn yaml(access_file: &std::path::Path) -> String {
    format!(
        r#"log: {{ format: json, access_file: "{}" }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }} }}
"#,
        access_file.display()
    )
}

/// The `path` of every JSON record in `file` (none if it does not exist).
fn paths(file: &std::path::Path) -> Vec<String> {
    let (paths, torn) = records(file);
    assert!(torn.is_empty(), "lines that are not records: {torn:?}");
    paths
}

/// The `path` of every JSON record in `file`, and the lines that are not one.
fn records(file: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let mut paths = Vec::new();
    let mut torn = Vec::new();
    for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => paths.push(v["path"].as_str().unwrap().to_string()),
            Err(_) => torn.push(line.to_string()),
        }
    }
    (paths, torn)
}

fn metrics(p: &Process) -> String {
    http(p.admin, "GET", "/metrics").unwrap().body
}

#[test]
fn moving_the_file_and_sending_sigusr1_continues_in_a_new_file_without_losing_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let p = Process::serve(&yaml(&log), dir.path());

    // Traffic flows the whole time: one client, one request after another.
    const REQUESTS: usize = 1_500;
    let sent = Arc::new(AtomicUsize::new(0));
    let traffic = {
        let (addr, sent) = (p.addr, sent.clone());
        std::thread::spawn(move || {
            for i in 0..REQUESTS {
                let reply = http(addr, "GET", &format!("/r/{i}")).expect("tollgate answers");
                assert_eq!(reply.status, 200);
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Two rotations while requests are in flight, as logrotate does them.
    let mut rotated = Vec::new();
    for n in 1..=2 {
        let at = n * REQUESTS / 3;
        assert!(
            eventually_blocking(Duration::from_secs(60), || sent.load(Ordering::SeqCst)
                >= at),
            "traffic stalled before rotation {n}"
        );
        let moved = dir.path().join(format!("access.log.{n}"));
        std::fs::rename(&log, &moved).unwrap();
        p.signal("USR1");
        rotated.push(moved);
        // The new file appears with the writer's next batch.
        assert!(
            eventually_blocking(Duration::from_secs(10), || log.exists()),
            "no new access.log after SIGUSR1 {n}:\n{}",
            p.output()
        );
    }
    traffic.join().unwrap();

    let files: Vec<_> = rotated.iter().chain([&log]).cloned().collect();
    let complete = eventually_blocking(Duration::from_secs(10), || {
        files.iter().map(|f| paths(f).len()).sum::<usize>() >= REQUESTS
    });
    let per_file: Vec<Vec<String>> = files.iter().map(|f| paths(f)).collect();
    let counts: Vec<usize> = per_file.iter().map(Vec::len).collect();
    assert!(complete, "records per file {counts:?}, {REQUESTS} requests");
    assert_eq!(counts.iter().sum::<usize>(), REQUESTS, "{counts:?}");
    assert!(
        counts.iter().all(|&c| c > 0),
        "every file holds records: {counts:?}"
    );
    // Each request exactly once, and the files in order: a file's records
    // all came before the next file's.
    let all: Vec<String> = per_file.concat();
    let unique: BTreeSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), REQUESTS, "a record is duplicated");
    let expected: Vec<String> = (0..REQUESTS).map(|i| format!("/r/{i}")).collect();
    assert_eq!(all, expected, "records out of order across the rotation");
    assert_eq!(
        metric(&metrics(&p), "tollgate_access_log_dropped_total "),
        Some(0.0)
    );
    assert!(
        p.output()
            .contains("SIGUSR1: reopening the access log file"),
        "{}",
        p.output()
    );
}

#[test]
fn a_full_disk_drops_and_counts_records_and_the_log_resumes_when_space_returns() {
    let Some(disk) = Tmpfs::mount("1m", "access log on a full disk") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = disk.path().join("access.log");
    let p = Process::serve(&yaml(&log), dir.path());
    assert_eq!(http(p.addr, "GET", "/before").unwrap().status, 200);
    assert!(eventually_blocking(Duration::from_secs(5), || paths(&log)
        .contains(&"/before".to_string())));

    let filler = disk.fill();
    for i in 0..20 {
        // Requests never wait on the log: every one is answered.
        assert_eq!(
            http(p.addr, "GET", &format!("/full/{i}")).unwrap().status,
            200
        );
    }
    let counted = eventually_blocking(Duration::from_secs(5), || {
        let m = metrics(&p);
        metric(&m, "tollgate_access_log_write_errors_total ").unwrap_or(0.0) >= 1.0
            && metric(&m, "tollgate_access_log_dropped_total ").unwrap_or(0.0) >= 1.0
    });
    assert!(counted, "{}", metrics(&p));
    assert!(
        p.output().contains("cannot write the access log"),
        "{}",
        p.output()
    );

    std::fs::remove_file(filler).unwrap();
    let resumed = eventually_blocking(Duration::from_secs(10), || {
        let _ = http(p.addr, "GET", "/after");
        records(&log).0.contains(&"/after".to_string())
    });
    assert!(resumed, "{}", p.output());
    // The disk filled up in the middle of a write: at most that one record
    // is cut short, and it is ended, so every record after it is whole.
    let (_, torn) = records(&log);
    assert!(torn.len() <= 1, "{torn:?}");
    assert!(
        torn.iter().all(|l| l.starts_with('{')),
        "a torn line is a record's start: {torn:?}"
    );
}

#[test]
fn an_access_file_that_cannot_be_opened_stops_the_start_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("no-such-dir").join("access.log");
    let config = dir.path().join("tollgate.yaml");
    let (a, b) = (common::free_addr(), common::free_addr());
    std::fs::write(&config, common::pin_yaml(&yaml(&log), a, b, dir.path())).unwrap();
    let args = [
        OsStr::new("serve"),
        OsStr::new("--config"),
        config.as_os_str(),
    ];
    let (status, out) = run_to_exit(&args, Duration::from_secs(20));
    assert!(!status.success(), "{out}");
    assert!(
        out.contains("log.access_file") && out.contains(&log.display().to_string()),
        "{out}"
    );
}
