//! The SQLite store against real files: what survives a reopen, a crash, a full or locked disk.

use super::schema::{AUTO_VACUUM_INCREMENTAL, SCHEMA};
use super::*;
use crate::clock::iso8601;
use crate::config::KeyPart;
use crate::limiter::fixed_window::FixedWindow;
use crate::limiter::leaky_bucket::LeakyBucket;
use crate::limiter::sliding_window::SlidingWindow;
use crate::limiter::token_bucket::TokenBucket;
use crate::limiter::{Algorithm, NANOS_PER_SEC};
use crate::store::Check;
use rusqlite::{Connection, OptionalExtension};

fn limiter(name: &str, algorithm: Algorithm) -> LimiterConfig {
    LimiterConfig {
        name: name.into(),
        algorithm,
        key: vec![KeyPart::Client],
        shadow: false,
        overrides: vec![],
        reject: None,
        count: None,
        ban: None,
        lease: None,
    }
}

#[test]
fn counts_survive_a_reopen_in_the_spec_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let strict = Algorithm::FixedWindow(FixedWindow {
        limit: 5,
        window: 60 * NANOS_PER_SEC,
    });
    let burst = Algorithm::TokenBucket(TokenBucket {
        capacity: 3,
        interval: NANOS_PER_SEC,
        refunds: false,
    });
    let limiters = [
        limiter("strict", strict.clone()),
        limiter("burst", burst.clone()),
    ];
    let now = 1_767_225_620 * NANOS_PER_SEC;
    let open = || {
        let table = Arc::new(Table::new(true));
        let db = Sqlite::open(
            &path,
            table.clone(),
            Arc::new(Bans::new(true)),
            Duration::from_secs(3600),
            &limiters,
            now,
        )
        .unwrap();
        (table, db)
    };
    {
        let (table, db) = open();
        for _ in 0..6 {
            table.check(
                &[
                    Check {
                        key: "strict:ip:203.0.113.9",
                        overflow: "strict:*overflow",
                        algorithm: &strict,
                        shadow: false,
                    },
                    Check {
                        key: "burst:ip:203.0.113.9",
                        overflow: "burst:*overflow",
                        algorithm: &burst,
                        shadow: true,
                    },
                ],
                now,
            );
        }
        assert!(db.shutdown().is_empty());
    }
    let conn = Connection::open(&path).unwrap();
    let (start, count): (String, i64) = conn
            .query_row("SELECT window_start, count FROM rate_limit_windows WHERE key = 'strict:ip:203.0.113.9'", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
    assert_eq!((start.as_str(), count), ("2026-01-01T00:00:00Z", 6));

    let (table, _db) = open();
    assert_eq!(
        table.peek("strict:ip:203.0.113.9", &strict, now).remaining,
        0
    );
    assert_eq!(table.peek("burst:ip:203.0.113.9", &burst, now).remaining, 0);
}

fn fixed_limiter(name: &str) -> (LimiterConfig, Algorithm) {
    let a = Algorithm::FixedWindow(FixedWindow {
        limit: 100,
        window: 3600 * NANOS_PER_SEC,
    });
    (limiter(name, a.clone()), a)
}

fn count(table: &Table, key: &str, algorithm: &Algorithm, now: Nanos) {
    table.check(
        &[Check {
            key,
            overflow: "test:*overflow",
            algorithm,
            shadow: false,
        }],
        now,
    );
}

fn stored(path: &Path, key: &str) -> Option<i64> {
    let conn = Connection::open(path).unwrap();
    conn.query_row(
        "SELECT count FROM rate_limit_windows WHERE key = ?1",
        [key],
        |r| r.get(0),
    )
    .optional()
    .unwrap()
}

/// A writer that gives up on a lock after 50 ms, never flushing on its own.
fn open_quick(
    path: &Path,
    table: &Arc<Table>,
    limiters: &[LimiterConfig],
    max_unsaved: usize,
) -> Sqlite {
    let options = WriterOptions {
        flush_interval: Duration::from_secs(3600),
        busy_timeout: Duration::from_millis(50),
        max_unsaved,
    };
    Sqlite::open_with(
        path,
        table.clone(),
        Arc::new(Bans::new(true)),
        options,
        limiters,
        NOW,
    )
    .unwrap()
}

