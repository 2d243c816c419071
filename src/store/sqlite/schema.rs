//! The SQLite file itself: opening it with tollgate's settings and schema, and reading live state back at start.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};

use crate::config::store::{RawSqlite, Section};
use crate::store::ban;
use crate::store::table::{Loaded, Table};
use crate::store::{StoreError, StoreFailure};
use crate::clock::parse_iso8601;
use crate::config::LimiterConfig;
use crate::limiter::{Algorithm, Kept, Nanos, State, NANOS_PER_SEC};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rate_limit_windows (
    key          TEXT    NOT NULL,
    window_start TEXT    NOT NULL, -- ISO 8601 UTC, e.g. 2026-01-01T00:00:00Z
    count        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, window_start)
);
CREATE INDEX IF NOT EXISTS rate_limit_windows_key_window ON rate_limit_windows (key, window_start);
CREATE TABLE IF NOT EXISTS limiter_state (
    key        TEXT    NOT NULL PRIMARY KEY,
    algorithm  TEXT    NOT NULL,
    shape      TEXT    NOT NULL, -- fingerprint of the window or rate the state was built under
    state      BLOB    NOT NULL, -- little-endian u64 nanosecond values
    expires_at INTEGER NOT NULL  -- Unix ns
);
CREATE TABLE IF NOT EXISTS api_calls (
    id          INTEGER PRIMARY KEY,
    time        TEXT    NOT NULL, -- ISO 8601 UTC
    client      TEXT    NOT NULL, -- ip:… or key:<hash prefix>…, never a plain API key
    method      TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    status      INTEGER NOT NULL,
    duration_ms REAL    NOT NULL,
    request_id  TEXT              -- X-Request-Id, as in the access log
);
CREATE INDEX IF NOT EXISTS api_calls_time ON api_calls (time);
";

/// Files written before request ids existed get the column (empty for old rows).
fn add_request_id_column(conn: &Connection) -> rusqlite::Result<()> {
    let has = conn
        .prepare("SELECT 1 FROM pragma_table_info('api_calls') WHERE name = 'request_id'")?
        .exists([])?;
    if !has {
        conn.execute_batch("ALTER TABLE api_calls ADD COLUMN request_id TEXT")?;
    }
    Ok(())
}
/// Opens the file with tollgate's settings and schema.
pub(super) fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let err = |e| open_error(path, e);
    let conn = Connection::open(path).map_err(err)?;
    conn.busy_timeout(busy_timeout).map_err(err)?;
    // Incremental auto-vacuum lets a prune give free pages back to the
    // filesystem. It can only be chosen before the first table exists; a file
    // made without it is converted once, by a full VACUUM.
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(err)?;
    let auto_vacuum: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .map_err(err)?;
    if auto_vacuum != AUTO_VACUUM_INCREMENTAL {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(err)?;
        if tables > 0 {
            let started = Instant::now();
            match conn.execute_batch("VACUUM") {
                Ok(()) => tracing::info!(
                    path = %path.display(),
                    took_ms = started.elapsed().as_millis() as u64,
                    "converted the SQLite store to incremental auto-vacuum (once)"
                ),
                // Not fatal: the file then keeps its size after a prune.
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "cannot convert the SQLite store to incremental auto-vacuum; it will not shrink after a prune"
                ),
            }
        }
    }
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(err)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(err)?;
    // After a checkpoint, a WAL that grew during a burst is cut back to this.
    conn.pragma_update(None, "journal_size_limit", 16 * 1024 * 1024)
        .map_err(err)?;
    conn.execute_batch(SCHEMA).map_err(err)?;
    conn.execute_batch(ban::SCHEMA).map_err(err)?;
    add_request_id_column(&conn).map_err(err)?;
    prime_wal(&conn).map_err(err)?;
    Ok(conn)
}

/// Writes the WAL's header now, at open, instead of in the first flush.
///
/// The first frame written to an empty WAL makes SQLite fsync it (and, for a
/// new `-wal` file, its directory). Left to the first flush, that fsync ran
/// with traffic already counted: on a busy disk it took over 370 ms, the
/// first flush committed that late, and a `kill -9` meanwhile lost every
/// admission since the start, well over one flush interval. Writing page 1
/// unchanged (`user_version` set to itself) pays the sync before the store
/// takes traffic; a WAL that already holds frames is only appended to.
fn prime_wal(conn: &Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    conn.pragma_update(None, "user_version", version)
}

pub(super) const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// A file SQLite cannot read as a database is reported as such, with what to do.
pub(super) fn open_error(path: &Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            let path = path.display();
            let context = format!(
                "the SQLite store {path} is corrupt or not a tollgate database ({source}); \
                 tollgate does not overwrite it: move it aside (e.g. `mv {path} {path}.bad`) \
                 to start with empty counters, or restore a backup"
            );
            StoreError::new(StoreFailure::Corrupt, RawSqlite::NAME, context).because(source)
        }
        _ => {
            let context = format!("cannot open the SQLite store {}: {source}", path.display());
            StoreError::new(StoreFailure::Open, RawSqlite::NAME, context).because(source)
        }
    }
}

