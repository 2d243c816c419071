//! CPU per MB and ratio of gzip and brotli at each level, on the text a site serves: how tollgate's defaults were chosen.
//!
//! The corpus is this repository's own web-ish text (the dashboard's HTML,
//! JS and CSS, the OpenAPI YAML, the Markdown docs, a JSON rendering of a
//! config), each file compressed as one response, in 64 KiB chunks with a
//! sync flush after each (what `compression::stream` does when the upstream
//! pauses), with the window tollgate uses. Each setting runs `ROUNDS` times;
//! the median is printed.
//!
//!     cargo bench --bench compression            # every level
//!     cargo bench --bench compression -- quick   # 3 rounds

use std::io::Write;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 * 1024;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = Vec::new();
    for rel in [
        "src/dashboard/index.html",
        "src/dashboard/dashboard.js",
        "src/dashboard/dashboard.css",
        "docs/openapi.yaml",
        "docs/CONFIG.md",
        "docs/PERFORMANCE.md",
        "README.md",
        "config.example.yaml",
    ] {
        if let Ok(b) = std::fs::read(format!("{root}/{rel}")) {
            files.push((rel.to_string(), b));
        }
    }
    // An API answer: a large JSON document.
    let json: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"id": i, "name": format!("user{i}"), "email": format!("user{i}@example.com"), "active": i % 3 != 0, "roles": ["reader", "writer"]}))
        .collect();
    files.push((
        "users.json".into(),
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

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let rounds = if quick { 3 } else { 7 };
    let files = corpus();
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    println!(
        "corpus: {} files, {:.2} MB ({})",
        files.len(),
        total as f64 / 1e6,
        files
            .iter()
            .map(|(n, b)| format!("{n} {} KB", b.len() / 1000))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "default: gzip {}, brotli {} (window 2^{})",
        tollgate::compression::stream::GZIP_LEVEL,
        tollgate::compression::stream::BROTLI_QUALITY,
        tollgate::compression::stream::BROTLI_WINDOW
    );
    println!("| setting | ms of CPU per MB (median of {rounds}) | MB/s | compressed / original |");
    println!("| --- | --- | --- | --- |");
    let settings = [1, 4, 5, 6, 9]
        .map(Setting::Gzip)
        .into_iter()
        .chain([1, 3, 4, 5, 6, 9].map(Setting::Brotli));
    for s in settings {
        let mut times = Vec::with_capacity(rounds);
        let mut out = 0;
        for _ in 0..rounds {
            let started = Instant::now();
            out = files.iter().map(|(_, b)| s.compress(b)).sum::<usize>();
            times.push(started.elapsed());
        }
        let t = median(times);
        let mb = total as f64 / 1e6;
        println!(
            "| {} | {:.1} | {:.0} | {:.3} |",
            s.name(),
            t.as_secs_f64() * 1000.0 / mb,
            mb / t.as_secs_f64(),
            out as f64 / total as f64
        );
    }
}