const NOW: Nanos = 1_767_225_620 * NANOS_PER_SEC;

/// A store in a fresh directory with one fixed-window limiter `l`:
/// (the directory, kept alive; the file; the limiter's algorithm; the table; the store).
fn one_limiter_store(file: &str) -> (tempfile::TempDir, PathBuf, Algorithm, Arc<Table>, Sqlite) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    let (l, a) = fixed_limiter("l");
    let table = Arc::new(Table::new(true));
    let db = open_quick(&path, &table, &[l], MAX_UNSAVED_KEYS);
    (dir, path, a, table, db)
}

#[test]
fn a_change_that_failed_to_persist_is_written_by_the_next_flush() {
    let (_dir, path, a, table, db) = one_limiter_store("f.db");
    count(&table, "l:ip:quiet", &a, NOW);
    count(&table, "l:ip:quiet", &a, NOW);
    count(&table, "l:ip:busy", &a, NOW);

    // Another program holds the write lock: the flush fails.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    assert!(db.flush().is_err(), "the flush cannot write while locked");
    let status = db.durability().status();
    assert!(!status.healthy);
    assert_eq!(status.unsaved_keys, 2);
    assert!(status.last_error.unwrap().contains("locked"));
    // A newer change made while the write was failing must win.
    count(&table, "l:ip:busy", &a, NOW);
    other.execute_batch("ROLLBACK").unwrap();

    db.flush().unwrap();
    assert_eq!(
        stored(&path, "l:ip:quiet"),
        Some(2),
        "a key that did not change again still reaches the file"
    );
    assert_eq!(stored(&path, "l:ip:busy"), Some(2), "the newest count wins");
    let status = db.durability().status();
    assert!(status.healthy && status.unsaved_keys == 0, "{status:?}");
    assert_eq!(status.write_errors_total, 1);
}

#[test]
fn keys_beyond_the_unsaved_cap_are_given_up_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let (l, a) = fixed_limiter("l");
    let table = Arc::new(Table::new(true));
    let db = open_quick(&path, &table, &[l], 2);
    for i in 0..5 {
        count(&table, &format!("l:ip:{i}"), &a, NOW);
    }
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    assert!(db.flush().is_err());
    let status = db.durability().status();
    assert_eq!((status.unsaved_keys, status.unsaved_dropped_total), (2, 3));
    assert!(status.unsaved_cap_reached);
    other.execute_batch("ROLLBACK").unwrap();
    db.flush().unwrap();
    let conn = Connection::open(&path).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM rate_limit_windows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2, "only the keys within the cap were retried");
    assert!(!db.durability().status().unsaved_cap_reached);
    // Every count is still exact in memory.
    for i in 0..5 {
        assert_eq!(table.peek(&format!("l:ip:{i}"), &a, NOW).remaining, 99);
    }
}

#[test]
fn the_last_save_says_what_a_locked_file_did_not_take() {
    let (_dir, path, a, table, db) = one_limiter_store("s.db");
    for i in 0..3 {
        count(&table, &format!("l:ip:{i}"), &a, NOW);
    }
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let unsaved = db.shutdown();
    assert_eq!(unsaved.keys, 3);
    assert_eq!(unsaved.sample.len(), 3);
    assert_eq!(db.shutdown(), unsaved, "asked again, the same answer");
}

#[test]
fn a_file_deleted_under_the_writer_is_made_again_with_every_live_counter() {
    let (_dir, path, a, table, db) = one_limiter_store("d.db");
    count(&table, "l:ip:old", &a, NOW);
    db.flush().unwrap();
    std::fs::remove_file(&path).unwrap();
    count(&table, "l:ip:new", &a, NOW);
    db.flush().unwrap();
    assert_eq!(stored(&path, "l:ip:old"), Some(1), "rewritten from memory");
    assert_eq!(stored(&path, "l:ip:new"), Some(1));
}

#[test]
fn a_file_that_is_not_a_database_is_refused_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.db");
    std::fs::write(&path, vec![0x5a; 10_000]).unwrap();
    let err = Sqlite::open(
        &path,
        Arc::new(Table::new(true)),
        Arc::new(Bans::new(true)),
        Duration::from_secs(1),
        &[],
        NOW,
    )
    .err()
    .expect("refused");
    assert_eq!(err.kind, StoreFailure::Corrupt, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("move it aside"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![0x5a; 10_000],
        "left untouched"
    );
}

