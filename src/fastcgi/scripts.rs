//! Which script a path runs, remembered for `script_cache` so a page does not cost a trip to the blocking pool.
//!
//! Resolving a path stats it and reads every symlink on the way, which may
//! wait on the disk, so it runs on tokio's blocking pool: a hand-off to
//! another thread and back on every PHP page. A PHP site asks for the same
//! few scripts again and again (a front controller answers every pretty
//! URL), so a path that resolved to a script is remembered for a moment
//! (`script_cache`, 1 s by default), as nginx's `open_file_cache` does and
//! as php-fpm's opcache trusts its own stat for 2 s. Within it, a script
//! deleted is still sent to php-fpm (which answers its own 404), and a file
//! put at a path the front controller answered is seen once it expires. A
//! path that resolves to a static file, a directory or nothing is looked up
//! afresh each time.
//!
//! Any path can resolve to the fallback script, so clients choose the
//! keys: the map holds at most [`MAX_ENTRIES`], none longer than
//! [`MAX_PATH_LEN`]. When it is full, expired
//! entries are swept (at most once per validity period); if none was, the
//! new path is resolved off the runtime as before and not kept (`full`).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::path::Target;
use crate::metrics::{inc, Counter, Metrics};

/// Paths remembered per upstream at most.
pub const MAX_ENTRIES: usize = 4096;

/// A longer path (or rewrite) is never remembered, so the map's bytes are
/// bounded too: at most a few KiB an entry.
pub const MAX_PATH_LEN: usize = 1024;

/// One upstream's remembered script resolutions.
#[derive(Debug)]
pub struct Scripts {
    /// How long a resolution is trusted; zero: never remembered.
    valid: Duration,
    entries: Mutex<Entries>,
    hit: Counter,
    miss: Counter,
    full: Counter,
}

#[derive(Debug, Default)]
struct Entries {
    by_path: HashMap<Box<str>, Entry>,
    /// When expired entries were last swept out of a full map.
    swept: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    /// The rewrite's path the request carried (`unless_exists`), part of the key.
    then: Option<Box<str>>,
    script: Box<str>,
    path_info: Box<str>,
    /// Whether the script is the rewrite's, so the rewrite's query applies.
    took_rewrite: bool,
    at: Instant,
}

/// A script resolution: the target and whether the rewrite's path gave it.
pub type Resolved = (Target, bool);

impl Scripts {
    pub fn new(upstream: &str, valid: Duration, metrics: &Metrics) -> Scripts {
        let counter = |result| {
            metrics.counter(
                "tollgate_fastcgi_script_cache_total",
                &[("upstream", upstream), ("result", result)],
            )
        };
        Scripts {
            valid,
            entries: Mutex::default(),
            hit: counter("hit"),
            miss: counter("miss"),
            full: counter("full"),
        }
    }

    /// The script `path` (with the rewrite `then`) resolved to within the
    /// validity period, if one is remembered.
    pub fn get(&self, path: &str, then: Option<&str>, now: Instant) -> Option<Resolved> {
        if self.valid.is_zero() {
            return None;
        }
        let entries = self.entries.lock();
        let found = entries.by_path.get(path).filter(|e| {
            e.then.as_deref() == then && now.saturating_duration_since(e.at) < self.valid
        });
        let Some(e) = found else {
            drop(entries);
            inc(&self.miss);
            return None;
        };
        let target = Target::Script {
            script: e.script.to_string(),
            path_info: e.path_info.to_string(),
        };
        let took_rewrite = e.took_rewrite;
        drop(entries);
        inc(&self.hit);
        Some((target, took_rewrite))
    }

