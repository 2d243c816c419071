//! The `tollgate` binary: CLI, logging and signals; everything else is in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

// A proxy allocates many small, short-lived buffers per request; mimalloc's
// thread-local free lists serve them without glibc's arena locking.
#[global_allocator]
static GLOBAL: tollgate::allocator::Mimalloc = tollgate::allocator::Mimalloc;

/// mimalloc asks for transparent huge pages on its arenas (`MADV_HUGEPAGE`),
/// so on a kernel set to `madvise` (the common default) every 2 MiB region it
/// touches becomes resident whole: 12 MiB of an idle tollgate's 23 MiB. A
/// proxy's heap is small and scattered; 4 KiB pages it is. This runs from
/// `.preinit_array`, before any constructor, so before mimalloc's first
/// allocation (from `main` it is too late: the first regions are already
/// huge pages). musl (the static `dist/build` binary) runs no
/// `.preinit_array`: there it is the first `.init_array` entry, priority 100,
/// ahead of mimalloc's own constructor (101).
#[cfg(target_os = "linux")]
#[used]
#[cfg_attr(not(target_env = "musl"), link_section = ".preinit_array")]
#[cfg_attr(target_env = "musl", link_section = ".init_array.00100")]
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

/// What `--help` says about the process as a whole: where the config comes
/// from, the environment it reads and the signals it answers.
const ENVIRONMENT_AND_SIGNALS: &str = "\
Config file: --config/-c PATH, else $TOLLGATE_CONFIG, else ./tollgate.yaml.

Environment:
  TOLLGATE_CONFIG   the config file when --config is not given (wins over ./tollgate.yaml)
  TOLLGATE_LOG      which log records to write, e.g. `debug` or `tollgate=debug,hyper=info`
                    (default `info`; the access log is `log.access`)
  ${VAR}            any variable a config value names, e.g. `token: ${TOLLGATE_ADMIN_TOKEN}`

Signals (to a running `tollgate serve`):
  SIGHUP            reload the config (as `tollgate reload` and the admin API's POST /reload)
  SIGUSR1           reopen log.access_file by its name (after logrotate moved it)
  SIGTERM, SIGINT   stop accepting, let requests in flight finish within server.shutdown_grace,
                    save every counter, exit 0";

#[derive(Parser)]
#[command(
    name = "tollgate",
    version = tollgate::build_info::version(),
    about = "A reverse proxy with built-in, durable rate limiting",
    after_help = ENVIRONMENT_AND_SIGNALS,
    // Our own `help` below: clap's refuses `help --help`.
    disable_help_subcommand = true
)]
struct Cli {
    /// Config file (default: $TOLLGATE_CONFIG, else ./tollgate.yaml).
    #[arg(short = 'c', long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Serve,
    /// Validate a config like `nginx -t`: a summary and exit 0, or every error and exit 1.
    /// Warnings (a route no request reaches, an unused limiter, …) are printed and exit 0.
    Check {
        /// Treat warnings as errors: exit 1 when there is any (for CI pipelines).
        #[arg(long)]
        strict: bool,
        /// Give up (exit 1) when reading and checking take longer than this: a file on a stalled
        /// disk or a listen name the resolver never answers cannot hang the check.
        #[arg(long, default_value = "10s", value_parser = config::raw::parse_duration)]
        timeout: Duration,
    },
    /// Probe the admin /healthz of a running tollgate (for Docker HEALTHCHECK); exit 0 when healthy.
    Healthcheck {
        /// The URL to probe; default: the admin listener of the config.
        #[arg(long)]
        url: Option<String>,
    },
    /// Make the running tollgate reload its config, like `nginx -s reload`: POST /reload to the
    /// admin listener the config names (with its admin.token or admin.token_file); exit 0 when the
    /// new config is in force (its warnings printed), 1 with its errors when it was rejected (the
    /// old one stays).
    Reload {
        /// Treat warnings as errors: a config with any is not applied (the old one stays), exit 1.
        #[arg(long)]
        strict: bool,
    },
    /// Print the tollgate config another server's site rules mean (to stdout), with a note or
    /// warning for every line not translated (to stderr, naming the line).
    #[command(subcommand)]
    Import(Import),
    /// Print this help, or a command's.
    Help {
        /// The command to explain.
        command: Option<String>,
    },
}

