//! Worker threads: one single-threaded runtime per core, so a connection and its upstream calls stay on one thread.
//!
//! Measured on a 2-core box, tokio's work-stealing runtime spent much of a
//! proxied request in cross-thread wake-ups: the downstream connection task,
//! the pooled upstream connection task and the request future often sat on
//! different threads. Here the accept loop hands each connection to one
//! worker (round robin, [`Workers::pick`] names it), and each worker has its
//! own slot in every upstream pool: the worker's number travels with the
//! request (`ConnInfo::worker`), so a request never
//! leaves its thread. Pools are sized from `server.workers`, which a reload
//! cannot change.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

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

    /// The worker the next connection goes to: its number (1-based) and runtime.
    pub fn pick(&self) -> (usize, &Handle) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        (i + 1, &self.handles[i])
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
    fn connections_go_round_robin_each_to_the_runtime_of_the_worker_named() {
        let workers = Workers::start(2).unwrap();
        let seen: Vec<(usize, String)> = (0..4)
            .map(|_| {
                let (tx, rx) = std::sync::mpsc::channel();
                let (worker, runtime) = workers.pick();
                runtime.spawn(async move {
                    let thread = std::thread::current().name().unwrap_or("").to_string();
                    tx.send(thread).unwrap()
                });
                (worker, rx.recv().unwrap())
            })
            .collect();
        let expected: Vec<(usize, String)> = [1, 2, 1, 2]
            .into_iter()
            .map(|w| (w, format!("tollgate-worker-{w}")))
            .collect();
        assert_eq!(seen, expected);
    }
}
