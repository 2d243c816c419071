//! Durability for the in-process table: one writer thread persists changed state to SQLite in batches.
//!
//! Measured on these machines, one upsert per transaction tops out near 50k/s
//! and burns a core; a hundred per transaction reach ~350k/s. So the request
//! path only marks a key as changed, and this thread writes every changed key
//! once per `flush_interval` in one transaction (WAL, `synchronous=NORMAL`).
//! The file holds the SPEC's `rate_limit_windows` table for fixed windows,
//! `limiter_state` for the other algorithms, and the `api_calls` audit log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

use super::ban::{self, BanChange, Bans};
use super::durability::{backoff, Durability, Unsaved, MAX_UNSAVED_KEYS};
use super::lock::FileLock;
use super::memory::{Change, Table};
use super::StoreError;
use crate::clock::{iso8601, parse_iso8601};
use crate::config::LimiterConfig;
use crate::limiter::{
    leaky_bucket, sliding_window, token_bucket, Algorithm, Nanos, State, NANOS_PER_SEC,
};

const SCHEMA: &str = "
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

/// Audit rows waiting for the writer beyond this are dropped (and counted)
/// rather than ever making a request wait.
const AUDIT_QUEUE: usize = 65_536;

/// Rows wait here until the writer's next flush. A buffer, not a channel:
/// a channel send wakes the sleeping writer thread for every row, and on a
/// busy proxy those wake-ups cost more than the inserts.
type AuditBuffer = Arc<Mutex<Vec<AuditRow>>>;

/// One forwarded request, for the `api_calls` table.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub time: Nanos,
    pub client: String,
    pub method: http::Method,
    pub path: String,
    pub route: std::sync::Arc<str>,
    pub status: u16,
    pub duration: Duration,
    pub request_id: String,
}

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

enum Msg {
    Flush(SyncSender<Result<(), String>>),
    Prune(PrunePlan),
    Shutdown(SyncSender<Unsaved>),
}

struct PrunePlan {
    now: Nanos,
    /// Live limiter names, and the window of those that are fixed windows.
    limiters: Vec<(String, Option<Nanos>)>,
    audit_cutoff: Option<Nanos>,
}

/// How long one write waits for a lock another program holds (an operator's
/// `sqlite3` shell) before the flush fails and is retried after a backoff.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys per transaction when the last save before exit retries a batch the
/// disk refused: a nearly full disk may still take a small one.
const FINAL_SAVE_CHUNK: usize = 256;

/// How the writer behaves; tests shorten the waits and the bound.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    pub flush_interval: Duration,
    pub busy_timeout: Duration,
    /// See [`MAX_UNSAVED_KEYS`].
    pub max_unsaved: usize,
}

impl WriterOptions {
    pub fn new(flush_interval: Duration) -> WriterOptions {
        WriterOptions {
            flush_interval,
            busy_timeout: BUSY_TIMEOUT,
            max_unsaved: MAX_UNSAVED_KEYS,
        }
    }
}

pub struct Sqlite {
    path: PathBuf,
    tx: SyncSender<Msg>,
    thread: Mutex<Option<JoinHandle<()>>>,
    table: Arc<Table>,
    durability: Arc<Durability>,
    audit_dropped: Arc<AtomicU64>,
    audit_buffer: AuditBuffer,
    /// What the last save before exit could not write, once it ran.
    final_save: Mutex<Option<Unsaved>>,
    /// Held until the writer has stopped: one process per file.
    _lock: FileLock,
}

