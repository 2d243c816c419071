//! The listeners in service: bound, started, swapped by a reload (new ones bound before anything commits, removed ones drained) and shut down.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{accept_loop, admin_acceptor, public_acceptor, AdminHandler};
use crate::app::App;
use crate::tls::Terminator;
use crate::workers::Workers;

/// The listeners in service, keyed by their configured address, so a reload
/// can bind new ones and drain removed ones without a restart.
pub struct ListenerSet {
    app: App,
    /// TLS termination for the TLS listeners; reloads swap its certificates.
    tls: Arc<Terminator>,
    admin_handler: AdminHandler,
    connections: TaskTracker,
    stop_all: CancellationToken,
    drain_all: CancellationToken,
    public: Vec<Running>,
    admin: Option<Running>,
    /// Worker runtimes connections are handed to; `None` = this runtime.
    workers: Option<Arc<Workers>>,
}

struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
    drain: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Sockets bound for a reload that has not been applied yet.
pub struct Pending {
    public: Vec<(SocketAddr, TcpListener)>,
    admin: Option<(SocketAddr, TcpListener)>,
}

/// Binds without awaiting, so a reload can do it before it commits to anything.
pub fn bind_now(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}

impl ListenerSet {
    /// Public listeners serve `app`; the admin listener serves `admin_handler`.
    pub fn new(
        app: App,
        tls: Arc<Terminator>,
        admin_handler: AdminHandler,
        connections: TaskTracker,
        stop_all: CancellationToken,
        workers: Option<Arc<Workers>>,
    ) -> ListenerSet {
        ListenerSet {
            app,
            tls,
            admin_handler,
            connections,
            stop_all,
            drain_all: CancellationToken::new(),
            public: Vec::new(),
            admin: None,
            workers,
        }
    }

    pub fn start_public(&mut self, addr: SocketAddr, listener: TcpListener) {
        if let Ok(local) = listener.local_addr() {
            let serves = self.app.snapshot().config.server.serve_at(addr);
            tracing::info!(addr = %local, ?serves, "listening");
        }
        // The port clients connect to (the bound one, when the config said 0).
        let port = listener.local_addr().map_or(addr.port(), |a| a.port());
        let stop = self.stop_all.child_token();
        let drain = self.drain_all.child_token();
        let acceptor = public_acceptor(
            self.app.clone(),
            self.tls.clone(),
            addr,
            port,
            drain.clone(),
            self.connections.clone(),
            self.workers.clone(),
        );
        let task = tokio::spawn(accept_loop(listener, stop.clone(), acceptor));
        self.public.push(Running {
            addr,
            stop,
            drain,
            task,
        });
    }

    pub fn start_admin(&mut self, addr: SocketAddr, listener: TcpListener) {
        if let Ok(local) = listener.local_addr() {
            tracing::info!(addr = %local, "admin API listening");
        }
        let stop = self.stop_all.child_token();
        let acceptor = admin_acceptor(self.admin_handler.clone(), stop.clone());
        let task = tokio::spawn(accept_loop(listener, stop.clone(), acceptor));
        self.admin = Some(Running {
            addr,
            drain: stop.clone(),
            stop,
            task,
        });
    }

    /// Binds what `listen` / `admin` add to the running set; nothing changes yet.
    pub fn prepare(&self, listen: &[SocketAddr], admin: SocketAddr) -> std::io::Result<Pending> {
        let mut pending = Pending {
            public: Vec::new(),
            admin: None,
        };
        for addr in listen {
            if !self.public.iter().any(|r| r.addr == *addr) {
                pending.public.push((*addr, bind_now(*addr)?));
            }
        }
        if self.admin.as_ref().is_some_and(|a| a.addr != admin) {
            pending.admin = Some((admin, bind_now(admin)?));
        }
        Ok(pending)
    }

    /// Starts what `pending` bound and drains the listeners `listen` no longer names.
    pub fn commit(&mut self, pending: Pending, listen: &[SocketAddr]) {
        for (addr, listener) in pending.public {
            self.start_public(addr, listener);
        }
        self.public.retain(|r| {
            let keep = listen.contains(&r.addr);
            if !keep {
                tracing::info!(addr = %r.addr, "listener removed by reload; draining its connections");
                r.stop.cancel();
                r.drain.cancel();
            }
            keep
        });
        if let Some((addr, listener)) = pending.admin {
            if let Some(old) = self.admin.take() {
                tracing::info!(addr = %old.addr, "admin listener moved by reload");
                old.stop.cancel();
            }
            self.start_admin(addr, listener);
        }
    }

    /// Stops accepting everywhere, waits until every accept loop has returned,
    /// then tells every connection to finish its request and close.
    pub async fn shutdown(&mut self) {
        self.stop_all.cancel();
        for r in self.public.drain(..).chain(self.admin.take()) {
            let _ = r.task.await;
        }
        self.drain_all.cancel();
    }
}
