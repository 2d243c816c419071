//! Where ACME state is kept: a directory (0700) holding, per CA directory URL, the account (0600), each name's certificate chain and key (0600), and the lock files that let instances sharing the directory order a name only once.
//!
//! A directory rather than the SQLite file: the files are what operators
//! already back up, inspect with `openssl x509` and mount into other
//! containers; the SQLite file belongs to the limiter store, which may be
//! memory or Redis, and a certificate must survive `store.path` changing.
//! Every call does blocking file I/O: callers run it on a blocking thread.
//!
//! Every file is replaced whole: written to a temporary file of its own,
//! with a name no other writer uses (`tempfile`, created 0600 in the same
//! directory), synced, then renamed over the old one. Tasks of several
//! names, and instances sharing the directory, write at once; each rename
//! is atomic and none can take another's temporary file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// One CA's corner of the storage directory.
#[derive(Debug, Clone)]
pub struct Storage {
    dir: PathBuf,
}

/// A name's certificate chain and private key, both PEM.
#[derive(Debug, Clone)]
pub struct Stored {
    pub chain_pem: String,
    pub key_pem: String,
}

impl Storage {
    /// Opens (creating, 0700) `root/<hash of directory>`: certificates of a
    /// staging CA are never served once the directory says production.
    /// An error names the path it is about (an operator fixes a path, not "permission denied").
    pub fn open(root: &Path, directory: &str) -> io::Result<Storage> {
        let dir = root.join(ca_tag(directory));
        for d in [root, dir.as_path()] {
            private_dir(d)?;
        }
        // Which CA this is, for an operator reading the directory: written
        // once, not at every look of every name's task.
        let about = dir.join("directory.txt");
        if read_optional(&about).ok().flatten().as_deref() != Some(directory.as_bytes()) {
            write_private(&about, directory.as_bytes()).map_err(|e| at(&about, e))?;
        }
        Ok(Storage { dir })
    }

    pub fn account(&self) -> io::Result<Option<Vec<u8>>> {
        read_optional(&self.dir.join("account.json"))
    }

    pub fn save_account(&self, json: &[u8]) -> io::Result<()> {
        write_private(&self.dir.join("account.json"), json)
    }

    pub fn certificate(&self, domain: &str) -> io::Result<Option<Stored>> {
        let chain = read_optional(&self.dir.join(format!("{domain}.crt")))?;
        let key = read_optional(&self.dir.join(format!("{domain}.key")))?;
        Ok(match (chain, key) {
            (Some(c), Some(k)) => Some(Stored {
                chain_pem: String::from_utf8_lossy(&c).into_owned(),
                key_pem: String::from_utf8_lossy(&k).into_owned(),
            }),
            _ => None,
        })
    }

    /// Writes the key first, then the chain: a reader that sees the new
    /// chain also sees its key (each file is replaced by a rename).
    pub fn save_certificate(&self, domain: &str, stored: &Stored) -> io::Result<()> {
        let key = self.dir.join(format!("{domain}.key"));
        write_private(&key, stored.key_pem.as_bytes()).map_err(|e| at(&key, e))?;
        let chain = self.dir.join(format!("{domain}.crt"));
        write_private(&chain, stored.chain_pem.as_bytes()).map_err(|e| at(&chain, e))
    }

    /// Takes `domain`'s order lock without waiting: `None` when another
    /// instance (or task) holds it. Released when the [`OrderLock`] drops or
    /// the holder dies (an `flock`, so a crashed instance never wedges it).
    pub fn try_lock(&self, domain: &str) -> io::Result<Option<OrderLock>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(format!("{domain}.lock")))?;
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Some(OrderLock { _file: file }));
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        }
    }
}

/// 12 hex digits of the CA directory URL's SHA-256: one CA's corner of the
/// storage, and of the keys a fleet shares in Redis.
pub fn ca_tag(directory: &str) -> String {
    let hash = Sha256::digest(directory.as_bytes());
    hash[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// `e` with the path it happened at.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// An order in progress for one name; the lock is the open file.
pub struct OrderLock {
    _file: File,
}

fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Creates `dir` (and its parents) 0700, or makes an existing one 0700.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(0o700)))
        .map_err(|e| at(dir, e))
}

/// Writes `path` as 0600: a temporary file of its own in the same
/// directory (a unique name, 0600 from its creation), synced, then renamed
/// over `path`. A temporary file left by a crash is never read.
pub fn write_private(path: &Path, content: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(content)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_private_and_a_second_lock_on_a_name_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let s = Storage::open(&root.path().join("acme"), "https://ca.test/dir").unwrap();
        s.save_certificate(
            "a.test",
            &Stored {
                chain_pem: "C".into(),
                key_pem: "K".into(),
            },
        )
        .unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root.path().join("acme")), 0o700);
        assert_eq!(mode(&s.dir), 0o700);
        assert_eq!(mode(&s.dir.join("a.test.key")), 0o600);
        assert_eq!(s.certificate("a.test").unwrap().unwrap().key_pem, "K");
        assert!(s.certificate("b.test").unwrap().is_none());
        let held = s.try_lock("a.test").unwrap();
        assert!(held.is_some());
        assert!(
            s.try_lock("a.test").unwrap().is_none(),
            "flock is per open file"
        );
        assert!(s.try_lock("b.test").unwrap().is_some());
        drop(held);
        assert!(s.try_lock("a.test").unwrap().is_some());
    }

    /// Several names' tasks, and instances sharing the directory, write at
    /// once: with one temporary name per file, one writer's rename took the
    /// file another had just made, and the other's failed (ENOENT).
    #[test]
    fn writers_of_one_directory_at_once_never_fail_and_leave_no_temporary_file() {
        let root = tempfile::tempdir().unwrap();
        let acme = root.path().join("acme");
        let writers: Vec<_> = (0..8)
            .map(|n| {
                let acme = acme.clone();
                std::thread::spawn(move || {
                    for i in 0..100 {
                        let s = Storage::open(&acme, "https://ca.test/dir")?;
                        let pem = |k: &str| format!("{k} {n} {i}");
                        let stored = Stored {
                            chain_pem: pem("C"),
                            key_pem: pem("K"),
                        };
                        s.save_certificate(&format!("{}.test", n % 3), &stored)?;
                    }
                    io::Result::Ok(())
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap().unwrap();
        }
        let s = Storage::open(&acme, "https://ca.test/dir").unwrap();
        let left: Vec<_> = fs::read_dir(&s.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // Each file holds one whole write.
        let c = s.certificate("1.test").unwrap().unwrap();
        assert!(c.chain_pem.starts_with("C ") && c.key_pem.starts_with("K "));
    }
}
