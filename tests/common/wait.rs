//! Waiting in tests: polling until something holds, watching a gauge's peak, and keeping a real-clock scenario inside one window.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// With the real clock: if less than `room` is left in the current window of
/// length `window` (aligned to the Unix epoch), sleeps into the next one, so
/// a scenario that takes less than `room` never straddles two windows.
pub fn wait_for_window_room(window: Duration, room: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = Duration::from_nanos((now.as_nanos() % window.as_nanos()) as u64);
    let left = window - into;
    if left < room {
        std::thread::sleep(left + Duration::from_millis(100));
    }
}

/// The Unix start (s) of the current window of length `window`, with the real clock.
pub fn window_start_now(window: Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now - now % window.as_secs()
}

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it holds (`true`) or `limit` passes (`false`). The
/// caller asserts on the answer, with what it expected and what it saw.
#[must_use = "assert on it, or the test cannot fail"]
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a test without a runtime (one that drives the real
/// binary with blocking calls): the same polling, on this thread.
#[must_use = "assert on it, or the test cannot fail"]
pub fn eventually_blocking(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// The peak of one gauge on a tollgate's `/metrics`, read every 50 ms on a
/// runtime's task from [`GaugeWatch::start`] to [`GaugeWatch::peak`]: a
/// bound held for a whole flood, not just at its end.
pub struct GaugeWatch {
    most: Arc<AtomicU64>,
    watching: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl GaugeWatch {
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        c: &reqwest::Client,
        admin: SocketAddr,
        gauge: &'static str,
    ) -> GaugeWatch {
        let most = Arc::new(AtomicU64::new(0));
        let watching = Arc::new(AtomicBool::new(true));
        let task = runtime.spawn({
            let (c, most, watching) = (c.clone(), most.clone(), watching.clone());
            async move {
                while watching.load(Ordering::Relaxed) {
                    let text = super::get_text(&c, &format!("http://{admin}/metrics")).await;
                    let value = super::metric(&text, gauge).expect("the gauge") as u64;
                    most.fetch_max(value, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        GaugeWatch {
            most,
            watching,
            task,
        }
    }

    /// Stops watching; the highest value seen.
    pub fn peak(self, runtime: &tokio::runtime::Runtime) -> u64 {
        self.watching.store(false, Ordering::Relaxed);
        runtime.block_on(self.task).unwrap();
        self.most.load(Ordering::Relaxed)
    }
}
