//! A real headless Chromium (Debian's `chromium`) driven from its command line, for pages tollgate serves.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The flags every test's Chromium runs with: headless, as root, no network of its own.
pub const HEADLESS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

/// The browser binary: `$TOLLGATE_CHROMIUM`, else `chromium` on the PATH.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_CHROMIUM") {
        return PathBuf::from(p);
    }
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let candidate = dir.join("chromium");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("chromium is not installed (apt-get install chromium; .ci/test does it)");
}

/// Runs headless Chromium on `url` with `extra` flags (e.g. `--dump-dom`),
/// letting the page run for `budget_ms` of virtual time; returns stdout.
/// A fresh profile directory each time: nothing carries over between runs.
pub fn run(url: &str, extra: &[&str], budget_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = Command::new(chromium());
    cmd.args(HEADLESS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("chromium starts");
    let pid = child.id();
    // Chromium has been seen to hang on a loaded machine: a generous bound, then kill.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(Duration::from_secs(90)) else {
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .status();
        panic!("chromium did not finish within 90 s");
    };
    let out = out.expect("chromium ran");
    assert!(
        out.status.success(),
        "chromium failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Takes a screenshot of `url` into `path` (PNG) after `budget_ms` of virtual time.
pub fn screenshot(url: &str, path: &Path, size: (u32, u32), budget_ms: u32) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("screenshot dir");
    }
    let _ = std::fs::remove_file(path);
    run(
        url,
        &[
            &format!("--screenshot={}", path.display()),
            &format!("--window-size={},{}", size.0, size.1),
            "--hide-scrollbars",
        ],
        budget_ms,
    );
    let png = std::fs::read(path).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG: {}", path.display());
}
