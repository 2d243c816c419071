//! SQLite store faults, on real files and the real binary: a disk that fills up and frees, a
//! read-only volume, a file deleted or replaced under a running tollgate, a corrupt or truncated
//! file at start, another program holding the write lock, and a second tollgate on the same file.
//!
//! Tests that need a filesystem of their own mount a small tmpfs (root only):
//! without permission they skip loudly, and with `TOLLGATE_REQUIRE_MOUNTS=1`
//! (CI) they fail instead.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::tmpfs::Tmpfs;
use common::{
    eventually_blocking, http, http_with, metric, run_to_exit, wait_for_window_room, Process, Reply,
};

/// A day-long window: a scenario of seconds almost never has to wait for room in it.
const WINDOW: Duration = Duration::from_secs(86_400);

/// Two requests per hour per `X-User`, with the SQLite file at `db`.
fn two_per_user(db: &Path) -> String {
    format!(
        "store: {{ path: \"{}\", flush_interval: 100ms }}\nlimiters:\n  two: {{ limit: 2, window: 86400s, key: \"header:X-User\" }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [two] }}\n",
        db.display()
    )
}

fn hit(p: &Process, user: &str) -> u16 {
    http_with(p.addr, "GET", "/ping", &[("X-User", user)])
        .unwrap_or_else(|e| panic!("no answer for {user}: {e}\n{}", p.output()))
        .status
}

fn admin(p: &Process, path: &str) -> Reply {
    http(p.admin, "GET", path).unwrap_or_else(|e| panic!("{path}: {e}\n{}", p.output()))
}

/// Every stored fixed-window count, by the user it belongs to (the key's last `:` part).
fn stored(db: &Path) -> HashMap<String, i64> {
    try_stored(db).unwrap_or_else(|e| panic!("reading {}: {e}", db.display()))
}

/// [`stored`], or nothing while the file is missing or not (yet) tollgate's.
fn stored_or_empty(db: &Path) -> HashMap<String, i64> {
    if !db.exists() {
        return HashMap::new(); // opening it would create it
    }
    try_stored(db).unwrap_or_default()
}

fn try_stored(db: &Path) -> rusqlite::Result<HashMap<String, i64>> {
    let conn = rusqlite::Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mut stmt = conn.prepare("SELECT key, count FROM rate_limit_windows")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    rows.map(|r| r.map(|(k, c)| (k.rsplit(':').next().unwrap_or("").to_string(), c)))
        .collect()
}

fn ready(p: &Process) -> (u16, serde_json::Value) {
    let r = admin(p, "/readyz");
    (r.status, r.json())
}

fn users(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// Three requests per user: limits stay exact in memory whatever the disk does.
fn three_each(p: &Process, users: &[String]) {
    for u in users {
        let got: Vec<u16> = (0..3).map(|_| hit(p, u)).collect();
        assert_eq!(got, [200, 200, 429], "{u}");
    }
}

fn serve_args(config: &Path) -> Vec<&OsStr> {
    vec![
        OsStr::new("serve"),
        OsStr::new("--config"),
        config.as_os_str(),
    ]
}

/// `/readyz` and `/metrics` report the store failing on a full disk, with
/// at least the 40 outage keys unsaved.
fn assert_store_reports_the_full_disk(p: &Process) {
    let (_, body) = ready(p);
    assert_eq!(body["store"]["healthy"], false, "{body}");
    assert!(
        body["store"]["last_error"]
            .as_str()
            .unwrap()
            .contains("full"),
        "{body}"
    );
    let m = admin(p, "/metrics").body;
    assert_eq!(metric(&m, "tollgate_store_healthy "), Some(0.0), "{m}");
    assert!(
        metric(&m, "tollgate_store_errors_total{backend=\"sqlite\"").unwrap() >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "tollgate_store_unsaved_keys ").unwrap() >= 40.0,
        "{m}"
    );
}

