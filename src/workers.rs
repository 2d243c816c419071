//! Worker threads: one single-threaded runtime per core, so a connection and its upstream calls stay on one thread.
//!
//! Measured on a 2-core box, tokio's work-stealing runtime spent much of a
//! proxied request in cross-thread wake-ups: the downstream connection task,
//! the pooled upstream connection task and the request future often sat on
//! different threads. Here the accept loop hands each connection to one
//! worker (round robin), and each worker has its own upstream pools
//! ([`current`] picks them), so a request never leaves its thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

static COUNT: AtomicUsize = AtomicUsize::new(0);

/// This thread's worker number, 1-based; 0 outside the worker threads
/// (the main runtime, tests).
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// How many worker threads run (0 when none were started).
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// Hands this thread's freed memory back to the OS. mimalloc (the binary's
/// allocator) keeps freed pages in per-thread free lists, and memory one
/// thread frees that another allocated is only reclaimed when the owner
/// collects; after a wave of client keys expired, every worker must.
pub fn release_memory() {
    // SAFETY: mi_collect only walks this thread's own heap; it is a no-op
    // when mimalloc is not the allocator in use (it then owns nothing).
    unsafe { libmimalloc_sys::mi_collect(true) }
}

pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` worker threads, each running a current-thread runtime.
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let n = n.max(1);
        COUNT.store(n, Ordering::Relaxed);
        let mut workers = Workers {
            handles: Vec::with_capacity(n),
            next: AtomicUsize::new(0),
            stops: Vec::with_capacity(n),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-worker-{}", i + 1))
                .spawn(move || {
                    WORKER.with(|w| w.set(i + 1));
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = handle_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = handle_tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async {
                        let _ = stop_rx.await;
                    });
                })?;
            let handle = handle_rx
                .recv()
                .map_err(|_| std::io::Error::other("a worker thread died at start"))??;
            workers.handles.push(handle);
            workers.stops.push(stop_tx);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// The runtime the next connection goes to.
    pub fn pick(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }

    /// Runs [`release_memory`] on every worker thread.
    pub fn release_memory(&self) {
        for h in &self.handles {
            h.spawn(async { release_memory() });
        }
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.handles.len())
            .finish()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_knows_its_number_and_connections_go_round_robin() {
        let workers = Workers::start(2).unwrap();
        let seen: Vec<usize> = (0..4)
            .map(|_| {
                let (tx, rx) = std::sync::mpsc::channel();
                workers
                    .pick()
                    .spawn(async move { tx.send(current()).unwrap() });
                rx.recv().unwrap()
            })
            .collect();
        assert_eq!(seen, vec![1, 2, 1, 2]);
        assert_eq!(current(), 0, "the test thread is no worker");
    }
}
