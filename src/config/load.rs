//! Everything validation leaves to the outside world: reading the config file, resolving listen names, and reading the certificate, CA, token and API key files it names.
//!
//! The order is: scan the text, deserialize it, [`survey`] the machine,
//! validate (pure), then read the files. Certificates and CA bundles are
//! read even when validation found problems, so `tollgate check` names a
//! broken file and a misspelt key in one pass; the token and API key files
//! only once everything else is valid. Every problem here carries a YAML
//! path, exactly like a validation problem, and all are located at the end.
//!
//! Every file is read through [`read_named_file`]: opened without blocking
//! (a FIFO cannot hang the open), refused unless it is a regular file (a
//! FIFO, a device such as `/dev/zero`, a directory), and read up to a bound
//! per kind (the `*_LIMIT` constants), so neither `check` nor a reload can
//! hang on a file or read one until memory runs out.
//!
//! All of this blocks (file reads, DNS): async callers run it on a blocking thread.

use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::acme::SharedKey;
use super::certs::{self, TlsError};
use super::error::locate_all;
use super::raw::RawConfig;
use super::validate::{self, Host};
use super::{
    explain, locate, scan, AdminConfig, ApiKeyEntry, CertConfig, CertSet, Config, ConfigError,
    ConfigProblem, IdentityConfig, PassKeys, TlsConfig, UpstreamTls,
};

/// The most of the config file that is read.
pub const CONFIG_FILE_LIMIT: u64 = 4 << 20;
/// The most of `identity.api_keys_file` that is read (about 200,000 keys).
pub const KEYS_FILE_LIMIT: u64 = 16 << 20;
/// The most of `admin.token_file` and of each certificate, private key and CA bundle.
pub const SMALL_FILE_LIMIT: u64 = 1 << 20;
/// The most of each `error_pages` file: a page is held in memory and copied
/// into every answer that uses it.
pub const PAGE_FILE_LIMIT: u64 = 256 << 10;

/// Reads a file the config names (or the config itself): opened with
/// `O_NONBLOCK` so that a FIFO does not block the open, refused unless it
/// is a regular file, and never more than `limit` bytes. The error says
/// what the file is instead; its caller names the key and the path.
pub fn read_named_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO (named pipe)"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}; only a regular file is read"),
        ));
    }
    let too_big = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {}, the most read for it", size(limit)),
        )
    };
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // One byte past the bound tells a file that grew while it was read.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big());
    }
    Ok(bytes)
}

/// `limit` in the units the docs use.
fn size(limit: u64) -> String {
    match limit {
        l if l >= 1 << 20 && l % (1 << 20) == 0 => format!("{} MiB", l >> 20),
        l if l >= 1 << 10 && l % (1 << 10) == 0 => format!("{} KiB", l >> 10),
        l => format!("{l} bytes"),
    }
}

/// Certificates, keys and CA bundles, for [`certs`].
fn read_small_file(path: &Path) -> std::io::Result<Vec<u8>> {
    read_named_file(path, SMALL_FILE_LIMIT)
}

/// Reads and validates a config file.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load_file_text(path).map(|(config, _)| config)
}

/// Reads and validates a config file, returning the text it was built from.
pub fn load_file_text(path: &Path) -> Result<(Config, String), ConfigError> {
    let cannot =
        |e: String| ConfigError::single(Some(path), format!("cannot read config: {e}"), None);
    let bytes = read_named_file(path, CONFIG_FILE_LIMIT).map_err(|e| cannot(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| cannot("it is not UTF-8 text".into()))?;
    match parse(&text) {
        Ok(config) => Ok((config, text)),
        Err(mut e) => {
            e.file = Some(path.to_path_buf());
            Err(e)
        }
    }
}

/// A config file with no routes answers every request 404 and limits
/// nothing: most often a truncated or emptied file. It runs only when it
/// says so (`allow_no_routes: true`): `tollgate serve`, `tollgate check` and
/// every reload pass the config they loaded from `file` through here (a
/// pure check; a program embedding the library decides for itself).
pub fn require_routes(config: Config, file: &Path) -> Result<Config, ConfigError> {
    if config.routes.is_empty() && !config.allow_no_routes {
        let mut e = ConfigError::new(vec![ConfigProblem::at(
            "routes",
            "no routes: every request would get 404 and no limit would apply \
             (a truncated file?); define routes, or set `allow_no_routes: true` \
             to run without any",
        )]);
        e.file = Some(file.to_path_buf());
        return Err(e);
    }
    Ok(config)
}

/// What `tollgate check` does, bounded: reads, validates and requires
/// routes of the config at `path` on a thread of its own, and waits at most
/// `deadline` for it. A file on a stalled disk or a listen name the resolver
/// never answers cannot hang the check: past the deadline it is one problem
/// saying so, and the thread is left behind (the process is about to exit).
pub fn check_file_within(path: &Path, deadline: Duration) -> Result<Config, ConfigError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("check".into())
        .spawn(move || {
            let checked = load_file(&owned).and_then(|c| require_routes(c, &owned));
            let _ = tx.send(checked);
        });
    if let Err(e) = spawned {
        let message = format!("cannot start the check: {e}");
        return Err(ConfigError::single(Some(path), message, None));
    }
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        let message = format!(
            "reading and checking the config took longer than {deadline:?} and was given up \
             (a file on a stalled disk, or a listen name the resolver does not answer?)"
        );
        Err(ConfigError::single(Some(path), message, None))
    })
}