impl Sqlite {
    /// Opens (or creates) the file, loads live state into `table`, starts the writer.
    pub fn open(
        path: &Path,
        table: Arc<Table>,
        bans: Arc<Bans>,
        flush_interval: Duration,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Sqlite, StoreError> {
        Sqlite::open_with(
            path,
            table,
            bans,
            WriterOptions::new(flush_interval),
            limiters,
            now,
        )
    }

    pub fn open_with(
        path: &Path,
        table: Arc<Table>,
        bans: Arc<Bans>,
        options: WriterOptions,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Sqlite, StoreError> {
        // The lock first: a second process must not even read a file another one writes.
        let lock = FileLock::acquire(path)?;
        let conn = connect(path, options.busy_timeout)?;
        load(&conn, &table, limiters, now).map_err(|e| open_error(path, e))?;
        let banned = ban::load(&conn, &bans, limiters, now).map_err(|e| open_error(path, e))?;
        if banned > 0 {
            tracing::info!(bans = banned, "loaded bans in force from SQLite");
        }

        let (tx, rx) = mpsc::sync_channel(64);
        let audit_buffer = AuditBuffer::default();
        let durability = Durability::new();
        let audit_dropped = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            conn: Some(conn),
            path: path.to_path_buf(),
            identity: file_identity(path),
            options: options.clone(),
            table: table.clone(),
            durability: durability.clone(),
            bans,
            audit: Vec::new(),
            audit_buffer: audit_buffer.clone(),
            audit_dropped: audit_dropped.clone(),
            failures: 0,
            disk_full: false,
        };
        let interval = options.flush_interval;
        let thread = std::thread::Builder::new()
            .name("tollgate-sqlite".into())
            .spawn(move || writer.run(rx, interval))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite writer: {e}")))?;
        tracing::debug!(lock = %lock.path().display(), "holding the SQLite store's lock");
        Ok(Sqlite {
            path: path.to_path_buf(),
            tx,
            thread: Mutex::new(Some(thread)),
            table,
            durability,
            audit_dropped,
            audit_buffer,
            final_save: Mutex::new(None),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn audit(&self, row: AuditRow) {
        let mut buffer = self.audit_buffer.lock();
        if buffer.len() < AUDIT_QUEUE {
            buffer.push(row);
        } else {
            drop(buffer);
            self.audit_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn audit_dropped(&self) -> u64 {
        self.audit_dropped.load(Ordering::Relaxed)
    }

    pub fn healthy(&self) -> bool {
        self.durability.healthy()
            && self
                .thread
                .lock()
                .as_ref()
                .is_some_and(|t| !t.is_finished())
    }

    /// Unsaved keys, errors and the last error, for `/readyz` and `/metrics`.
    pub fn durability(&self) -> &Durability {
        &self.durability
    }

    pub fn prune(&self, now: Nanos, limiters: &[LimiterConfig], audit_retention: Option<Duration>) {
        let plan = PrunePlan {
            now,
            limiters: limiters
                .iter()
                .map(|l| {
                    let window = match &l.algorithm {
                        Algorithm::FixedWindow(f) => Some(f.window),
                        _ => None,
                    };
                    (l.name.clone(), window)
                })
                .collect(),
            audit_cutoff: audit_retention.map(|r| now.saturating_sub(r.as_nanos() as Nanos)),
        };
        // Pruning is housekeeping: if the queue is full it waits for the next round.
        let _ = self.tx.try_send(Msg::Prune(plan));
    }

    /// Writes everything changed so far now (whatever the backoff), and waits for it.
    pub fn flush(&self) -> Result<(), StoreError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .send(Msg::Flush(ack))
            .map_err(|_| StoreError::Unavailable("the SQLite writer has stopped".into()))?;
        done.recv()
            .map_err(|_| StoreError::Unavailable("the SQLite writer has stopped".into()))?
            .map_err(StoreError::Unavailable)
    }

    /// The last save: writes what the disk will take, stops the writer and
    /// returns what could not be written. Later calls return the same answer.
    pub fn shutdown(&self) -> Unsaved {
        let mut final_save = self.final_save.lock();
        if let Some(unsaved) = &*final_save {
            return unsaved.clone();
        }
        let Some(thread) = self.thread.lock().take() else {
            return Unsaved::default();
        };
        let (ack, done) = mpsc::sync_channel(1);
        let answer = match self.tx.send(Msg::Shutdown(ack)) {
            Ok(()) => done.recv().ok(),
            Err(_) => None,
        };
        let _ = thread.join();
        // A writer that died cannot say: everything it still had is unsaved.
        let unsaved = answer.unwrap_or_else(|| {
            let left = self.table.take_changes();
            Unsaved {
                keys: left.len(),
                audit_rows: self.audit_buffer.lock().len(),
                sample: left.iter().take(5).map(|c| c.key.to_string()).collect(),
            }
        });
        *final_save = Some(unsaved.clone());
        unsaved
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Opens the file with tollgate's settings and schema.
fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
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
    Ok(conn)
}

const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// A file SQLite cannot read as a database is reported as such, with what to do.
fn open_error(path: &Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_path_buf(),
            source,
        },
        _ => StoreError::Open {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// (device, inode) of the file at `path`, if there is one.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

struct Writer {
    /// `None` while the file is gone and cannot be made again.
    conn: Option<Connection>,
    path: PathBuf,
    /// What `conn` writes to: tells a file deleted or replaced under us.
    identity: Option<(u64, u64)>,
    options: WriterOptions,
    table: Arc<Table>,
    durability: Arc<Durability>,
    bans: Arc<Bans>,
    audit: Vec<AuditRow>,
    audit_buffer: AuditBuffer,
    audit_dropped: Arc<AtomicU64>,
    /// Consecutive failed flushes: the backoff grows with them.
    failures: u32,
    /// The last failure was the disk refusing to grow (`SQLITE_FULL`).
    disk_full: bool,
}

impl Writer {
    fn run(mut self, rx: Receiver<Msg>, interval: Duration) {
        let mut next_flush = Instant::now() + interval;
        loop {
            let wait = next_flush.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Flush(ack)) => {
                    let _ = ack.send(self.flush());
                }
                Ok(Msg::Prune(plan)) => {
                    if let Err(e) = self.prune(&plan) {
                        tracing::warn!(error = %e, "pruning the SQLite store failed");
                    }
                    continue;
                }
                Ok(Msg::Shutdown(ack)) => {
                    let _ = ack.send(self.final_save());
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.flush();
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.final_save();
                    return;
                }
            }
            next_flush = Instant::now() + backoff(interval, self.failures);
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        self.attempt(self.options.max_unsaved)
    }

    /// One flush; on failure, at most `cap` keys wait for the retry.
    fn attempt(&mut self, cap: usize) -> Result<(), String> {
        let file = self.reopen_if_moved();
        let changes = self.table.take_changes();
        let ban_changes = self.bans.take_changes();
        {
            let mut buffer = self.audit_buffer.lock();
            if self.audit.is_empty() {
                std::mem::swap(&mut self.audit, &mut *buffer);
            } else {
                self.audit.append(&mut buffer);
            }
        }
        if changes.is_empty() && ban_changes.is_empty() && self.audit.is_empty() && file.is_ok() {
            return Ok(());
        }
        let result = file.and_then(|()| {
            let conn = self.conn.as_mut().expect("open after reopen_if_moved");
            write(conn, &changes, &ban_changes, &self.audit).map_err(|e| {
                self.disk_full = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
                e.to_string()
            })
        });
        if result.is_err() {
            // Bans are few and must not be lost: the next flush tries again.
            self.bans.restore(ban_changes);
        }
        match result {
            Ok(()) => {
                self.audit.clear();
                if self.failures > 0 {
                    tracing::info!(
                        keys = changes.len(),
                        failed_attempts = self.failures,
                        "SQLite writes work again: every change that waited is saved"
                    );
                }
                self.failures = 0;
                self.disk_full = false;
                self.durability.saved();
                Ok(())
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                let (requeued, dropped) =
                    self.table.requeue(changes.into_iter().map(|c| c.key), cap);
                // Audit rows are kept up to one queue's worth, oldest first.
                if self.audit.len() > AUDIT_QUEUE {
                    let excess = self.audit.len() - AUDIT_QUEUE;
                    self.audit.drain(AUDIT_QUEUE..);
                    self.audit_dropped
                        .fetch_add(excess as u64, Ordering::Relaxed);
                }
                self.durability.failed(&e, requeued, dropped);
                tracing::error!(
                    error = %e,
                    path = %self.path.display(),
                    unsaved_keys = requeued,
                    attempt = self.failures,
                    retry_in_ms = backoff(self.options.flush_interval, self.failures).as_millis() as u64,
                    "persisting counters to SQLite failed; they stay exact in memory and the write is retried"
                );
                if dropped > 0 {
                    tracing::error!(
                        given_up = dropped,
                        cap,
                        "too many keys wait for SQLite: the changes beyond the cap are given up (exact in memory; saved when the key changes again)"
                    );
                }
                Err(e)
            }
        }
    }

    /// The connection to write with, after making sure it still writes to
    /// the file at `path`: a file deleted or replaced under the running
    /// process would otherwise take every later write into an unlinked inode.
    /// Then the file is opened again (created if it is gone) and every live
    /// counter is queued, so memory, the truth, reaches the new file.
    fn reopen_if_moved(&mut self) -> Result<(), String> {
        let now = file_identity(&self.path);
        if self.conn.is_none() || now.is_none() || now != self.identity {
            if let Some(old) = self.conn.take() {
                let what = if now.is_none() { "deleted" } else { "replaced" };
                tracing::error!(
                    path = %self.path.display(),
                    "the SQLite file was {what} under the running process; opening it again and writing every live counter to it"
                );
                // Closed first: closing deletes `<file>-wal` by name, which
                // must not be the new file's.
                let _ = old.close();
            }
            let conn = connect(&self.path, self.options.busy_timeout).map_err(|e| e.to_string())?;
            self.identity = file_identity(&self.path);
            self.conn = Some(conn);
            let keys = self.table.requeue_all();
            tracing::info!(path = %self.path.display(), keys, "SQLite file open again");
        }
        Ok(())
    }

    /// The last save before exit: the ordinary flush; if the disk is full,
    /// then small transactions (a nearly full disk may take some), counters
    /// before audit rows. Returns what it could not write.
    fn final_save(&mut self) -> Unsaved {
        // No cap here: every key left must be either written or reported.
        let Err(first) = self.attempt(usize::MAX) else {
            return Unsaved::default();
        };
        let mut unsaved = Unsaved::default();
        let changes = self.table.take_changes();
        let note = |unsaved: &mut Unsaved, chunk: &[Change]| {
            unsaved.keys += chunk.len();
            let room = 5usize.saturating_sub(unsaved.sample.len());
            unsaved
                .sample
                .extend(chunk.iter().take(room).map(|c| c.key.to_string()));
        };
        let mut refused_in_a_row = 0;
        for chunk in changes.chunks(FINAL_SAVE_CHUNK) {
            // Only a full disk may take a smaller write; a lock or a
            // missing file would make each chunk wait or fail the same way.
            let worth_trying = self.disk_full && refused_in_a_row < 3;
            match self.conn.as_mut() {
                Some(conn) if worth_trying => match write(conn, chunk, &[], &[]) {
                    Ok(()) => refused_in_a_row = 0,
                    Err(_) => {
                        refused_in_a_row += 1;
                        note(&mut unsaved, chunk);
                    }
                },
                _ => note(&mut unsaved, chunk),
            }
        }
        if !self.audit.is_empty() {
            let written = self.disk_full
                && self
                    .conn
                    .as_mut()
                    .is_some_and(|conn| write(conn, &[], &[], &self.audit).is_ok());
            if !written {
                unsaved.audit_rows = self.audit.len();
            }
        }
        if unsaved.is_empty() {
            tracing::info!("the last save wrote everything in smaller transactions");
        } else {
            tracing::error!(
                error = %first,
                path = %self.path.display(),
                unsaved_keys = unsaved.keys,
                unsaved_audit_rows = unsaved.audit_rows,
                some_keys = ?unsaved.sample,
                "the last save to SQLite could not write everything; what is listed here is lost when this process exits"
            );
        }
        unsaved
    }

    fn prune(&mut self, plan: &PrunePlan) -> rusqlite::Result<()> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(()); // no file to prune; the next flush opens it again
        };
        let tx = conn.transaction()?;
        for (name, window) in &plan.limiters {
            if let Some(window) = window {
                // Keep the current window and the one before it.
                let current = plan.now - plan.now % window;
                let cutoff = iso8601(current.saturating_sub(*window) / NANOS_PER_SEC);
                tx.execute(
                    "DELETE FROM rate_limit_windows WHERE key >= ?1 AND key < ?2 AND window_start < ?3",
                    params![format!("{name}:"), format!("{name};"), cutoff],
                )?;
            }
        }
        let names: Vec<&str> = plan.limiters.iter().map(|(n, _)| n.as_str()).collect();
        let live = serde_json::to_string(&names).expect("strings serialize");
        for table in ["rate_limit_windows", "limiter_state"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE substr(key, 1, instr(key, ':') - 1) NOT IN (SELECT value FROM json_each(?1))"),
                params![live],
            )?;
        }
        tx.execute(
            "DELETE FROM limiter_state WHERE expires_at <= ?1",
            params![plan.now as i64],
        )?;
        ban::prune(&tx, plan.now)?;
        if let Some(cutoff) = plan.audit_cutoff {
            tx.execute(
                "DELETE FROM api_calls WHERE time < ?1",
                params![iso8601(cutoff / NANOS_PER_SEC)],
            )?;
        }
        tx.commit()?;
        give_space_back(conn)
    }
}

/// After a prune: free pages go back to the filesystem and the WAL is
/// checkpointed and truncated, so the file shrinks after a key flood expires.
fn give_space_back(conn: &Connection) -> rusqlite::Result<()> {
    let free: i64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    if free > 0 {
        // Returns no rows; each step frees pages until the list is empty.
        let mut vacuum = conn.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = vacuum.query([])?;
        while rows.next()?.is_some() {}
    }
    // A reader (an operator's sqlite3) can keep part of the WAL alive: then
    // `busy` is 1 and the next prune tries again.
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    tracing::debug!(free_pages = free, busy, "SQLite space given back");
    Ok(())
}

fn write(
    conn: &mut Connection,
    changes: &[Change],
    bans: &[BanChange],
    audit: &[AuditRow],
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    ban::write(&tx, bans)?;
    {
        let mut upsert_window = tx.prepare_cached(
            "INSERT INTO rate_limit_windows (key, window_start, count) VALUES (?1, ?2, ?3)
             ON CONFLICT (key, window_start) DO UPDATE SET count = excluded.count",
        )?;
        let mut upsert_state = tx.prepare_cached(
            "INSERT INTO limiter_state (key, algorithm, shape, state, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (key) DO UPDATE SET algorithm = excluded.algorithm, shape = excluded.shape,
                 state = excluded.state, expires_at = excluded.expires_at",
        )?;
        let mut delete_windows =
            tx.prepare_cached("DELETE FROM rate_limit_windows WHERE key = ?1")?;
        let mut delete_state = tx.prepare_cached("DELETE FROM limiter_state WHERE key = ?1")?;
        for c in changes {
            let key: &str = &c.key;
            match &c.state {
                None => {
                    delete_windows.execute([key])?;
                    delete_state.execute([key])?;
                }
                Some((State::FixedWindow(w), _, _)) => {
                    upsert_window.execute(params![
                        key,
                        iso8601(w.window_start / NANOS_PER_SEC),
                        w.count as i64
                    ])?;
                }
                // Nothing is in flight after a restart.
                Some((State::Concurrency(_), _, _)) => {}
                Some((state, shape, expires_at)) => {
                    let (algorithm, blob) = encode(state);
                    let shape = shape.to_string();
                    upsert_state.execute(params![
                        key,
                        algorithm,
                        shape,
                        blob,
                        *expires_at as i64
                    ])?;
                }
            }
        }
        // Many rows per statement: the per-statement cost, not the row,
        // dominates an insert, and the audit log sees every forwarded request.
        let mut times = TimeCache::default();
        let mut chunks = audit.chunks_exact(AUDIT_ROWS_PER_INSERT);
        let mut insert_many = tx.prepare_cached(&insert_calls_sql(AUDIT_ROWS_PER_INSERT))?;
        for chunk in &mut chunks {
            let values = audit_values(chunk, &mut times);
            insert_many.execute(rusqlite::params_from_iter(
                values.iter().map(|v| v as &dyn rusqlite::ToSql),
            ))?;
        }
        let mut insert_one = tx.prepare_cached(&insert_calls_sql(1))?;
        for row in chunks.remainder() {
            let values = audit_values(std::slice::from_ref(row), &mut times);
            insert_one.execute(rusqlite::params_from_iter(
                values.iter().map(|v| v as &dyn rusqlite::ToSql),
            ))?;
        }
    }
    tx.commit()
}

const AUDIT_ROWS_PER_INSERT: usize = 64;

fn insert_calls_sql(rows: usize) -> String {
    let group = "(?, ?, ?, ?, ?, ?, ?, ?)";
    let groups = vec![group; rows].join(", ");
    format!("INSERT INTO api_calls (time, client, method, path, route, status, duration_ms, request_id) VALUES {groups}")
}

/// Formats each second once, not once per row.
#[derive(Default)]
struct TimeCache {
    secs: u64,
    text: std::rc::Rc<str>,
}

impl TimeCache {
    fn iso(&mut self, ns: Nanos) -> std::rc::Rc<str> {
        let secs = ns / NANOS_PER_SEC;
        if self.text.is_empty() || secs != self.secs {
            self.secs = secs;
            self.text = iso8601(secs).into();
        }
        self.text.clone()
    }
}

fn audit_values(rows: &[AuditRow], times: &mut TimeCache) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    let mut v = Vec::with_capacity(rows.len() * 8);
    for r in rows {
        v.push(Value::Text(times.iso(r.time).to_string()));
        v.push(Value::Text(r.client.clone()));
        v.push(Value::Text(r.method.as_str().to_string()));
        v.push(Value::Text(r.path.clone()));
        v.push(Value::Text(r.route.to_string()));
        v.push(Value::Integer(i64::from(r.status)));
        v.push(Value::Real(r.duration.as_secs_f64() * 1000.0));
        v.push(Value::Text(r.request_id.clone()));
    }
    v
}

fn encode(state: &State) -> (&'static str, Vec<u8>) {
    let words: Vec<u64> = match state {
        State::SlidingWindow(s) => s.admitted.iter().copied().collect(),
        State::TokenBucket(s) => vec![s.tat],
        State::LeakyBucket(s) => vec![s.next_free],
        State::FixedWindow(s) => vec![s.window_start, s.count],
        State::Concurrency(s) => vec![s.in_flight],
    };
    let name = state.name();
    (name, words.iter().flat_map(|w| w.to_le_bytes()).collect())
}

fn decode(algorithm: &Algorithm, blob: &[u8]) -> Option<State> {
    if !blob.len().is_multiple_of(8) {
        return None;
    }
    let words: Vec<u64> = blob
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    Some(match algorithm {
        Algorithm::SlidingWindow(_) => State::SlidingWindow(Box::new(sliding_window::State {
            admitted: words.into_iter().collect(),
        })),
        Algorithm::TokenBucket(_) => State::TokenBucket(token_bucket::State {
            tat: *words.first()?,
        }),
        Algorithm::LeakyBucket(_) => State::LeakyBucket(leaky_bucket::State {
            next_free: *words.first()?,
        }),
        _ => return None,
    })
}

/// Loads every live window and state row whose limiter still exists with the same shape.
fn load(
    conn: &Connection,
    table: &Table,
    limiters: &[LimiterConfig],
    now: Nanos,
) -> rusqlite::Result<()> {
    let by_name: HashMap<&str, &Algorithm> = limiters
        .iter()
        .map(|l| (l.name.as_str(), &l.algorithm))
        .collect();
    let limiter_of = |key: &str| by_name.get(key.split(':').next().unwrap_or("")).copied();

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
    // The table keeps what fits in `store.max_keys` and queues the rest for
    // deletion, so the file stays as bounded as memory.
    let mut loaded = 0usize;
    for (key, (window_start, count)) in latest {
        if let Some(algorithm @ Algorithm::FixedWindow(_)) = limiter_of(&key) {
            let state = State::FixedWindow(crate::limiter::fixed_window::State {
                window_start,
                count,
            });
            // The window start itself tells whether it is still current,
            // so no shape is needed: a changed window simply won't match.
            let rests_at = algorithm.rests_at(&state);
            if table.load(&key, state, 0, rests_at, now) {
                loaded += 1;
            }
        }
    }
    let mut stmt = conn.prepare(
        "SELECT key, algorithm, shape, state, expires_at FROM limiter_state WHERE expires_at > ?1",
    )?;
    let mut rows = stmt.query([now as i64])?;
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
        if let Some(state) = decode(algorithm, &blob) {
            if table.load(&key, state, fingerprint, expires_at as Nanos, now) {
                loaded += 1;
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyPart;
    use crate::limiter::fixed_window::FixedWindow;
    use crate::limiter::token_bucket::TokenBucket;
    use crate::store::Check;

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
    fn one_limiter_store(
        file: &str,
    ) -> (tempfile::TempDir, PathBuf, Algorithm, Arc<Table>, Sqlite) {
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
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
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
        assert!(matches!(err, StoreError::InUse { .. }), "{err}");
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
        table.remove_where(false, |_, expires_at| expires_at <= later);
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
}