#[test]
fn a_disk_that_fills_up_keeps_limits_exact_reports_failing_and_saves_every_counter_once_freed() {
    let Some(disk) = Tmpfs::mount("4m", "disk full then freed") else {
        return;
    };
    wait_for_window_room(WINDOW, Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let db = disk.path().join("t.db");
    let mut p = Process::serve(&two_per_user(&db), dir.path());
    assert_eq!(hit(&p, "early"), 200);
    assert!(
        eventually_blocking(Duration::from_secs(5), || {
            stored(&db).get("early") == Some(&1)
        }),
        "the first count is saved"
    );

    let filler = disk.fill();
    let full = users(40, "full");
    three_each(&p, &full);
    assert!(
        eventually_blocking(Duration::from_secs(10), || ready(&p).0 == 503),
        "/readyz reports the store failing"
    );
    // `unsaved_keys` is as of the last failed attempt, and attempts back off.
    assert!(
        eventually_blocking(Duration::from_secs(15), || ready(&p).1["store"]
            ["unsaved_keys"]
            .as_u64()
            .unwrap()
            >= 40),
        "every outage key waits for a retry"
    );
    assert_store_reports_the_full_disk(&p);
    let on_disk = stored(&db);
    assert!(
        full.iter().all(|u| !on_disk.contains_key(u)),
        "nothing reached the full disk"
    );

    std::fs::remove_file(filler).unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(15), || ready(&p).0 == 200),
        "the store recovers once the disk has room"
    );
    let on_disk = stored(&db);
    for u in &full {
        assert_eq!(
            on_disk.get(u),
            Some(&3),
            "{u} reached the file after recovery"
        );
    }
    assert_eq!(ready(&p).1["store"]["unsaved_keys"], 0);
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status}\n{}", p.output());

    let again = Process::serve(&two_per_user(&db), dir.path());
    assert_eq!(
        hit(&again, "full-7"),
        429,
        "the restart knows the outage's counts"
    );
}

#[test]
fn sigterm_on_a_full_disk_exits_non_zero_and_names_what_was_not_saved() {
    let Some(disk) = Tmpfs::mount("4m", "SIGTERM on a full disk") else {
        return;
    };
    wait_for_window_room(WINDOW, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let db = disk.path().join("t.db");
    let mut p = Process::serve(&two_per_user(&db), dir.path());
    disk.fill();
    three_each(&p, &users(5, "lost"));
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(20));
    let out = p.output();
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("5 limiter key(s)") && out.contains(&db.display().to_string()),
        "the exit message says what was not saved and where:\n{out}"
    );
    assert!(
        out.contains("lost-"),
        "the log names some of the keys:\n{out}"
    );
}

#[test]
fn a_second_tollgate_on_the_same_file_refuses_to_start_and_the_first_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let yaml = two_per_user(&db);
    let first = Process::serve(&yaml, dir.path());

    let other = tempfile::tempdir().unwrap();
    let config = other.path().join("tollgate.yaml");
    let (a, b) = (common::free_addr(), common::free_addr());
    std::fs::write(&config, common::pin_yaml(&yaml, a, b, other.path())).unwrap();
    let (status, out) = run_to_exit(&serve_args(&config), Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("another process is already using the SQLite store")
            && out.contains(&db.display().to_string()),
        "the error names the file:\n{out}"
    );

    let check = [
        OsStr::new("check"),
        OsStr::new("--config"),
        config.as_os_str(),
    ];
    let (status, out) = run_to_exit(&check, Duration::from_secs(20));
    assert!(status.success(), "check does not take the lock:\n{out}");

    assert_eq!(hit(&first, "still"), 200);
    assert!(
        eventually_blocking(Duration::from_secs(5), || stored(&db).get("still")
            == Some(&1)),
        "the first still writes the file"
    );
}

#[test]
fn a_read_only_volume_at_start_is_refused_with_an_error_naming_the_file() {
    let Some(disk) = Tmpfs::mount("4m", "read-only volume") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = disk.path().join("t.db");
    let yaml = two_per_user(&db);
    let mut p = Process::serve(&yaml, dir.path());
    assert_eq!(hit(&p, "ro"), 200);
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(15)).success());

    assert!(disk.remount("ro"), "remount read-only");
    let config = dir.path().join("tollgate.yaml");
    let (status, out) = run_to_exit(&serve_args(&config), Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(&db.display().to_string()) && out.contains("Read-only file system"),
        "the error names the file and the cause:\n{out}"
    );
    assert!(disk.remount("rw"));
    assert_eq!(stored(&db).get("ro"), Some(&1), "the file is intact");
}

#[test]
fn a_file_deleted_under_a_running_tollgate_is_made_again_with_every_live_counter() {
    wait_for_window_room(WINDOW, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let p = Process::serve(&two_per_user(&db), dir.path());
    three_each(&p, &users(3, "before"));
    assert!(
        eventually_blocking(Duration::from_secs(5), || stored(&db).len() == 3),
        "saved"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    assert_eq!(hit(&p, "after"), 200);
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            p.output().contains("was deleted under the running process")
        }),
        "tollgate notices"
    );
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            let on_disk = stored_or_empty(&db);
            on_disk.get("after") == Some(&1)
                && users(3, "before")
                    .iter()
                    .all(|u| on_disk.get(u) == Some(&3))
        }),
        "the file is back with every counter"
    );
}