    /// Remembers what `path` resolved to, when it is a script.
    pub fn keep(
        &self,
        path: &str,
        then: Option<&str>,
        target: &Target,
        took_rewrite: bool,
        now: Instant,
    ) {
        let Target::Script { script, path_info } = target else {
            return;
        };
        let too_long = path.len() > MAX_PATH_LEN || then.is_some_and(|t| t.len() > MAX_PATH_LEN);
        if self.valid.is_zero() || too_long {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.by_path.len() >= MAX_ENTRIES && !entries.by_path.contains_key(path) {
            let due = entries
                .swept
                .is_none_or(|s| now.saturating_duration_since(s) >= self.valid);
            if due {
                let valid = self.valid;
                entries
                    .by_path
                    .retain(|_, e| now.saturating_duration_since(e.at) < valid);
                entries.swept = Some(now);
            }
            if entries.by_path.len() >= MAX_ENTRIES {
                drop(entries);
                inc(&self.full);
                return;
            }
        }
        entries.by_path.insert(
            path.into(),
            Entry {
                then: then.map(Into::into),
                script: script.as_str().into(),
                path_info: path_info.as_str().into(),
                took_rewrite,
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(name: &str) -> Target {
        Target::Script {
            script: name.into(),
            path_info: String::new(),
        }
    }

    fn scripts(valid: Duration) -> Scripts {
        Scripts::new("php", valid, &Metrics::default())
    }

    fn script_of(found: Option<Resolved>) -> Option<String> {
        match found {
            Some((Target::Script { script, .. }, _)) => Some(script),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_script_is_remembered_for_the_validity_period_and_not_a_moment_longer() {
        let s = scripts(Duration::from_secs(1));
        let t0 = Instant::now();
        s.keep("/blog/hello", None, &script("/index.php"), false, t0);
        let later = t0 + Duration::from_millis(999);
        assert_eq!(
            script_of(s.get("/blog/hello", None, later)).as_deref(),
            Some("/index.php")
        );
        assert!(s
            .get("/blog/hello", None, t0 + Duration::from_secs(1))
            .is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_file_a_directory_or_nothing_is_never_remembered() {
        let s = scripts(Duration::from_secs(1));
        let now = Instant::now();
        for target in [Target::NotFound, Target::Directory("/docs".into())] {
            s.keep("/docs", None, &target, false, now);
            assert!(s.get("/docs", None, now).is_none());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_rewrite_of_the_same_path_is_resolved_afresh() {
        let s = scripts(Duration::from_secs(1));
        let now = Instant::now();
        s.keep("/a", Some("/index.php"), &script("/index.php"), false, now);
        assert!(s.get("/a", Some("/other.php"), now).is_none());
        assert!(s.get("/a", None, now).is_none());
        assert!(s.get("/a", Some("/index.php"), now).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_path_over_the_length_bound_is_never_remembered() {
        let s = scripts(Duration::from_secs(1));
        let now = Instant::now();
        let long = format!("/{}", "a".repeat(MAX_PATH_LEN));
        s.keep(&long, None, &script("/index.php"), false, now);
        assert!(s.get(&long, None, now).is_none());
        s.keep("/a", Some(&long), &script("/index.php"), true, now);
        assert!(s.get("/a", Some(&long), now).is_none());
        let at_bound = &long[..MAX_PATH_LEN];
        s.keep(at_bound, None, &script("/index.php"), false, now);
        assert!(s.get(at_bound, None, now).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn zero_remembers_nothing() {
        let s = scripts(Duration::ZERO);
        let now = Instant::now();
        s.keep("/index.php", None, &script("/index.php"), false, now);
        assert!(s.get("/index.php", None, now).is_none());
    }

    #[test]
    fn the_documented_bound_is_the_one_kept() {
        let doc = include_str!("../../docs/CONFIG.md");
        let bound = format!(
            "At most {},{:03} paths per upstream, none longer than {},{:03} bytes",
            MAX_ENTRIES / 1000,
            MAX_ENTRIES % 1000,
            MAX_PATH_LEN / 1000,
            MAX_PATH_LEN % 1000
        );
        assert!(
            doc.contains(&bound),
            "docs/CONFIG.md does not say {bound:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_map_keeps_no_new_path_until_its_entries_expire() {
        let s = scripts(Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES {
            s.keep(&format!("/p{i}"), None, &script("/index.php"), false, t0);
        }
        s.keep("/one-more", None, &script("/index.php"), false, t0);
        assert!(
            s.get("/one-more", None, t0).is_none(),
            "kept past the bound"
        );
        assert_eq!(s.entries.lock().by_path.len(), MAX_ENTRIES);
        assert_eq!(s.full.load(std::sync::atomic::Ordering::Relaxed), 1);
        // A path already held is refreshed in place, full or not.
        let t1 = t0 + Duration::from_millis(500);
        s.keep("/p0", None, &script("/index.php"), false, t1);
        let t2 = t0 + Duration::from_secs(1);
        assert!(s.get("/p0", None, t2).is_some());
        // Once they expire, a sweep makes room.
        s.keep("/one-more", None, &script("/index.php"), false, t2);
        assert!(s.get("/one-more", None, t2).is_some());
        assert_eq!(s.entries.lock().by_path.len(), 2);
    }
}
