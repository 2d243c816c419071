//! CPU per MB and ratio of gzip and brotli at each level, on the text a site serves: how tollgate's defaults were chosen.
//!
//! The corpus is one file of each kind a site sends most, realistic where
//! Debian has it: HTML (Python's policy manual, package python3), CSS
//! (Bootstrap 4's minified stylesheet, libjs-bootstrap4), JS (jQuery
//! minified, libjs-jquery) and JSON (a 2000-record API answer, generated);
//! a kind whose file is missing falls back to this repository's dashboard
//! file of that kind, and the first line printed says which were used.
//! Each file is compressed as one response, in 64 KiB chunks with a sync
//! flush after each (what `compression::stream` does when the upstream
//! pauses), with the window tollgate uses. Each setting runs 7 times
//! (3 with `quick`); the median of the thread's CPU time is printed (CPU
//! time, not wall-clock: the machine is shared, and time spent waiting for a
//! core is not compression's cost).
//!
//!     cargo bench --bench compression            # every level
//!     cargo bench --bench compression -- quick   # 3 rounds
//!
//! Under `cargo test --all-targets` (no `--bench` argument, a debug build)
//! it runs once over the first 16 KiB of each file: a smoke test, whose
//! numbers mean nothing.

use std::io::Write;
use std::time::Duration;

const CHUNK: usize = 64 * 1024;

/// Per kind: the files tried, first found wins (the last is always there).
const KINDS: [(&str, &[&str]); 3] = [
    (
        "HTML",
        &[
            "/usr/share/doc/python3/python-policy.html",
            "src/dashboard/index.html",
        ],
    ),
    (
        "CSS",
        &[
            "/usr/share/javascript/bootstrap4/css/bootstrap.min.css",
            "/usr/share/nodejs/bootstrap/dist/css/bootstrap.min.css",
            "src/dashboard/dashboard.css",
        ],
    ),
    (
        "JS",
        &[
            "/usr/share/javascript/jquery/jquery.min.js",
            "src/dashboard/dashboard.js",
        ],
    ),
];

/// (kind, path, bytes) of each file.
fn corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = Vec::new();
    for (kind, candidates) in KINDS {
        let found = candidates.iter().find_map(|c| {
            let path = if c.starts_with('/') {
                c.to_string()
            } else {
                format!("{root}/{c}")
            };
            std::fs::read(&path).ok().map(|b| (path, b))
        });
        if let Some((path, bytes)) = found {
            files.push((kind, path, bytes));
        }
    }
    // An API answer: a large JSON document.
    let json: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"id": i, "name": format!("user{i}"), "email": format!("user{i}@example.com"), "active": i % 3 != 0, "roles": ["reader", "writer"]}))
        .collect();
    files.push((
        "JSON",
        "users.json (generated)".into(),
        serde_json::to_vec(&json).expect("serializes"),
    ));
    files
}

#[derive(Clone, Copy)]
enum Setting {
    Gzip(u32),
    Brotli(u32),
}

impl Setting {
    fn name(self) -> String {
        match self {
            Setting::Gzip(l) => format!("gzip {l}"),
            Setting::Brotli(q) => format!("brotli {q}"),
        }
    }

    /// Compresses one response as tollgate streams it; returns its compressed size.
    fn compress(self, data: &[u8]) -> usize {
        match self {
            Setting::Gzip(level) => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                for c in data.chunks(CHUNK) {
                    e.write_all(c).unwrap();
                    e.flush().unwrap();
                }
                e.finish().unwrap().len()
            }
            Setting::Brotli(q) => {
                let mut e = brotli::CompressorWriter::new(
                    Vec::new(),
                    16 * 1024,
                    q,
                    tollgate::compression::stream::BROTLI_WINDOW,
                );
                for c in data.chunks(CHUNK) {
                    e.write_all(c).unwrap();
                    e.flush().unwrap();
                }
                e.into_inner().len()
            }
        }
    }
}

/// CPU time of this thread: on a machine shared with other jobs, the time
/// the thread was not running is not counted (wall-clock time would be).
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let timing = std::env::args().any(|a| a == "--bench");
    let rounds = match (timing, quick) {
        (false, _) => 1,
        (true, true) => 3,
        (true, false) => 7,
    };
    let mut files = corpus();
    if !timing {
        for (_, _, b) in &mut files {
            b.truncate(16 * 1024);
        }
    }
    let total: usize = files.iter().map(|(_, _, b)| b.len()).sum();
    println!("corpus: {:.2} MB", total as f64 / 1e6);
    for (kind, path, b) in &files {
        println!("  {kind}: {path}, {} KB", b.len() / 1000);
    }
    println!(
        "default: gzip {}, brotli {} (window 2^{})",
        tollgate::compression::stream::GZIP_LEVEL,
        tollgate::compression::stream::BROTLI_QUALITY,
        tollgate::compression::stream::BROTLI_WINDOW
    );
    let kinds: Vec<&str> = files.iter().map(|(k, _, _)| *k).collect();
    println!(
        "| setting | ms of CPU per MB (median of {rounds}) | MB/s | compressed / original, all | {} |",
        kinds.join(" | ")
    );
    println!("|{}", " --- |".repeat(4 + kinds.len()));
    let settings = [1, 4, 5, 6, 9]
        .map(Setting::Gzip)
        .into_iter()
        .chain([1, 3, 4, 5, 6, 9].map(Setting::Brotli));
    for s in settings {
        let mut times = Vec::with_capacity(rounds);
        let mut sizes = Vec::new();
        for _ in 0..rounds {
            let started = thread_cpu();
            sizes = files.iter().map(|(_, _, b)| s.compress(b)).collect();
            times.push(thread_cpu() - started);
        }
        let t = median(times);
        let mb = total as f64 / 1e6;
        let per_kind: Vec<String> = files
            .iter()
            .zip(&sizes)
            .map(|((_, _, b), out)| format!("{:.3}", *out as f64 / b.len() as f64))
            .collect();
        println!(
            "| {} | {:.1} | {:.0} | {:.3} | {} |",
            s.name(),
            t.as_secs_f64() * 1000.0 / mb,
            mb / t.as_secs_f64(),
            sizes.iter().sum::<usize>() as f64 / total as f64,
            per_kind.join(" | ")
        );
    }
}