/// (device, inode) of the file at `path`, if there is one.
pub(super) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A [`Kept::Words`] state as its `limiter_state` row: the algorithm's name and the blob.
pub(super) fn encode(state: &State) -> (&'static str, Vec<u8>) {
    let blob = state.words().iter().flat_map(|w| w.to_le_bytes()).collect();
    (state.name(), blob)
}

fn decode(algorithm: &Algorithm, blob: &[u8]) -> Option<State> {
    if !blob.len().is_multiple_of(8) {
        return None;
    }
    let words: Vec<u64> = blob
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    algorithm.restore(&words)
}

/// Loads every live window and state row whose limiter still exists with the same shape.
pub(super) fn load(
    conn: &Connection,
    table: &Table,
    limiters: &[LimiterConfig],
    now: Nanos,
) -> rusqlite::Result<()> {
    let by_name: HashMap<&str, &Algorithm> = limiters
        .iter()
        .map(|l| (l.name.as_str(), &l.algorithm))
        .collect();
    let limiter_of = |key: &str| by_name.get(crate::key::limiter_of(key)).copied();
    // The table keeps what fits in `store.max_keys`, the heaviest keys
    // first, and queues the rest for deletion, so the file stays as bounded
    // as memory.
    let mut rows = read_windows(conn, &limiter_of)?;
    rows.extend(read_states(conn, &limiter_of, now)?);
    let loaded = table.load_all(rows, now);
    let calls: Option<i64> = conn
        .query_row("SELECT count(*) FROM api_calls", [], |r| r.get(0))
        .optional()?;
    tracing::info!(
        keys = loaded,
        audit_rows = calls.unwrap_or(0),
        "loaded live limiter state from SQLite"
    );
    Ok(())
}

/// The latest `rate_limit_windows` row of each key whose algorithm keeps
/// [`Kept::Windows`].
fn read_windows<'a>(
    conn: &Connection,
    limiter_of: &impl Fn(&str) -> Option<&'a Algorithm>,
) -> rusqlite::Result<Vec<Loaded<'a>>> {
    let mut latest: HashMap<String, (Nanos, u64)> = HashMap::new();
    let mut stmt = conn.prepare("SELECT key, window_start, count FROM rate_limit_windows")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let key: String = row.get(0)?;
        let start: String = row.get(1)?;
        let count: i64 = row.get(2)?;
        let Some(start) = parse_iso8601(&start).map(|s| s * NANOS_PER_SEC) else {
            continue;
        };
        let entry = latest.entry(key).or_insert((start, count as u64));
        if start > entry.0 {
            *entry = (start, count as u64);
        }
    }
    let mut loaded = Vec::new();
    for (key, (window_start, count)) in latest {
        let Some(algorithm) = limiter_of(&key) else {
            continue;
        };
        match algorithm.kind().kept() {
            Kept::Windows => {}
            Kept::Never | Kept::Words => continue,
        }
        let Some(state) = algorithm.restore(&[window_start, count]) else {
            continue;
        };
        // The window start itself tells whether it is still current,
        // so no shape is needed: a changed window simply won't match.
        loaded.push(Loaded {
            rests_at: algorithm.rests_at(&state),
            key,
            algorithm,
            state,
            shape: 0,
        });
    }
    Ok(loaded)
}

/// The live `limiter_state` rows whose limiter kept its algorithm and shape.
fn read_states<'a>(
    conn: &Connection,
    limiter_of: &impl Fn(&str) -> Option<&'a Algorithm>,
    now: Nanos,
) -> rusqlite::Result<Vec<Loaded<'a>>> {
    let mut stmt = conn.prepare(
        "SELECT key, algorithm, shape, state, expires_at FROM limiter_state WHERE expires_at > ?1",
    )?;
    let mut rows = stmt.query([now as i64])?;
    let mut loaded = Vec::new();
    while let Some(row) = rows.next()? {
        let key: String = row.get(0)?;
        let name: String = row.get(1)?;
        let shape: String = row.get(2)?;
        let blob: Vec<u8> = row.get(3)?;
        let expires_at: i64 = row.get(4)?;
        let Some(algorithm) = limiter_of(&key) else {
            continue;
        };
        let fingerprint = algorithm.shape().fingerprint();
        if algorithm.name() != name || fingerprint.to_string() != shape {
            continue; // the limiter changed while we were down: start afresh
        }
        let Some(state) = decode(algorithm, &blob) else {
            continue;
        };
        loaded.push(Loaded {
            key,
            algorithm,
            state,
            shape: fingerprint,
            rests_at: expires_at as Nanos,
        });
    }
    Ok(loaded)
}
