//! Durability for the in-process table: one writer thread persists changed state to SQLite in batches.
//!
//! Measured on these machines, one upsert per transaction tops out near 50k/s
//! and burns a core; a hundred per transaction reach ~350k/s. So the request
//! path only marks a key as changed, and this thread writes every changed key
//! once per `flush_interval` in one transaction (WAL, `synchronous=NORMAL`).
//! The file holds the documented `rate_limit_windows` table for fixed windows,
//! `limiter_state` for the other algorithms, and the `api_calls` audit log.
//!
//! This file is the handle the store holds (open, enqueue, flush, shutdown);
//! [`schema`] opens the file and reads state back, [`writer`] is the thread.

mod backend;
pub mod durability;
mod lock;
mod schema;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::ban::{self, Bans};
use super::table::Table;
use super::{StoreError, StoreFailure};
use crate::config::store::{RawSqlite, Section};
use durability::{Durability, Unsaved, MAX_UNSAVED_KEYS};
use lock::FileLock;
use crate::config::LimiterConfig;
use crate::limiter::{Kept, Nanos};
use schema::{connect, file_identity, load, open_error};
use writer::DiskWriter;

/// Audit rows waiting for the writer beyond this are dropped (and counted)
/// rather than ever making a request wait.
const AUDIT_QUEUE: usize = 65_536;

/// Rows wait here until the writer's next flush. A buffer, not a channel:
/// a channel send wakes the sleeping writer thread for every row, and on a
/// busy proxy those wake-ups cost more than the inserts.
type AuditBuffer = Arc<Mutex<Vec<AuditRow>>>;

/// One forwarded request, for the `api_calls` table. Its text is shared
/// with the request's access record, not copied: the request path only
/// bumps reference counts, and the writer thread formats the time and
/// binds the text when it inserts the row.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub time: Nanos,
    pub client: Arc<str>,
    pub method: http::Method,
    pub path: Arc<str>,
    pub route: Arc<str>,
    pub status: u16,
    pub duration: Duration,
    pub request_id: Arc<str>,
}

enum WriterCommand {
    Flush(SyncSender<Result<(), String>>),
    Prune(PrunePlan),
    Shutdown(SyncSender<Unsaved>),
}

struct PrunePlan {
    now: Nanos,
    /// Live limiter names, and the window of those that keep window rows.
    limiters: Vec<(String, Option<Nanos>)>,
    audit_cutoff: Option<Nanos>,
}

/// How long one write waits for a lock another program holds (an operator's
/// `sqlite3` shell) before the flush fails and is retried after a backoff.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
    tx: SyncSender<WriterCommand>,
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
        let writer = DiskWriter {
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
            orphans: Vec::new(),
            forgotten_checked: std::time::Instant::now(),
        };
        let interval = options.flush_interval;
        let thread = std::thread::Builder::new()
            .name("tollgate-sqlite".into())
            .spawn(move || writer.run(rx, interval))
            .map_err(|e| stopped(format!("cannot start the SQLite writer: {e}")))?;
        tracing::debug!(path = %path.display(), "holding the SQLite store's lock");
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
                    let window = match l.algorithm.kind().kept() {
                        Kept::Windows => Some(l.algorithm.linger()),
                        Kept::Never | Kept::Words => None,
                    };
                    (l.name.clone(), window)
                })
                .collect(),
            audit_cutoff: audit_retention.map(|r| now.saturating_sub(r.as_nanos() as Nanos)),
        };
        // Pruning is housekeeping: if the queue is full it waits for the next round.
        let _ = self.tx.try_send(WriterCommand::Prune(plan));
    }

    /// Writes everything changed so far now (whatever the backoff), and waits for it.
    pub fn flush(&self) -> Result<(), StoreError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .send(WriterCommand::Flush(ack))
            .map_err(|_| stopped("the SQLite writer has stopped".into()))?;
        done.recv()
            .map_err(|_| stopped("the SQLite writer has stopped".into()))?
            .map_err(stopped)
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
        let answer = match self.tx.send(WriterCommand::Shutdown(ack)) {
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

/// The writer cannot take the call: it stopped, or never started.
fn stopped(why: String) -> StoreError {
    StoreError::new(
        StoreFailure::Stopped,
        RawSqlite::NAME,
        format!("the store is unavailable: {why}"),
    )
}
