//! A future polled only when its own waker fired: a connection's rare events (drain, displacement, its timers) beside the connection itself.
//!
//! A `select!` polls every branch whenever the task wakes, and a client
//! connection's task wakes several times per request (the head, the
//! upstream's answer, the body's end). Polling the drain and displacement
//! tokens and the idle timer each time took a lock per token and a timer
//! check: ~1,400 instructions per request (callgrind), for events that
//! happen once in a connection's life. [`OnWake`] gives the wrapped future
//! a waker of its own and polls it only after that waker fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// `F`, polled on its first poll and then only after it asked to be.
pub struct OnWake<F> {
    future: Pin<Box<F>>,
    flag: Arc<Flag>,
    /// `flag` as a waker, made once: the future's registrations compare
    /// equal from poll to poll and are not renewed.
    waker: Waker,
}

/// Whether the wrapped future's waker fired since it was last polled, and
/// the task to wake when it does.
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> OnWake<F> {
    /// Boxed once, for the connection's life: the wrapper moves, the
    /// future (which may hold timers) stays where it was pinned.
    pub fn new(future: F) -> OnWake<F> {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        OnWake {
            future: Box::pin(future),
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

impl<F: Future> Future for OnWake<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake between the two still
        // finds the task's waker and wakes it.
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let this = &mut *self;
        this.future
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set, and wakes through the
    /// waker it was last polled with when `wake` is called.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: parking_lot::Mutex<Option<Waker>>,
    }

    struct Polled(Arc<Probe>);

    impl Future for Polled {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::Relaxed);
            if self.0.ready.load(Ordering::Relaxed) {
                return Poll::Ready(());
            }
            *self.0.waker.lock() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// The task's waker: counts the times it is woken.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_future_is_polled_first_and_then_only_after_its_own_waker_fired() {
        let probe = Arc::new(Probe::default());
        let task = Arc::new(Task::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut gated = OnWake::new(Polled(probe.clone()));
        assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 1);
        // The task wakes for other reasons (the connection's own I/O):
        // the future is not polled again.
        for _ in 0..5 {
            assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::Relaxed), 1);
        // Its own waker fires: the task is woken, and the next poll reaches it.
        probe.ready.store(true, Ordering::Relaxed);
        let own = probe.waker.lock().take().expect("the future kept a waker");
        own.wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1);
        assert!(Pin::new(&mut gated).poll(&mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_wake_from_another_task_ends_the_wait_beside_a_future_that_never_ends() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let gated = OnWake::new(rx);
        tokio::spawn(async move { tx.send(7) });
        let got = tokio::select! {
            biased;
            _ = std::future::pending::<()>() => unreachable!("never ready"),
            got = gated => got,
        };
        assert_eq!(got, Ok(7));
    }
}