#[test]
fn a_second_store_on_the_same_file_is_refused_while_the_first_keeps_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.db");
    let (l, a) = fixed_limiter("l");
    let table = Arc::new(Table::new(true));
    let first = open_quick(&path, &table, std::slice::from_ref(&l), MAX_UNSAVED_KEYS);
    let err = Sqlite::open(
        &path,
        Arc::new(Table::new(true)),
        Arc::new(Bans::new(true)),
        Duration::from_secs(1),
        &[l],
        NOW,
    )
    .err()
    .expect("the second is refused");
    assert_eq!(err.kind, StoreFailure::InUse, "{err}");
    count(&table, "l:ip:a", &a, NOW);
    first.flush().unwrap();
    assert_eq!(stored(&path, "l:ip:a"), Some(1));
}

fn file_bytes(path: &Path) -> u64 {
    let size = |p: PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    size(path.to_path_buf()) + size(PathBuf::from(wal))
}

/// The first frame written to an empty WAL costs an fsync (of the WAL, and of
/// its directory when the file is new). Paid at open, it never holds up the
/// first flush of counted traffic, which a `kill -9` would then lose whole.
#[test]
fn a_store_opened_on_an_empty_wal_writes_its_header_before_any_flush() {
    let (dir, path, _a, _table, db) = one_limiter_store("w.db");
    let wal = dir.path().join("w.db-wal");
    drop(db);
    // The last connection closed: SQLite checkpointed and removed the WAL.
    assert!(!wal.exists(), "a clean close leaves no WAL behind");

    let (l, _) = fixed_limiter("l");
    let _db = open_quick(&path, &Arc::new(Table::new(true)), &[l], MAX_UNSAVED_KEYS);
    let bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(
        bytes >= 32,
        "nothing counted, nothing flushed, yet the WAL holds its 32-byte header and a frame: {bytes} bytes"
    );
}

#[test]
fn the_file_shrinks_back_after_a_key_flood_expires_and_is_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flood.db");
    let window = 60 * NANOS_PER_SEC;
    let a = Algorithm::FixedWindow(FixedWindow { limit: 5, window });
    let limiters = [limiter("l", a.clone())];
    let table = Arc::new(Table::new(true));
    let db = open_quick(&path, &table, &limiters, MAX_UNSAVED_KEYS);
    db.flush().unwrap();
    let empty = file_bytes(&path);
    for i in 0..50_000 {
        count(
            &table,
            &format!("l:ip:198.51.{}.{}", i / 250, i % 250),
            &a,
            NOW,
        );
    }
    db.flush().unwrap();
    let flooded = file_bytes(&path);
    assert!(flooded > 2_000_000, "the flood is on disk: {flooded} bytes");
    // Two windows later every key has expired.
    let later = NOW + 3 * window;
    table.remove_where(|_, expires_at| expires_at <= later);
    db.prune(later, &limiters, None);
    db.flush().unwrap(); // after the prune, in order
    let after = file_bytes(&path);
    eprintln!("file + WAL: empty {empty} B, 50k keys {flooded} B, after they expired and a prune {after} B");
    assert!(
        after < flooded / 10 && after < empty + 200_000,
        "empty {empty}, flooded {flooded}, after the prune {after} bytes"
    );
}

#[test]
fn a_file_made_without_auto_vacuum_is_converted_once_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        // As an older tollgate made it: the schema, no auto-vacuum.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn.execute(
            "INSERT INTO rate_limit_windows (key, window_start, count) VALUES ('l:ip:kept', ?1, 4)",
            [iso8601(NOW / NANOS_PER_SEC - NOW / NANOS_PER_SEC % 3600)],
        )
        .unwrap();
    }
    let (l, a) = fixed_limiter("l");
    let table = Arc::new(Table::new(true));
    let db = open_quick(&path, &table, &[l], MAX_UNSAVED_KEYS);
    assert_eq!(table.peek("l:ip:kept", &a, NOW).remaining, 96, "loaded");
    drop(db);
    let conn = Connection::open(&path).unwrap();
    let mode: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, AUTO_VACUUM_INCREMENTAL);
    assert_eq!(stored(&path, "l:ip:kept"), Some(4));
}