#[test]
fn a_file_replaced_under_a_running_tollgate_gets_every_live_counter_written_to_it() {
    wait_for_window_room(WINDOW, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let p = Process::serve(&two_per_user(&db), dir.path());
    three_each(&p, &users(3, "mine"));
    assert!(
        eventually_blocking(Duration::from_secs(5), || stored(&db).len() == 3),
        "saved"
    );
    // Someone restores an old copy over the live file.
    let old = dir.path().join("old.db");
    rusqlite::Connection::open(&old)
        .unwrap()
        .execute_batch("CREATE TABLE unrelated (x)")
        .unwrap();
    std::fs::rename(&old, &db).unwrap();
    // Nothing here reads the new file before tollgate has let go of the old
    // one's `-wal` (a reader would see the old WAL against the new file).
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            p.output().contains("SQLite file open again")
        }),
        "tollgate notices"
    );
    assert!(
        p.output()
            .contains("was replaced under the running process"),
        "{}",
        p.output()
    );
    assert_eq!(hit(&p, "later"), 200);
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            let on_disk = stored_or_empty(&db);
            on_disk.get("later") == Some(&1)
                && users(3, "mine").iter().all(|u| on_disk.get(u) == Some(&3))
        }),
        "the new file holds every live counter"
    );
}

#[test]
fn a_corrupt_or_truncated_file_at_start_is_refused_with_a_clear_error_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let yaml = two_per_user(&db);

    // A real file with enough rows to span many pages, closed cleanly, then cut in half.
    let mut p = Process::serve(&yaml, dir.path());
    for u in users(300, "row") {
        assert_eq!(hit(&p, &u), 200);
    }
    p.signal("TERM");
    assert!(
        p.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        p.output()
    );
    let whole = std::fs::read(&db).unwrap();
    assert!(whole.len() > 16 * 1024, "{} bytes", whole.len());
    let config = dir.path().join("tollgate.yaml");

    for (what, bytes) in [
        ("truncated", whole[..whole.len() / 2].to_vec()),
        ("garbage", vec![0x5a; whole.len()]),
    ] {
        std::fs::write(&db, &bytes).unwrap();
        let (status, out) = run_to_exit(&serve_args(&config), Duration::from_secs(20));
        assert_eq!(status.code(), Some(1), "{what}: {out}");
        assert!(
            out.contains("is corrupt or not a tollgate database")
                && out.contains(&db.display().to_string())
                && out.contains("move it aside"),
            "{what}: a clear error that names the file and the way out:\n{out}"
        );
        assert_eq!(
            std::fs::read(&db).unwrap(),
            bytes,
            "{what}: the file is left as it was"
        );
    }
}

#[test]
fn another_program_holding_the_write_lock_for_10s_delays_no_request_and_loses_no_count() {
    wait_for_window_room(WINDOW, Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let p = Process::serve(&two_per_user(&db), dir.path());
    assert_eq!(hit(&p, "first"), 200);
    assert!(
        eventually_blocking(Duration::from_secs(5), || {
            stored(&db).contains_key("first")
        }),
        "saved"
    );

    use std::io::{BufRead, Write};
    let mut sqlite3 = std::process::Command::new("sqlite3")
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("these tests need the sqlite3 CLI (apt-get install sqlite3)");
    let mut stdin = sqlite3.stdin.take().unwrap();
    writeln!(stdin, "BEGIN EXCLUSIVE;\nSELECT 'locked';").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(sqlite3.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let locked_at = Instant::now();

    let during = users(20, "locked");
    let mut slowest = Duration::ZERO;
    for u in &during {
        let started = Instant::now();
        let got: Vec<u16> = (0..3).map(|_| hit(&p, u)).collect();
        slowest = slowest.max(started.elapsed() / 3);
        assert_eq!(got, [200, 200, 429], "{u}");
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a request waited on the lock: {slowest:?}"
    );
    assert!(
        eventually_blocking(Duration::from_secs(9), || { ready(&p).0 == 503 }),
        "/readyz reports the lock"
    );
    assert!(
        ready(&p).1["store"]["last_error"]
            .as_str()
            .unwrap()
            .contains("locked"),
        "{}",
        ready(&p).1
    );
    std::thread::sleep(Duration::from_secs(10).saturating_sub(locked_at.elapsed()));
    writeln!(stdin, "COMMIT;").unwrap();
    drop(stdin);
    assert!(sqlite3.wait().unwrap().success());

    assert!(
        eventually_blocking(Duration::from_secs(15), || {
            let on_disk = stored(&db);
            during.iter().all(|u| on_disk.get(u) == Some(&3))
        }),
        "every count reaches the file once the lock is gone"
    );
    assert_eq!(ready(&p).0, 200);
}
