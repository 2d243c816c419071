//! Every Location tollgate writes stays on the site: the directory redirect of a FastCGI root, built from the path it resolved, for every spelling of `//`.

mod common;

use common::app::{app, from, get};

/// An app whose FastCGI root holds the directory `docs/` (no php-fpm is
/// needed: a directory is redirected before any script runs).
fn site(separators: &str) -> (tempfile::TempDir, tollgate::App) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("docs")).unwrap();
    let yaml = format!(
        "server: {{ encoded_separators: {separators} }}\n\
         upstreams:\n  php: {{ url: \"fastcgi://127.0.0.1:9\", root: {} }}\n\
         routes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: php }}\n",
        dir.path().display()
    );
    (dir, app(&yaml))
}

async fn location(app: &tollgate::App, path: &str) -> (u16, Option<String>) {
    let resp = app.handle(get(path, &[]), from("203.0.113.9:4000")).await;
    let location = resp
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string());
    (resp.status().as_u16(), location)
}

#[tokio::test(start_paused = true)]
async fn the_directory_redirect_is_built_from_the_resolved_path_and_never_leaves_the_site() {
    let (_dir, app) = site("decode");
    for path in [
        "//evil.example/../docs",
        "/%2Fevil.example/../docs",
        "/%2F%2Fevil.example/..%2Fdocs",
        "///docs",
    ] {
        assert_eq!(
            location(&app, path).await,
            (301, Some("/docs/".to_string())),
            "{path}"
        );
    }
    assert_eq!(
        location(&app, "/docs?a=1").await,
        (301, Some("/docs/?a=1".to_string())),
        "the query is kept"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backslash_spelling_is_refused_or_redirected_on_the_site() {
    let (dir, app) = site("decode");
    // A directory whose name starts with a backslash (a plain character here).
    let name: std::path::PathBuf = ["\\evil.example"].iter().collect();
    std::fs::create_dir_all(dir.path().join(name)).unwrap();
    // Decoded, `\evil.example` is a plain directory name: its redirect must
    // not start with `/\`, which a browser reads as another host.
    let (status, loc) = location(&app, "/%5Cevil.example").await;
    assert_eq!((status, loc.as_deref()), (301, Some("/%5Cevil.example/")));
    let (_dir, app) = site("reject");
    for path in [
        "//evil.example/../docs",
        "/%2Fevil.example/../docs",
        "/%5Cevil.example/../docs",
    ] {
        let (status, loc) = location(&app, path).await;
        assert!(
            (status == 301 && loc.as_deref() == Some("/docs/")) || status == 400,
            "{path}: {status} {loc:?}"
        );
    }
}