#[test]
fn a_file_from_before_request_ids_gets_the_column_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
                "CREATE TABLE api_calls (id INTEGER PRIMARY KEY, time TEXT NOT NULL, client TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, route TEXT NOT NULL, status INTEGER NOT NULL, duration_ms REAL NOT NULL);
                 INSERT INTO api_calls (time, client, method, path, route, status, duration_ms) VALUES ('2026-01-01T00:00:00Z', 'ip:1.2.3.4', 'GET', '/', 'r', 200, 1.0);",
            )
            .unwrap();
    }
    let db = Sqlite::open(
        &path,
        Arc::new(Table::new(true)),
        Arc::new(Bans::new(true)),
        Duration::from_secs(3600),
        &[],
        0,
    )
    .unwrap();
    db.audit(AuditRow {
        time: 0,
        client: "ip:203.0.113.9".into(),
        method: http::Method::GET,
        path: "/".into(),
        route: "r".into(),
        status: 429,
        duration: Duration::ZERO,
        request_id: "rid-7".into(),
    });
    db.flush().unwrap();
    let conn = Connection::open(&path).unwrap();
    let ids: Vec<Option<String>> = conn
        .prepare("SELECT request_id FROM api_calls ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids, vec![None, Some("rid-7".to_string())]);
    drop(db);
    // Opening again finds the column and leaves it alone.
    Sqlite::open(
        &path,
        Arc::new(Table::new(true)),
        Arc::new(Bans::new(true)),
        Duration::from_secs(3600),
        &[],
        0,
    )
    .unwrap();
}

#[test]
fn audit_rows_beyond_the_queue_are_dropped_and_counted_never_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let table = Arc::new(Table::new(true));
    // A flush interval of an hour: nothing drains the buffer meanwhile.
    let db = Sqlite::open(
        &dir.path().join("a.db"),
        table,
        Arc::new(Bans::new(true)),
        Duration::from_secs(3600),
        &[],
        0,
    )
    .unwrap();
    let row = AuditRow {
        time: 0,
        client: "ip:203.0.113.9".into(),
        method: http::Method::GET,
        path: "/".into(),
        route: "r".into(),
        status: 200,
        duration: Duration::ZERO,
        request_id: "abc-1".into(),
    };
    for _ in 0..AUDIT_QUEUE + 3 {
        db.audit(row.clone());
    }
    assert_eq!(db.audit_dropped(), 3);
    db.flush().unwrap();
    let conn = Connection::open(dir.path().join("a.db")).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM api_calls", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        rows, AUDIT_QUEUE as i64,
        "the queued rows all reached the file"
    );
}

#[test]
fn a_flush_of_any_size_writes_every_audit_row_with_its_own_fields_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = Sqlite::open(
        &dir.path().join("a.db"),
        Arc::new(Table::new(true)),
        Arc::new(Bans::new(true)),
        Duration::from_secs(3600),
        &[],
        0,
    )
    .unwrap();
    // 64 + 16 + 4 + 3: every statement size the writer uses, and a remainder.
    let n = 87;
    for i in 0..n {
        db.audit(AuditRow {
            time: i * NANOS_PER_SEC,
            client: format!("ip:203.0.113.{i}").into(),
            method: if i % 2 == 0 {
                http::Method::GET
            } else {
                http::Method::POST
            },
            path: format!("/p/{i}").into(),
            route: format!("r{i}").into(),
            status: 200 + i as u16,
            duration: Duration::from_micros(1500 * i),
            request_id: format!("id-{i}").into(),
        });
    }
    db.flush().unwrap();
    let rows = audit_rows(&dir.path().join("a.db"));
    assert_eq!(rows.len(), n as usize);
    for (i, row) in rows.iter().enumerate() {
        let i = i as u64;
        let method = if i.is_multiple_of(2) { "GET" } else { "POST" };
        assert_eq!(
            row,
            &(
                iso8601(i),
                format!("ip:203.0.113.{i}"),
                method.to_string(),
                format!("/p/{i}"),
                format!("r{i}"),
                200 + i as i64,
                1.5 * i as f64,
                format!("id-{i}")
            )
        );
    }
}