#[derive(Subcommand)]
enum Import {
    /// An Apache .htaccess. Translated: RewriteRule (flags L, END, R=nnn, NC, QSA, F, G) with
    /// RewriteCond on %{REQUEST_FILENAME} -f/-d/!-f/!-d, %{REQUEST_URI}, %{QUERY_STRING} and
    /// %{HTTP_HOST}; RewriteBase; Redirect, RedirectMatch, RedirectPermanent, RedirectTemp;
    /// <Files>/<FilesMatch> with Require all denied, Deny from all, Order, Require ip,
    /// Allow from and Header; Require ip, Allow/Deny from; AuthType Basic, AuthName,
    /// AuthUserFile, Require valid-user; Header set/append/unset, RequestHeader; <IfModule>.
    /// Noted as needing nothing: Options, DirectoryIndex, AddType, Expires*, php_value, gzip
    /// siblings, E=/T= flags. Warned: anything else, each with its line.
    Htaccess {
        /// The .htaccess file.
        file: PathBuf,
        /// The document root php-fpm sees (default: the file's directory). When the file lies
        /// below it, its rules apply under that subdirectory's URL path.
        #[arg(long)]
        root: Option<PathBuf>,
        /// php-fpm's address.
        #[arg(long, default_value = "fastcgi://127.0.0.1:9000")]
        upstream: String,
    },
}