/// Parses and validates YAML text, then reads the files it names.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    // One pass of the event reader checks the text and indexes where each
    // path is written; serde then reads it once into the raw config.
    let mut index = locate::Index::default();
    let problems = scan::scan(text, &mut index);
    if !problems.is_empty() {
        return Err(ConfigError::new(problems));
    }
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        serde_yaml::from_str(text)
            .map_err(|e| ConfigError::new(vec![schema_problem(&e, &index)]))?
    };
    let checked = validate::check(&raw, &survey(&raw));
    let mut config = checked.config;
    let mut problems = checked.problems;
    if let Some(tls) = &mut config.server.tls {
        problems.extend(read_certificates(tls, &checked.cert_paths));
    }
    problems.extend(read_upstream_cas(&mut config));
    if problems.is_empty() {
        problems.extend(read_token_file(&mut config.admin));
    }
    if problems.is_empty() {
        problems.extend(read_key_file(&mut config.identity));
    }
    if problems.is_empty() {
        problems.extend(read_error_pages(&mut config));
        problems.extend(read_pass_file(&mut config.identity));
        problems.extend(read_shared_key_file(&mut config));
        problems.extend(read_users_files(&mut config));
        problems.extend(read_geoip_files(&mut config.identity));
        problems.extend(read_crowdsec_files(&mut config.identity));
    }
    if problems.is_empty() {
        warn_missing_fastcgi_files(&mut config);
    }
    if problems.is_empty() {
        locate_all(&mut config.warnings, &index);
        Ok(config)
    } else {
        locate_all(&mut problems, &index);
        Err(ConfigError::new(problems))
    }
}

/// What validation needs from the machine: its cores, and the address of
/// every listen name that is not a literal `IP:port` (a DNS lookup each).
pub fn survey(raw: &RawConfig) -> Host {
    let tls_listen = raw.server.tls.as_ref().and_then(|t| t.listen.as_ref());
    let names = [raw.server.listen.as_ref(), tls_listen]
        .into_iter()
        .flatten()
        .flat_map(|l| l.entries("").into_iter().map(|(_, name)| name))
        .chain(raw.admin.listen.as_ref().map(|t| t.0.as_str()));
    let mut resolved = HashMap::new();
    for name in names {
        if name.parse::<SocketAddr>().is_ok() || resolved.contains_key(name) {
            continue;
        }
        if let Some(addr) = name.to_socket_addrs().ok().and_then(|mut it| it.next()) {
            resolved.insert(name.to_string(), addr);
        }
    }
    Host {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        resolved,
    }
}

/// Reads and checks every `server.tls` pair; `at` holds each pair's YAML path.
fn read_certificates(tls: &mut TlsConfig, at: &[String]) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    for (pair, path) in tls.certs.iter().zip(at) {
        // One pair at a time, so every broken pair is reported with its own YAML path.
        if let Err(e) = CertSet::load(std::slice::from_ref(pair), &read_small_file) {
            let field = broken_file(pair, &e);
            problems.push(ConfigProblem::at(format!("{path}.{field}"), e.to_string()));
        }
    }
    if !problems.is_empty() {
        return problems;
    }
    match CertSet::load(&tls.certs, &read_small_file) {
        Ok(set) => tls.loaded = Arc::new(set),
        // A file changed between the two reads; the next reload sees it settled.
        Err(e) => problems.push(ConfigProblem::at("server.tls", e.to_string())),
    }
    problems
}

