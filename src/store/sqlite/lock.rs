//! One process per SQLite file: an exclusive lock on one byte of the database file itself, held while serving.
//!
//! Two tollgates on one file would each keep their own counters in memory
//! and overwrite each other's rows: silent wrong limits. So the second one
//! must refuse to start, and say which file.
//!
//! The lock is on the file, not on its name: a symlink, a hard link, a
//! bind mount or `./` spelling of the same file reaches the same inode and
//! the same lock (a sidecar `<file>.lock` followed the path string, so a
//! second tollgate through a link took a second sidecar and both served).
//!
//! It is an open-file-description byte-range lock (`F_OFD_SETLK`) on a byte
//! SQLite never locks, far past the bytes it uses (`0x40000000` and the 512
//! after it), so it never meets SQLite's own locks: an operator's `sqlite3`
//! query or `.backup` still reads the file. Why not the alternatives:
//! SQLite's `locking_mode=EXCLUSIVE` would lock every reader out, and a
//! second process would only notice at its first write, as `SQLITE_BUSY`;
//! `flock` on the database is emulated with a whole-file `fcntl` lock on NFS
//! and some container volumes, where it collides with SQLite's; a classic
//! `fcntl` lock is dropped as soon as the process closes *any* descriptor of
//! the file (every connection SQLite closes would release it). An OFD lock
//! belongs to our one descriptor and goes away only when it is closed, or
//! when the process ends however it ends (`kill -9` included).
//!
//! A descriptor is copied into a child a program forks, until the child
//! execs (the copy is close-on-exec); meanwhile the lock stays held. So a
//! refused lock is tried again for [`RETRY_FOR`] before the answer is "in
//! use": a store dropped and reopened at once in a program that spawns
//! processes (the test suite does) must not see its own lock as a stranger's.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::store::{RawSqlite, Section};
use crate::store::{StoreError, StoreFailure};

/// The byte locked: past every byte SQLite locks (its lock bytes start at
/// 1 GiB and span 512 bytes), and past any database tollgate writes; a
/// lock beyond the end of a file is allowed and does not grow it.
const LOCK_BYTE: i64 = 1 << 50;

/// How long a refused lock is tried again before it counts as another process's.
const RETRY_FOR: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct FileLock {
    /// Held open for the lock's lifetime; closing it releases the lock.
    _file: File,
}

impl FileLock {
    /// Takes the lock on the database at `db` (created empty if missing:
    /// SQLite takes an empty file as a new database), or explains who holds it.
    pub fn acquire(db: &Path) -> Result<FileLock, StoreError> {
        let cannot = |source: std::io::Error| {
            let context = format!("cannot lock the SQLite store {}: {source}", db.display());
            StoreError::new(StoreFailure::Open, RawSqlite::NAME, context).because(source)
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(db)
            .map_err(cannot)?;
        let started = Instant::now();
        loop {
            match try_lock(&file) {
                Ok(true) => return Ok(FileLock { _file: file }),
                Ok(false) if started.elapsed() < RETRY_FOR => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(false) => return Err(in_use(db)),
                Err(e) => return Err(cannot(e)),
            }
        }
    }
}

/// Another process holds the lock on `db`: say which file, under whatever name.
fn in_use(db: &Path) -> StoreError {
    let file = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
    StoreError::new(
        StoreFailure::InUse,
        RawSqlite::NAME,
        format!(
            "another process is already using the SQLite store {} (the file {}, under this \
             or any other name: it holds the file's lock); one tollgate per file: give each \
             instance its own store.path, or share counters with backend: redis",
            db.display(),
            file.display()
        ),
    )
}

/// One attempt at the lock: `Ok(false)` when another descriptor holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = LOCK_BYTE as _;
    lock.l_len = 1;
    // l_pid must be 0 for an OFD lock (zeroed above).
    // SAFETY: the descriptor is open for as long as `file` lives, and `lock`
    // is a valid `flock` the call only reads.
    let done = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if done == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_file_is_refused_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let first = FileLock::acquire(&db).unwrap();
        let err = FileLock::acquire(&db).unwrap_err();
        assert_eq!(err.kind, StoreFailure::InUse, "{err}");
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
        drop(first);
        FileLock::acquire(&db).expect("free again once the first is gone");
    }

    #[test]
    fn a_symlink_or_a_hard_link_to_a_locked_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let _first = FileLock::acquire(&db).unwrap();
        let soft = dir.path().join("soft.db");
        std::os::unix::fs::symlink(&db, &soft).unwrap();
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(&db, &hard).unwrap();
        for other in [soft, hard] {
            let err = FileLock::acquire(&other).unwrap_err();
            assert_eq!(err.kind, StoreFailure::InUse, "{err}");
            assert!(
                err.to_string().contains(&other.display().to_string()),
                "{err}"
            );
        }
    }
}
