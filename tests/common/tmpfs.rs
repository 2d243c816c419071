//! A small tmpfs a test mounts (as root) to fill up, free, or make read-only; unmounted on drop.
//!
//! Where mounting is not permitted the test says so loudly and skips — unless
//! `TOLLGATE_REQUIRE_MOUNTS=1` (CI sets it, and CI runs as root): then a
//! missing permission fails the test instead of passing it silently.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as mount(8) spells it: `4m`) for `test`.
    pub fn mount(size: &str, test: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output();
        let why = match out {
            Ok(o) if o.status.success() => return Some(Tmpfs { dir }),
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        let required = std::env::var("TOLLGATE_REQUIRE_MOUNTS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{test}: cannot mount a tmpfs ({why}) and TOLLGATE_REQUIRE_MOUNTS=1"
        );
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !!! SKIPPED {test}: cannot mount a tmpfs ({why}).\n\
             !!! This fault test needs root (CI runs it as root).\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        None
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills every free byte with `<dir>/filler`; returns its path (remove it to free the disk).
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.path().join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        let _ = f.sync_all();
        path
    }

    /// `mount -o remount,<options>`; whether it worked.
    pub fn remount(&self, options: &str) -> bool {
        Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process the test killed may still be letting go of a file.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