/// Which of a pair's two keys (`cert` or `key`) names the file that failed.
fn broken_file(pair: &CertConfig, e: &TlsError) -> &'static str {
    match e {
        TlsError::Read { path, .. } | TlsError::Pem { path, .. } if *path == pair.cert => "cert",
        TlsError::NoCertificate { .. } | TlsError::Certificate { .. } => "cert",
        _ => "key",
    }
}

/// Reads the `ca:` bundle of every https:// upstream that names one.
fn read_upstream_cas(config: &mut Config) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    for upstream in &mut config.upstreams {
        if let UpstreamTls::Ca { path, certs } = &mut upstream.tls {
            match certs::load_ca(path, &read_small_file) {
                Ok(read) => *certs = read,
                Err(e) => problems.push(ConfigProblem::at(
                    format!("upstreams.{}.ca", upstream.name),
                    e.to_string(),
                )),
            }
        }
    }
    problems
}

/// Fills `admin.token` from `admin.token_file`, when one is named. The
/// file holds the token alone; surrounding whitespace (a trailing newline
/// from `echo` or a secret mount) is not part of it. Read on every load and
/// reload, so a rotated secret is picked up by `SIGHUP` or `POST /reload`.
fn read_token_file(admin: &mut AdminConfig) -> Option<ConfigProblem> {
    let path = admin.token_file.as_ref()?;
    let at = |message: String| Some(ConfigProblem::at("admin.token_file", message));
    let text = match read_named_file(path, SMALL_FILE_LIMIT) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => return at(format!("{} is not UTF-8 text", path.display())),
        },
        Err(e) => return at(format!("cannot read {}: {e}", path.display())),
    };
    let token = text.trim();
    if token.is_empty() {
        return at(format!(
            "{} is empty; an empty token would let anyone in",
            path.display()
        ));
    }
    admin.token = Some(token.to_string());
    None
}

/// Reads `identity.api_keys_file`: one key per line, plain or
/// `sha256:<hex>`; blank lines and `#` comments are skipped. Its content is
/// kept so the file watch can tell when it changes.
fn read_key_file(identity: &mut IdentityConfig) -> Vec<ConfigProblem> {
    let Some((path, _)) = identity.api_keys_file.clone() else {
        return Vec::new();
    };
    let at = |message: String| vec![ConfigProblem::at("identity.api_keys_file", message)];
    let bytes = match read_named_file(&path, KEYS_FILE_LIMIT) {
        Ok(b) => b,
        Err(e) => return at(format!("cannot read {}: {e}", path.display())),
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return at(format!("{} is not UTF-8 text", path.display()));
    };
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match ApiKeyEntry::parse(line) {
            Ok(entry) => identity.api_keys.push(entry),
            Err(e) => problems.extend(at(format!("{} line {}: {e}", path.display(), n + 1))),
        }
    }
    identity.api_keys_file = Some((path, Arc::from(bytes)));
    problems
}

/// Reads each route's `auth.basic.users_file` (an htpasswd file), checking
/// every line; its content is kept so the file watch can tell when it changes.
fn read_users_files(config: &mut Config) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    for (i, route) in config.routes.iter_mut().enumerate() {
        let Some(auth) = route.site.auth.as_mut() else {
            continue;
        };
        let at = format!("routes[{i}].auth.basic.users_file");
        let path = auth.users_file.display().to_string();
        let text = match read_named_file(&auth.users_file, SMALL_FILE_LIMIT) {
            Ok(bytes) => String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text")),
            Err(e) => Err(format!("cannot read {path}: {e}")),
        };
        match text
            .and_then(|t| crate::site::auth::Users::parse(&t).map_err(|e| format!("{path}: {e}")))
        {
            Ok(users) if users.is_empty() => problems.push(ConfigProblem::at(
                at,
                format!("{path} names no user: nobody could log in"),
            )),
            Ok(users) => auth.users = Arc::new(users),
            Err(e) => problems.push(ConfigProblem::at(at, e)),
        }
    }
    problems
}

