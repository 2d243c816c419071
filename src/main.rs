//! The `tollgate` binary: CLI, logging and signals; everything else is in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

// A proxy allocates many small, short-lived buffers per request; mimalloc's
// thread-local free lists serve them without glibc's arena locking.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc asks for transparent huge pages on its arenas (`MADV_HUGEPAGE`),
/// so on a kernel set to `madvise` (the common default) every 2 MiB region it
/// touches becomes resident whole: 12 MiB of an idle tollgate's 23 MiB. A
/// proxy's heap is small and scattered; 4 KiB pages it is. This runs from
/// `.preinit_array`, before any constructor, so before mimalloc's first
/// allocation (from `main` it is too late: the first regions are already
/// huge pages).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".preinit_array"]
static NO_TRANSPARENT_HUGE_PAGES: extern "C" fn() = no_transparent_huge_pages;

#[cfg(target_os = "linux")]
extern "C" fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process and
    // allocates nothing; the result is ignored (a kernel without it keeps
    // huge pages, which costs memory, not correctness).
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use tollgate::app::ConfigSource;
use tollgate::clock::{Clock, SystemClock};
use tollgate::config;
use tollgate::store::Store;
use tollgate::workers::Workers;
use tollgate::{App, Listeners, RunOptions};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A reverse proxy with built-in, durable rate limiting"
)]
struct Cli {
    /// Config file (default: ./tollgate.yaml, else $TOLLGATE_CONFIG).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Serve,
    /// Validate a config like `nginx -t`: a summary and exit 0, or every error and exit 1.
    Check,
    /// Probe the admin /healthz of a running tollgate (for Docker HEALTHCHECK); exit 0 when healthy.
    Healthcheck {
        /// The URL to probe; default: the admin listener of the config.
        #[arg(long)]
        url: Option<String>,
    },
}

fn config_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let local = PathBuf::from("tollgate.yaml");
    if local.exists() {
        return Ok(local);
    }
    match std::env::var_os("TOLLGATE_CONFIG") {
        Some(p) => Ok(PathBuf::from(p)),
        None => anyhow::bail!(
            "no config: pass --config PATH, create ./tollgate.yaml, or set TOLLGATE_CONFIG"
        ),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => config_path(cli.config).and_then(|p| serve(&p)),
        Command::Check => config_path(cli.config).map(|p| check(&p)),
        Command::Healthcheck { url } => healthcheck(url, cli.config),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match config::load_file(path).and_then(|c| config::require_routes(c, path)) {
        Ok(c) => {
            for w in &c.warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            println!(
                "{}: ok: {} listener(s), {} route(s), {} limiter(s), {} upstream(s), store {}, admin on {}",
                path.display(),
                c.server.public().len(),
                c.routes.len(),
                c.limiters.len(),
                c.upstreams.len(),
                // The effective-config view: a Redis password never reaches a terminal.
                tollgate::admin::effective_config(&c)["store"],
                c.admin.listen
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(path: &Path) -> anyhow::Result<ExitCode> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (config, text) = config::load_file_text(path)
        .and_then(|(c, text)| Ok((config::require_routes(c, path)?, text)))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // After the config: its `log.format` decides the format of every line.
    // Changing it takes a restart; `log.access` reloads live.
    tollgate::logging::init(config.log.format);
    // Connections are served by one single-threaded runtime per worker
    // (see `tollgate::workers`); this one accepts, runs the admin API,
    // reloads and background work.
    let workers =
        Arc::new(Workers::start(config.server.workers).context("cannot start the worker threads")?);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store = Store::open(&config.store, &config.limiters, clock.now())
            .context("cannot open the store")?;
        let listeners = Listeners::bind(&config).await?;
        let source = ConfigSource {
            path: path.to_path_buf(),
            text,
        };
        let app = App::new(config, store, clock, Some(source));
        let persisted = app.clone();
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        let options = RunOptions {
            config_path: Some(path.to_path_buf()),
            watch_every: Some(Duration::from_millis(250)),
            workers: Some(workers),
        };
        tollgate::run(listeners, app, options, shutdown).await;
        // `run` made the last save; a supervisor must learn that it failed.
        match persisted.shared.store.shutdown() {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("tollgate: {e}");
                Ok(ExitCode::FAILURE)
            }
        }
    })
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    shutdown.cancel();
}

/// A plain HTTP/1.1 GET with no dependencies, so the Docker image needs no curl.
fn healthcheck(url: Option<String>, config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let url = match url {
        Some(u) => u,
        None => {
            let path = config_path(config)?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut addr = admin_address(&text)?;
            if addr.ip().is_unspecified() {
                addr.set_ip(match addr {
                    std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            format!("http://{addr}/healthz")
        }
    };
    let rest = url
        .strip_prefix("http://")
        .context("healthcheck URLs start with http://")?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .with_context(|| format!("cannot resolve {authority}"))?
        .next()
        .with_context(|| format!("no address for {authority}"))?;
    let timeout = Duration::from_secs(3);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    let healthy = line.starts_with("HTTP/1.1 200");
    println!("{}", line.lines().next().unwrap_or("no answer"));
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The admin address a config file names, read without validating the rest:
/// the running process may have rightly rejected an edit the file now holds,
/// and that must not make the probe (and the container) unhealthy.
fn admin_address(text: &str) -> anyhow::Result<std::net::SocketAddr> {
    let doc: Option<serde_yaml::Value> = serde_yaml::from_str(text).ok();
    let listen = match &doc {
        Some(doc) => doc
            .get("admin")
            .and_then(|a| a.get("listen"))
            .and_then(|l| l.as_str())
            .map(str::to_string),
        // Not even YAML: look for `listen:` in a top-level `admin:` block.
        None => text
            .lines()
            .skip_while(|l| !l.starts_with("admin:"))
            .skip(1)
            .take_while(|l| l.starts_with([' ', '\t']) || l.trim().is_empty())
            .find_map(|l| l.trim().strip_prefix("listen:"))
            .map(|v| {
                v.split(" #")
                    .next()
                    .unwrap_or(v)
                    .trim()
                    .trim_matches(['"', '\''])
                    .to_string()
            }),
    };
    let Some(listen) = listen else {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], 9901)));
    };
    let listen = config::expand_env(&listen, |n| std::env::var(n).ok())
        .map_err(|e| anyhow::anyhow!("admin.listen: {e}"))?;
    std::net::ToSocketAddrs::to_socket_addrs(listen.as_str())
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("admin.listen: {listen:?} is not host:port"))
}
