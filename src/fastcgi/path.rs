//! Which file a request names under `root`: a PHP script (and its PATH_INFO), a static file, or nothing.
//!
//! The rule that closes the `cgi.fix_pathinfo` hole: the script is the first
//! path segment ending in `.php`, and tollgate checks that exactly that file
//! exists under `root` (the nginx `try_files $fastcgi_script_name =404`)
//! before php-fpm hears of it. So `/uploads/evil.jpg/x.php` names the
//! script `/uploads/evil.jpg/x.php`, which does not exist: 404, and php-fpm
//! never gets the chance to fall back to running `evil.jpg`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use percent_encoding::percent_decode_str;

/// A request path split at its script.
#[derive(Debug, PartialEq, Eq)]
pub enum Split {
    /// `/a/b.php/c/d`: SCRIPT_NAME `/a/b.php`, PATH_INFO `/c/d`.
    Script { script: String, path_info: String },
    /// No `.php` segment: a file or a directory under root.
    Other { path: String, directory: bool },
}

/// Decodes and splits a request path; None if it cannot name a file
/// (not UTF-8, a NUL, or a hidden segment before the script).
pub fn split(raw_path: &str) -> Option<Split> {
    let decoded = percent_decode_str(raw_path).decode_utf8().ok()?;
    if decoded.contains('\0') {
        return None;
    }
    let directory = decoded.ends_with('/');
    let segments = crate::router::segments(&decoded);
    let script_end = segments.iter().position(|s| s.ends_with(".php"));
    let named = script_end.map_or(&segments[..], |i| &segments[..=i]);
    // Dot files and directories (.env, .git, .user.ini, .htaccess) are
    // never a script's path nor a file to hand out.
    if named.iter().any(|s| s.starts_with('.')) {
        return None;
    }
    let join = |segs: &[&str]| {
        let mut out = String::with_capacity(decoded.len());
        for s in segs {
            out.push('/');
            out.push_str(s);
        }
        out
    };
    Some(match script_end {
        Some(i) => {
            let mut path_info = join(&segments[i + 1..]);
            if directory && i + 1 < segments.len() {
                path_info.push('/');
            }
            Split::Script {
                script: join(&segments[..=i]),
                path_info,
            }
        }
        None => Split::Other {
            path: join(&segments),
            directory,
        },
    })
}

/// Static files tollgate hands out itself, by extension, with their type.
/// Anything else that is not a script is refused: a `.inc`, `.sql`, `.bak`
/// or `.log` next to the PHP code is never served, and a `.php` never as text.
const STATIC_TYPES: &[(&str, &str)] = &[
    ("css", "text/css; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
    ("map", "application/json"),
    ("json", "application/json"),
    ("html", "text/html; charset=utf-8"),
    ("htm", "text/html; charset=utf-8"),
    ("txt", "text/plain; charset=utf-8"),
    ("xml", "application/xml"),
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("avif", "image/avif"),
    ("svg", "image/svg+xml"),
    ("ico", "image/x-icon"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
    ("ttf", "font/ttf"),
    ("otf", "font/otf"),
    ("eot", "application/vnd.ms-fontobject"),
    ("pdf", "application/pdf"),
    ("mp4", "video/mp4"),
    ("webm", "video/webm"),
    ("mp3", "audio/mpeg"),
    ("ogg", "audio/ogg"),
];

pub fn static_type(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    STATIC_TYPES
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|(_, t)| *t)
}

/// What a request resolves to on disk (blocking: run it off the runtime).
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Script {
        script: String,
        path_info: String,
    },
    Static(StaticFile),
    /// A directory named without its trailing slash: nginx's and Apache's
    /// `301` to the slash form comes before any index file is tried, so
    /// relative links in the index page resolve inside the directory. The
    /// path as resolved (decoded, dot segments walked): the redirect's target.
    Directory(String),
    NotFound,
}

/// A file tollgate serves itself, with what its validators are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticFile {
    pub file: PathBuf,
    pub content_type: &'static str,
    pub len: u64,
    pub modified: SystemTime,
}

/// `relative` (starting with `/`) under `root`, if it exists and, with every
/// symlink followed, stays inside root.
fn inside(root: &Path, relative: &str) -> Option<(PathBuf, std::fs::Metadata)> {
    let root = root.canonicalize().ok()?;
    let file = root
        .join(relative.trim_start_matches('/'))
        .canonicalize()
        .ok()?;
    if !file.starts_with(&root) {
        return None;
    }
    let meta = std::fs::metadata(&file).ok()?;
    Some((file, meta))
}