/// Reads every `error_pages` file (the server's, then each route's), each
/// with its YAML path for a problem. Read on every load and reload, so an
/// edited page is picked up by `SIGHUP` or `POST /reload`.
fn read_error_pages(config: &mut Config) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    let sections = std::iter::once(("server".to_string(), &mut config.server.errors)).chain(
        config
            .routes
            .iter_mut()
            .enumerate()
            .map(|(i, r)| (format!("routes[{i}]"), &mut r.errors)),
    );
    for (at, errors) in sections {
        for page in &mut errors.pages {
            let at = format!("{at}.error_pages.{}", page.status.as_u16());
            let file = page.file.display();
            match read_named_file(&page.file, PAGE_FILE_LIMIT).map(String::from_utf8) {
                Ok(Ok(text)) => page.text = Arc::from(text),
                Ok(Err(_)) => {
                    problems.push(ConfigProblem::at(at, format!("{file} is not UTF-8 text")))
                }
                Err(e) => problems.push(ConfigProblem::at(at, format!("cannot read {file}: {e}"))),
            }
        }
    }
    problems
}

/// Reads `identity.pass.secret_file` (see [`PassKeys::parse`]); read on
/// every load and reload, so a rotation is picked up by `SIGHUP` or `POST /reload`.
fn read_pass_file(identity: &mut IdentityConfig) -> Option<ConfigProblem> {
    let pass = identity.pass.as_mut()?;
    let path = &pass.secret_file;
    let at = |message: String| Some(ConfigProblem::at("identity.pass.secret_file", message));
    let text = match read_named_file(path, SMALL_FILE_LIMIT) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => return at(format!("{} is not UTF-8 text", path.display())),
        },
        Err(e) => return at(format!("cannot read {}: {e}", path.display())),
    };
    match PassKeys::parse(&text) {
        Ok(keys) => pass.keys = Arc::new(keys),
        Err(e) => return at(format!("{}: {e}", path.display())),
    }
    None
}

/// Reads `server.tls.acme.shared_key_file` (see [`SharedKey::parse`]);
/// read on every load and reload, like every secret file.
fn read_shared_key_file(config: &mut Config) -> Option<ConfigProblem> {
    let acme = config.server.tls.as_mut()?.acme.as_mut()?;
    let path = acme.shared_key_file.clone()?;
    let at = |message: String| {
        Some(ConfigProblem::at(
            "server.tls.acme.shared_key_file",
            message,
        ))
    };
    let text = match read_named_file(&path, SMALL_FILE_LIMIT) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => return at(format!("{} is not UTF-8 text", path.display())),
        },
        Err(e) => return at(format!("cannot read {}: {e}", path.display())),
    };
    match SharedKey::parse(&text) {
        Ok(key) => acme.shared_key = Some(key),
        Err(e) => return at(format!("{}: {e}", path.display())),
    }
    None
}

/// Reads `identity.geoip`'s databases (see [`crate::geodb::GeoDb::read`]);
/// read on every load and reload, and watched in between.
fn read_geoip_files(identity: &mut IdentityConfig) -> Vec<ConfigProblem> {
    let Some(geoip) = identity.geoip.as_mut() else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for (key, file) in [
        ("asn_db", &mut geoip.asn_db),
        ("country_db", &mut geoip.country_db),
    ] {
        let Some(file) = file else { continue };
        match crate::geodb::GeoDb::read(&file.path, read_named_file) {
            Ok(db) => file.loaded = Arc::new(db),
            Err(e) => problems.push(ConfigProblem::at(format!("identity.geoip.{key}"), e)),
        }
    }
    problems
}

/// Reads `identity.crowdsec.api_key_file` and `push.password_file`: one
/// secret each, surrounding whitespace not part of it.
fn read_crowdsec_files(identity: &mut IdentityConfig) -> Vec<ConfigProblem> {
    let Some(crowdsec) = identity.crowdsec.as_mut() else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let mut secret = |key: &str, path: &Path| -> String {
        let at = format!("identity.crowdsec.{key}");
        let text = match read_named_file(path, SMALL_FILE_LIMIT).map(String::from_utf8) {
            Ok(Ok(text)) => text.trim().to_string(),
            Ok(Err(_)) => {
                problems.push(ConfigProblem::at(
                    at,
                    format!("{} is not UTF-8 text", path.display()),
                ));
                return String::new();
            }
            Err(e) => {
                problems.push(ConfigProblem::at(
                    at,
                    format!("cannot read {}: {e}", path.display()),
                ));
                return String::new();
            }
        };
        if text.is_empty() {
            problems.push(ConfigProblem::at(
                at,
                format!("{} is empty", path.display()),
            ));
        }
        text
    };
    crowdsec.api_key = secret("api_key_file", &crowdsec.api_key_file.clone());
    if let Some(push) = crowdsec.push.as_mut() {
        push.password = secret("push.password_file", &push.password_file.clone());
    }
    problems
}