/// The `api_calls` rows of the file at `path`, in the order written:
/// time, client, method, path, route, status, duration_ms, request_id.
type AuditRead = (String, String, String, String, String, i64, f64, String);

fn audit_rows(path: &Path) -> Vec<AuditRead> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT time, client, method, path, route, status, duration_ms, request_id FROM api_calls ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Little-endian `u64`s, as the `limiter_state.state` blob holds them.
fn blob(words: &[Nanos]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Writes, as earlier versions laid them out, a window row for `f:ip:a` (4
/// counted, 20 s before `NOW` into its minute) and one `limiter_state` row
/// per `(key, algorithm name, algorithm, words, expires_at)`.
fn write_earlier_rows(path: &std::path::Path, rows: &[(&str, &str, &Algorithm, Vec<u64>, Nanos)]) {
    let s = NANOS_PER_SEC;
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    conn.execute(
        "INSERT INTO rate_limit_windows (key, window_start, count) VALUES ('f:ip:a', ?1, 4)",
        [iso8601(NOW / s - 20)],
    )
    .unwrap();
    let mut insert = conn
        .prepare("INSERT INTO limiter_state (key, algorithm, shape, state, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)")
        .unwrap();
    for (key, name, algorithm, words, expires_at) in rows {
        let shape = algorithm.shape().fingerprint().to_string();
        insert
            .execute(rusqlite::params![
                key,
                name,
                shape,
                blob(words),
                *expires_at as i64
            ])
            .unwrap();
    }
}

/// One limiter of each algorithm whose state a restart keeps: fixed
/// window (5 a minute), sliding window (3 a minute), token bucket (3, one a
/// second) and leaky bucket (2, one a second).
fn kept_algorithms() -> [Algorithm; 4] {
    let s = NANOS_PER_SEC;
    [
        Algorithm::FixedWindow(FixedWindow {
            limit: 5,
            window: 60 * s,
        }),
        Algorithm::SlidingWindow(SlidingWindow {
            limit: 3,
            window: 60 * s,
        }),
        Algorithm::TokenBucket(TokenBucket {
            capacity: 3,
            interval: s,
            refunds: false,
        }),
        Algorithm::LeakyBucket(LeakyBucket {
            capacity: 2,
            interval: s,
        }),
    ]
}

/// Files already on disk are a contract: rows laid out byte for byte as
/// earlier versions wrote them (a window row; a blob of little-endian words
/// under the algorithm's name and shape) load back into the same state.
#[test]
fn rows_in_the_stored_format_restore_the_state_of_every_kept_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("earlier.db");
    let s = NANOS_PER_SEC;
    let [fixed, sliding, bucket, queue] = kept_algorithms();
    write_earlier_rows(
        &path,
        &[
            (
                "s:ip:a",
                "sliding_window",
                &sliding,
                vec![NOW - 10 * s, NOW - 5 * s],
                NOW + 55 * s,
            ),
            (
                "t:ip:a",
                "token_bucket",
                &bucket,
                vec![NOW + 3 * s],
                NOW + 3 * s,
            ),
            (
                "q:ip:a",
                "leaky_bucket",
                &queue,
                vec![NOW + 2 * s],
                NOW + 2 * s,
            ),
        ],
    );
    let limiters = [
        limiter("f", fixed.clone()),
        limiter("s", sliding.clone()),
        limiter("t", bucket.clone()),
        limiter("q", queue.clone()),
    ];
    let table = Arc::new(Table::new(true));
    let _db = open_quick(&path, &table, &limiters, MAX_UNSAVED_KEYS);
    let remaining = |key: &str, a: &Algorithm| table.peek(key, a, NOW).remaining;
    for (limiter, a, restored, fresh) in [
        ("f", &fixed, 1, 5),
        ("s", &sliding, 1, 3),
        ("t", &bucket, 0, 3),
        ("q", &queue, 1, 2),
    ] {
        assert_eq!(
            remaining(&format!("{limiter}:ip:a"), a),
            restored,
            "{limiter}: the stored state"
        );
        assert_eq!(
            remaining(&format!("{limiter}:ip:b"), a),
            fresh,
            "{limiter}: a key never stored"
        );
    }
}