/// Checks the split against the files under `root`; `index` names a
/// directory's default file; `fallback` the script for a path that names
/// no file (a missing `.php` stays a 404, as with nginx's `try_files`).
pub fn resolve(root: &Path, index: &str, fallback: Option<&str>, split: Split) -> Target {
    let other = matches!(split, Split::Other { .. });
    match (resolve_named(root, index, split), fallback) {
        (Target::NotFound, Some(script)) if other => {
            script_file(root, script.to_string(), String::new())
        }
        (target, _) => target,
    }
}

fn resolve_named(root: &Path, index: &str, split: Split) -> Target {
    let (script, path_info) = match split {
        Split::Script { script, path_info } => (script, path_info),
        Split::Other { path, directory } => {
            let Some((_, meta)) = inside(root, &path) else {
                return Target::NotFound;
            };
            if meta.is_dir() && !directory {
                return Target::Directory(path);
            }
            if meta.is_dir() || directory {
                let script = format!("{}/{index}", path.trim_end_matches('/'));
                if index.ends_with(".php") {
                    (script, String::new())
                } else {
                    return static_file(root, &script);
                }
            } else {
                return static_file(root, &path);
            }
        }
    };
    script_file(root, script, path_info)
}

fn script_file(root: &Path, script: String, path_info: String) -> Target {
    match inside(root, &script) {
        // Followed symlinks included: the file that runs is a .php file.
        Some((file, meta)) if meta.is_file() && file.extension().is_some_and(|e| e == "php") => {
            Target::Script { script, path_info }
        }
        _ => Target::NotFound,
    }
}

fn static_file(root: &Path, relative: &str) -> Target {
    match inside(root, relative) {
        Some((file, meta)) if meta.is_file() => match static_type(&file) {
            // The type of the file served (a symlink's target), not of its name.
            Some(content_type) => Target::Static(StaticFile {
                len: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                file,
                content_type,
            }),
            None => Target::NotFound,
        },
        _ => Target::NotFound,
    }
}