/// A value that does not fit the schema (or text that is not YAML), in
/// operator terms and located at the key that is wrong: serde's own mark
/// is sometimes the mapping around it.
fn schema_problem(e: &serde_yaml::Error, index: &locate::Index) -> ConfigProblem {
    let message = e.to_string();
    // serde_yaml appends " at line L column C" itself; we print the location up front.
    let message = message
        .rfind(" at line ")
        .map_or(message.as_str(), |i| &message[..i]);
    let (mut problem, anchor) = explain::problem(message, |path| index.has(path));
    problem.location = match (problem.path.as_str(), anchor) {
        ("", _) => None,
        (path, explain::Anchor::Key) => index.find_key(path),
        (path, explain::Anchor::Value) => index.find(path),
    }
    .or_else(|| e.location().map(|l| (l.line(), l.column())));
    problem
}

/// Warns about a FastCGI `root` that does not exist or cannot be listed,
/// and an `index` or `fallback` script missing from it: tollgate checks
/// scripts and serves static files from `root`, so such a config starts
/// and then answers every request with a 404. Only metadata is read (and
/// a directory listed), never a file's content, so a FIFO cannot hang it.
fn warn_missing_fastcgi_files(config: &mut Config) {
    let mut warnings = Vec::new();
    for upstream in &config.upstreams {
        let Some(f) = &upstream.fastcgi else {
            continue;
        };
        let at = |field: &str| format!("upstreams.{}.{field}", upstream.name);
        let root = f.root.display();
        let fix = "every request to this upstream would be a 404; fix the path (php-fpm must see the same directory)";
        match std::fs::metadata(&f.root) {
            Err(e) => {
                warnings.push(ConfigProblem::at(at("root"), format!("{root}: {e}: {fix}")));
                continue;
            }
            Ok(m) if !m.is_dir() => {
                warnings.push(ConfigProblem::at(
                    at("root"),
                    format!("{root} is not a directory: {fix}"),
                ));
                continue;
            }
            Ok(_) => {}
        }
        if let Err(e) = std::fs::read_dir(&f.root) {
            warnings.push(ConfigProblem::at(
                at("root"),
                format!("{root} cannot be read: {e}: {fix}"),
            ));
            continue;
        }
        let scripts = [
            ("index", Some(f.index.as_str())),
            ("fallback", f.fallback.as_deref()),
        ];
        for (field, script) in scripts {
            let Some(script) = script else { continue };
            let file = f.root.join(script.trim_start_matches('/'));
            let readable = std::fs::metadata(&file).is_ok_and(|m| m.is_file())
                && std::fs::File::open(&file).is_ok();
            if !readable {
                warnings.push(ConfigProblem::at(
                    at(field),
                    format!(
                        "{} is not a readable file, so {} would be a 404; create it or set `{field}` to a script under {root}",
                        file.display(),
                        if field == "index" { "a request for a directory (`/`)" } else { "every path that names no file" },
                    ),
                ));
            }
        }
    }
    config.warnings.extend(warnings);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(path: &Path, limit: u64) -> String {
        read_named_file(path, limit).unwrap_err().to_string()
    }

    #[test]
    fn only_a_regular_file_within_its_bound_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(refusal(&fifo, 10).contains("a FIFO"));
        assert!(refusal(Path::new("/dev/zero"), 10).contains("a device"));
        assert!(refusal(dir.path(), 10).contains("a directory"));
        let file = dir.path().join("f");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_named_file(&file, 10).unwrap(), b"0123456789");
        assert_eq!(
            refusal(&file, 9),
            "it is larger than 9 bytes, the most read for it"
        );
        assert!(refusal(&dir.path().join("none"), 10).contains("No such file"));
    }
}
