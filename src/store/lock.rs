//! One process per SQLite file: an exclusive OS lock on a sidecar `<file>.lock`, held while serving.
//!
//! Two tollgates on one file would each keep their own counters in memory
//! and overwrite each other's rows: silent wrong limits. So the second one
//! must refuse to start, and say which file.
//!
//! Why a sidecar file and not SQLite's own `locking_mode=EXCLUSIVE`: SQLite's
//! exclusive mode would also lock out every reader (an operator's `sqlite3`
//! query, a `.backup`), and a second process would only notice at its first
//! read or write, as `SQLITE_BUSY`, not at start with a clear message. And why
//! not `flock` on the database file itself: SQLite locks the file with POSIX
//! `fcntl` locks, and where `flock` is emulated with `fcntl` (NFS, some
//! container volumes) the two would collide. A sidecar lock touches nothing
//! SQLite uses. The lock is released by the kernel when the process ends,
//! however it ends (`kill -9` included), so a stale lock file is harmless and
//! is never deleted (deleting it would let two processes lock two inodes).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::StoreError;

#[derive(Debug)]
pub struct FileLock {
    /// Held open for the lock's lifetime; closing it releases the lock.
    _file: File,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock for the database at `db`, or explains who holds it.
    pub fn acquire(db: &Path) -> Result<FileLock, StoreError> {
        let path = sidecar(db);
        let cannot = |source| StoreError::Lock {
            path: db.to_path_buf(),
            lock: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(cannot)?;
        match file.try_lock() {
            Ok(()) => Ok(FileLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(StoreError::InUse {
                path: db.to_path_buf(),
                lock: path,
            }),
            Err(TryLockError::Error(e)) => Err(cannot(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `tollgate.db` → `tollgate.db.lock`, beside it.
pub fn sidecar(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
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
        assert!(matches!(err, StoreError::InUse { .. }), "{err}");
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
        drop(first);
        FileLock::acquire(&db).expect("free again once the first is gone");
    }
}