/// The precompressed sibling of `file` (`app.js.br`, `app.js.gz`: nginx's
/// `gzip_static`) in the first of `codings` that has one: a regular file
/// inside `root`, no older than `file` (a stale `.gz` left by an old build
/// is never served for a newer `app.js`). Blocking: run it off the runtime.
pub fn precompressed(
    root: &Path,
    file: &StaticFile,
    codings: impl Iterator<Item = crate::compression::Coding>,
) -> Option<(crate::compression::Coding, StaticFile)> {
    let root = root.canonicalize().ok()?;
    for coding in codings {
        let mut name = file.file.clone().into_os_string();
        name.push(coding.suffix());
        let Ok(sibling) = Path::new(&name).canonicalize() else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(&sibling) else {
            continue;
        };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if sibling.starts_with(&root) && meta.is_file() && modified >= file.modified {
            return Some((
                coding,
                StaticFile {
                    file: sibling,
                    content_type: file.content_type,
                    len: meta.len(),
                    modified,
                },
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(s: &str, p: &str) -> Option<Split> {
        Some(Split::Script {
            script: s.into(),
            path_info: p.into(),
        })
    }

    #[test]
    fn the_script_is_the_first_segment_ending_in_php() {
        assert_eq!(split("/index.php/a/b"), script("/index.php", "/a/b"));
        assert_eq!(split("/index.php"), script("/index.php", ""));
        assert_eq!(split("/a/b.php/c.php/d/"), script("/a/b.php", "/c.php/d/"));
        assert_eq!(
            split("/uploads/evil.jpg/x.php"),
            script("/uploads/evil.jpg/x.php", "")
        );
        assert_eq!(split("/a%2Fb.php"), script("/a/b.php", ""));
    }

    #[test]
    fn dot_segments_are_resolved_and_never_climb_above_root() {
        assert_eq!(split("/../../etc/x.php"), script("/etc/x.php", ""));
        assert_eq!(split("/a/./b/../c.php"), script("/a/c.php", ""));
        assert_eq!(
            split("/%2e%2e/secret.txt"),
            Some(Split::Other {
                path: "/secret.txt".into(),
                directory: false
            })
        );
    }

    #[test]
    fn a_backslash_is_part_of_a_file_name_as_the_router_reads_it() {
        // With `encoded_separators: decode` these reach here; the router
        // routed them as plain characters too, so both name the same file.
        assert_eq!(
            split("/x%5C..%5Cwp-login.php"),
            script("/x\\..\\wp-login.php", "")
        );
        assert_eq!(
            split("/wp-login.php%5Cx"),
            Some(Split::Other {
                path: "/wp-login.php\\x".into(),
                directory: false
            })
        );
    }

    #[test]
    fn hidden_files_nul_bytes_and_bad_utf8_name_nothing() {
        assert_eq!(split("/.env"), None);
        assert_eq!(split("/.git/config"), None);
        assert_eq!(split("/a/.hidden.php"), None);
        assert_eq!(split("/x.php%00.jpg"), None);
        assert_eq!(split("/%ff.php"), None);
        // After the script it is only PATH_INFO, a string the script reads.
        assert_eq!(split("/index.php/.well"), script("/index.php", "/.well"));
    }

    #[test]
    fn only_listed_types_are_static_and_php_never_is() {
        assert_eq!(static_type(Path::new("/a/logo.PNG")), Some("image/png"));
        assert_eq!(static_type(Path::new("/a/x.php")), None);
        assert_eq!(static_type(Path::new("/a/config.inc")), None);
        assert_eq!(static_type(Path::new("/a/README")), None);
    }

    /// A docroot with a script, an upload, a stylesheet and three symlinks
    /// (out of root, `.php` to a `.jpg`, `.txt` to PHP source).
    fn site() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        std::fs::create_dir_all(root.join("uploads")).unwrap();
        std::fs::write(root.join("index.php"), "<?php").unwrap();
        std::fs::write(root.join("uploads/evil.jpg"), "<?php evil();").unwrap();
        std::fs::write(root.join("style.css"), "a{}").unwrap();
        std::fs::write(dir.path().join("outside.css"), "secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.css"), root.join("link.css")).unwrap();
        std::os::unix::fs::symlink(root.join("uploads/evil.jpg"), root.join("evil.php")).unwrap();
        std::os::unix::fs::symlink(root.join("index.php"), root.join("source.txt")).unwrap();
        (dir, root)
    }

    #[test]
    fn resolving_checks_the_script_and_keeps_files_inside_root() {
        let (_dir, root) = site();
        let r = |p: &str| resolve(&root, "index.php", None, split(p).unwrap());
        assert_eq!(
            r("/index.php/a"),
            Target::Script {
                script: "/index.php".into(),
                path_info: "/a".into()
            }
        );
        assert_eq!(
            r("/"),
            Target::Script {
                script: "/index.php".into(),
                path_info: "".into()
            }
        );
        assert_eq!(r("/uploads/evil.jpg/x.php"), Target::NotFound);
        assert_eq!(
            r("/evil.php"),
            Target::NotFound,
            "a .php symlink to a .jpg never runs"
        );
        assert_eq!(
            r("/source.txt"),
            Target::NotFound,
            "PHP source is never served"
        );
        assert_eq!(
            r("/link.css"),
            Target::NotFound,
            "a symlink out of root is refused"
        );
        assert_eq!(r("/missing.php"), Target::NotFound);
        assert!(matches!(
            r("/uploads/evil.jpg"),
            Target::Static(StaticFile {
                content_type: "image/jpeg",
                len: 13,
                ..
            })
        ));
        assert!(matches!(r("/style.css"), Target::Static(_)));
        assert_eq!(
            r("/uploads"),
            Target::Directory("/uploads".into()),
            "a directory without its slash"
        );
        assert_eq!(r("/uploads/"), Target::NotFound, "no index.php in uploads/");
    }

    #[test]
    fn a_front_controller_answers_what_no_file_does_and_nothing_else() {
        let (_dir, root) = site();
        let front = |p: &str| resolve(&root, "index.php", Some("/index.php"), split(p).unwrap());
        let index = Target::Script {
            script: "/index.php".into(),
            path_info: "".into(),
        };
        assert_eq!(front("/2024/hello-world/"), index);
        assert_eq!(front("/uploads/"), index);
        assert_eq!(
            front("/missing.php"),
            Target::NotFound,
            "a missing script stays missing"
        );
        assert_eq!(front("/uploads/evil.jpg/x.php"), Target::NotFound);
        assert!(matches!(front("/style.css"), Target::Static(_)));
        assert_eq!(
            front("/uploads"),
            Target::Directory("/uploads".into()),
            "redirected before the front controller"
        );
    }
}