fn config_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    // The environment is explicit, a file in the working directory may be a leftover.
    if let Some(p) = std::env::var_os("TOLLGATE_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    let local = PathBuf::from("tollgate.yaml");
    if local.exists() {
        return Ok(local);
    }
    anyhow::bail!("no config: pass --config PATH, set TOLLGATE_CONFIG, or create ./tollgate.yaml")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => config_path(cli.config).and_then(|p| serve(&p)),
        Command::Check { strict, timeout } => {
            config_path(cli.config).map(|p| check(&p, strict, timeout))
        }
        Command::Healthcheck { url } => healthcheck(url, cli.config),
        Command::Reload { strict } => reload(cli.config, strict),
        Command::Import(what) => import(what),
        Command::Help { command } => help(command.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &Path, strict: bool, timeout: Duration) -> ExitCode {
    match config::check_file_within(path, timeout) {
        Ok(c) => {
            for w in &c.warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            if strict && !c.warnings.is_empty() {
                let n = c.warnings.len();
                eprintln!(
                    "{}: {n} warning{} and --strict: not ok",
                    path.display(),
                    if n == 1 { "" } else { "s" }
                );
                return ExitCode::FAILURE;
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
    // Opened here once, so a path tollgate cannot write stops the start;
    // the access log's writer thread opens it again for itself.
    if let Some(file) = &config.log.access_file {
        tollgate::access::open_file(file)
            .with_context(|| format!("cannot open log.access_file {}", file.display()))?;
    }
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
        let store = Store::open(&config.store, &config.stored_limiters(), clock.now())
            .context("cannot open the store")?;
        let listeners = Listeners::bind(&config).await?;
        // Bound: connections queue from now on, so a `Type=notify` unit is ready.
        notify_systemd("READY=1");
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
    notify_systemd("STOPPING=1");
    shutdown.cancel();
}

/// Tells systemd (when it started us with `$NOTIFY_SOCKET`) a state change;
/// a failure is logged, never fatal: the proxy serves either way.
fn notify_systemd(state: &str) {
    if let Err(e) = tollgate::sd_notify::notify(state) {
        tracing::warn!("cannot tell systemd {state}: {e}");
    }
}

/// Prints the help of `command` (or the whole program's).
fn help(command: Option<&str>) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    // Built, so a command's usage line names its parent and the global `--config`.
    cli.build();
    match command {
        None => cli.print_help()?,
        Some(name) => match cli.find_subcommand_mut(name) {
            Some(sub) => sub.print_help()?,
            None => anyhow::bail!("no command {name:?}; `tollgate --help` lists them"),
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// `tollgate import …`: the config on stdout, the findings on stderr; exit 0
/// (a line that could not be translated is a warning, not a failure).
fn import(what: Import) -> anyhow::Result<ExitCode> {
    let Import::Htaccess {
        file,
        root,
        upstream,
    } = what;
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let dir = std::fs::canonicalize(&file)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let root = match root {
        Some(r) => std::fs::canonicalize(&r).with_context(|| format!("no root {}", r.display()))?,
        None => dir.clone(),
    };
    // A file below the root applies under its directory's URL path.
    let prefix = match dir.strip_prefix(&root) {
        Ok(rel) if !rel.as_os_str().is_empty() => format!("/{}/", rel.display()),
        _ => "/".to_string(),
    };
    let options = tollgate::import::htaccess::Options {
        root: root.display().to_string(),
        upstream_url: upstream,
        prefix,
    };
    let site = tollgate::import::htaccess::translate(&text, &options);
    print!("{}", site.to_yaml());
    eprint!("{}", site.report(&file.display().to_string()));
    Ok(ExitCode::SUCCESS)
}

/// A plain HTTP/1.1 GET with no dependencies, so the Docker image needs no curl.
fn healthcheck(url: Option<String>, config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let url = match url {
        Some(u) => u,
        None => {
            let admin = AdminFields::read(&config_path(config)?)?;
            format!("http://{}/healthz", local_admin(admin.address()?))
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
    let (status_line, _) = http_exchange(addr, authority, "GET", &path, None)?;
    let healthy = status_line.starts_with("HTTP/1.1 200");
    println!(
        "{}",
        if status_line.is_empty() {
            "no answer"
        } else {
            &status_line
        }
    );
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `tollgate reload`: POST /reload to the admin listener of the config, with
/// its token, and report what the running process answered (every warning
/// of an applied config included; see [`tollgate::reload::report`]).
fn reload(config: Option<PathBuf>, strict: bool) -> anyhow::Result<ExitCode> {
    let admin = AdminFields::read(&config_path(config)?)?;
    let addr = local_admin(admin.address()?);
    let token = admin.token()?;
    let path = if strict {
        "/reload?strict=true"
    } else {
        "/reload"
    };
    let (status_line, body) =
        http_exchange(addr, &addr.to_string(), "POST", path, token.as_deref())
            .with_context(|| format!("is tollgate running with its admin listener on {addr}?"))?;
    let report = tollgate::reload::report(&status_line, &body, strict);
    for line in &report.err {
        eprintln!("{line}");
    }
    for line in &report.out {
        println!("{line}");
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where to reach an admin listener from this host: an unspecified address
/// (`0.0.0.0:9901`) is asked on loopback.
fn local_admin(mut addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// One HTTP/1.1 exchange on a fresh connection (3 s timeouts): the status
/// line (empty when the server closed without one) and the body.
fn http_exchange(
    addr: std::net::SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(String, String)> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(3);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status_line = head.lines().next().unwrap_or_default().to_string();
    Ok((status_line, body.to_string()))
}

/// The strings under the top-level `admin:` of a config file that `healthcheck`
/// and `reload` need, read without validating the rest: the running process
/// may have rightly rejected an edit the file now holds, and that must not
/// stop the probe (and the container) from being healthy, or `tollgate
/// reload` from reaching the process to hear why.
struct AdminFields {
    listen: Option<String>,
    token: Option<String>,
    token_file: Option<String>,
}

impl AdminFields {
    /// Reads the config file once, under the loader's rules (a regular file,
    /// within its bound), and parses it once.
    fn read(path: &Path) -> anyhow::Result<AdminFields> {
        let bytes = config::read_named_file(path, config::CONFIG_FILE_LIMIT)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("cannot read {}: it is not UTF-8 text", path.display()))?;
        let doc: Option<serde_yaml::Value> = serde_yaml::from_str(&text).ok();
        let field = |name| admin_field(doc.as_ref(), &text, name);
        Ok(AdminFields {
            listen: field("listen"),
            token: field("token"),
            token_file: field("token_file"),
        })
    }

    /// The admin address (127.0.0.1:9901 when the file names none).
    fn address(&self) -> anyhow::Result<std::net::SocketAddr> {
        let Some(listen) = &self.listen else {
            return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], 9901)));
        };
        let listen = config::expand_env(listen, |n| std::env::var(n).ok())
            .map_err(|e| anyhow::anyhow!("admin.listen: {e}"))?;
        std::net::ToSocketAddrs::to_socket_addrs(listen.as_str())
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("admin.listen: {listen:?} is not host:port"))
    }

    /// `admin.token`, with `${VAR}` expanded, or the content of `admin.token_file`.
    fn token(&self) -> anyhow::Result<Option<String>> {
        if let Some(token) = &self.token {
            let token = config::expand_env(token, |n| std::env::var(n).ok())
                .map_err(|e| anyhow::anyhow!("admin.token: {e}"))?;
            return Ok(Some(token));
        }
        let Some(file) = &self.token_file else {
            return Ok(None);
        };
        let bytes = config::read_named_file(Path::new(file), config::SMALL_FILE_LIMIT)
            .with_context(|| format!("admin.token_file: cannot read {file}"))?;
        let token = String::from_utf8(bytes)
            .with_context(|| format!("admin.token_file: {file} is not UTF-8 text"))?;
        Ok(Some(token.trim().to_string()))
    }
}

/// A string under `admin:`, from the parsed document, or when the text is
/// not even YAML, from a `name:` line in a top-level `admin:` block.
fn admin_field(doc: Option<&serde_yaml::Value>, text: &str, name: &str) -> Option<String> {
    match doc {
        Some(doc) => doc
            .get("admin")
            .and_then(|a| a.get(name))
            .and_then(|l| l.as_str())
            .map(str::to_string),
        // Not even YAML: look for `name:` in a top-level `admin:` block.
        None => text
            .lines()
            .skip_while(|l| !l.starts_with("admin:"))
            .skip(1)
            .take_while(|l| l.starts_with([' ', '\t']) || l.trim().is_empty())
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(|v| {
                v.split(" #")
                    .next()
                    .unwrap_or(v)
                    .trim()
                    .trim_matches(['"', '\''])
                    .to_string()
            }),
    }
}
