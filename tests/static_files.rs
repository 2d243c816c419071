//! Static files under a FastCGI root, served as nginx serves them: validators, 304, ranges (206, 416, If-Range), HEAD, Cache-Control, precompressed siblings, the directory redirect.
//!
//! Static files never reach php-fpm, so the upstream here points at a port
//! nobody listens on: an answer that needed PHP would be a 502.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{get_raw, Proxy, RawAnswer};

/// A page's worth of CSS: long enough to be compressed.
fn css() -> String {
    (0..200)
        .map(|i| format!(".c{i} {{ color: #{:06x}; margin: {i}px; }}\n", i * 977))
        .collect()
}

/// 1000 bytes of a "video": each byte its offset mod 251, so a range's bytes are checkable.
fn video() -> Vec<u8> {
    (0..1000u32).map(|i| (i % 251) as u8).collect()
}

fn site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(root.join("admin")).unwrap();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("admin/index.html"), "<h1>admin</h1>").unwrap();
    std::fs::write(root.join("docs/index.html"), "<h1>docs</h1>").unwrap();
    std::fs::write(root.join("site.css"), css()).unwrap();
    std::fs::write(root.join("clip.webm"), video()).unwrap();
    std::fs::write(root.join("logo.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    root
}

async fn start(dir: &Path, extra: &str) -> Proxy {
    let root = site(dir);
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\"{extra} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        common::free_addr(),
        root.display()
    );
    Proxy::start(&yaml).await
}

async fn get(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> RawAnswer {
    get_raw(&proxy.url(path), headers).await
}

#[tokio::test]
async fn a_static_file_has_a_strong_etag_last_modified_ranges_and_cache_control_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let r = get(&proxy, "/site.css", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, css().as_bytes());
    let etag = r.header("etag").expect("an ETag");
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong: {etag}"
    );
    let modified = std::fs::metadata(dir.path().join("www/site.css"))
        .unwrap()
        .modified()
        .unwrap();
    let last_modified = httpdate::parse_http_date(r.header("last-modified").unwrap()).unwrap();
    let skew = modified
        .duration_since(last_modified)
        .unwrap_or_else(|e| e.duration());
    assert!(
        skew < Duration::from_secs(1),
        "Last-Modified is the file's mtime"
    );
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(
        r.header("cache-control"),
        Some("no-cache"),
        "text revalidates"
    );
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));

    let png = get(&proxy, "/logo.png", &[]).await;
    assert_eq!(png.header("cache-control"), Some("max-age=3600"));

    // Rewritten: a new tag.
    std::fs::write(dir.path().join("www/site.css"), css() + "/* v2 */").unwrap();
    let again = get(&proxy, "/site.css", &[]).await;
    assert_ne!(again.header("etag"), Some(etag));
}

#[tokio::test]
async fn cache_control_in_the_config_replaces_the_default_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), ", cache_control: \"public, max-age=86400\"").await;
    for path in ["/site.css", "/logo.png"] {
        let r = get(&proxy, path, &[]).await;
        assert_eq!(
            r.header("cache-control"),
            Some("public, max-age=86400"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_matching_validator_gets_304_without_a_body() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let first = get(&proxy, "/site.css", &[]).await;
    let etag = first.header("etag").unwrap().to_string();
    let lm = first.header("last-modified").unwrap().to_string();

    let r = get(&proxy, "/site.css", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(r.header("cache-control"), Some("no-cache"));

    // What a browser holds after a compressed answer: the weak form.
    let weak = format!("W/{etag}");
    let r = get(&proxy, "/site.css", &[("if-none-match", &weak)]).await;
    assert_eq!(r.status, 304, "If-None-Match compares weakly");

    let r = get(&proxy, "/site.css", &[("if-modified-since", &lm)]).await;
    assert_eq!(r.status, 304);

    let r = get(
        &proxy,
        "/site.css",
        &[("if-none-match", "\"old\""), ("if-modified-since", &lm)],
    )
    .await;
    assert_eq!(
        r.status, 200,
        "a tag that does not match wins over the date"
    );
    let r = get(
        &proxy,
        "/site.css",
        &[("if-modified-since", "Thu, 01 Jan 1970 00:00:01 GMT")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, css().as_bytes());

    let r = get(&proxy, "/site.css", &[("if-match", "\"old\"")]).await;
    assert_eq!(r.status, 412);
}

#[tokio::test]
async fn one_range_gets_206_with_exactly_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let v = video();
    for (range, first, last) in [
        ("bytes=0-", 0, 999),
        ("bytes=100-199", 100, 199),
        ("bytes=900-5000", 900, 999),
        ("bytes=-10", 990, 999),
    ] {
        let r = get(&proxy, "/clip.webm", &[("range", range)]).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {first}-{last}/1000").as_str()),
            "{range}"
        );
        assert_eq!(
            r.header("content-length"),
            Some((last - first + 1).to_string().as_str())
        );
        assert_eq!(r.body, v[first..=last], "{range}");
        assert_eq!(r.header("content-type"), Some("video/webm"));
    }
    // Several ranges: the whole file (allowed, and what many servers do).
    let r = get(&proxy, "/clip.webm", &[("range", "bytes=0-1,5-6")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, v);
}

#[tokio::test]
async fn a_range_past_the_end_gets_416_with_the_length() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let r = get(&proxy, "/clip.webm", &[("range", "bytes=1000-")]).await;
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */1000"));
    assert!(r.body.is_empty());
}

#[tokio::test]
async fn if_range_with_a_stale_etag_gets_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let etag = get(&proxy, "/clip.webm", &[])
        .await
        .header("etag")
        .unwrap()
        .to_string();
    let r = get(
        &proxy,
        "/clip.webm",
        &[("range", "bytes=10-19"), ("if-range", &etag)],
    )
    .await;
    assert_eq!(r.status, 206, "the client's copy is current");
    assert_eq!(r.body, video()[10..20]);

    let r = get(
        &proxy,
        "/clip.webm",
        &[("range", "bytes=10-19"), ("if-range", "\"stale\"")],
    )
    .await;
    assert_eq!(r.status, 200, "a stale copy gets the whole new file");
    assert_eq!(r.body, video());
    let weak = format!("W/{etag}");
    let r = get(
        &proxy,
        "/clip.webm",
        &[("range", "bytes=10-19"), ("if-range", &weak)],
    )
    .await;
    assert_eq!(r.status, 200, "a weak tag never validates a range");
}

#[tokio::test]
async fn head_gets_the_headers_of_get_and_no_body() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let request = format!(
        "HEAD /clip.webm HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        proxy.addr
    );
    let raw = common::raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
    let reply = common::Reply::parse(&raw).expect("an answer");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-length"), Some("1000"));
    assert_eq!(reply.header("accept-ranges"), Some("bytes"));
    assert!(reply.header("etag").is_some());
    assert_eq!(reply.body, "", "nothing after the head");
}

#[tokio::test]
async fn a_directory_without_its_slash_is_redirected_with_the_query_kept() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), ", index: index.html").await;
    let r = get(&proxy, "/admin?tab=users&x=%20y", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/admin/?tab=users&x=%20y"));
    let r = get(&proxy, "/docs", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/docs/"));
    // With the slash, the index is served.
    let r = get(&proxy, "/docs/", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"<h1>docs</h1>");
    // A missing directory is no redirect.
    let r = get(&proxy, "/nothing", &[]).await;
    assert_eq!(r.status, 404);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::BrotliCompress(
        &mut &data[..],
        &mut out,
        &brotli::enc::BrotliEncoderParams::default(),
    )
    .unwrap();
    out
}

#[tokio::test]
async fn a_fresh_precompressed_sibling_is_sent_to_a_client_that_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let www = dir.path().join("www");
    let (gz, br) = (gzip(css().as_bytes()), brotli(css().as_bytes()));
    std::fs::write(www.join("site.css.gz"), &gz).unwrap();
    std::fs::write(www.join("site.css.br"), &br).unwrap();

    let r = get(&proxy, "/site.css", &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(r.header("content-encoding"), Some("br"));
    assert_eq!(r.body, br, "the .br file's bytes");
    assert_eq!(
        r.header("content-length"),
        Some(br.len().to_string().as_str())
    );
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    let br_tag = r.header("etag").unwrap().to_string();

    let r = get(&proxy, "/site.css", &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.body, gz, "the .gz file's bytes");
    assert_ne!(
        r.header("etag"),
        Some(br_tag.as_str()),
        "each file its own tag"
    );
    let r = get(
        &proxy,
        "/site.css",
        &[("accept-encoding", "br"), ("range", "bytes=0-9")],
    )
    .await;
    assert_eq!(r.status, 206, "a sibling's bytes can be ranged too");
    assert_eq!(r.body, br[..10]);

    let r = get(&proxy, "/site.css", &[]).await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, css().as_bytes());

    // A sibling older than the file (an old build's) is never sent: the
    // file is compressed on the fly instead.
    std::fs::write(www.join("site.css"), css() + "/* newer */").unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    for f in ["site.css.gz", "site.css.br"] {
        std::fs::File::options()
            .write(true)
            .open(www.join(f))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let r = get(&proxy, "/site.css", &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let mut out = String::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(out, css() + "/* newer */");
    assert!(
        r.header("etag").unwrap().starts_with("W/"),
        "compressed on the fly"
    );
}

#[tokio::test]
async fn a_route_with_compression_off_sends_the_file_itself_even_beside_a_sibling() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    std::fs::write(root.join("site.css.gz"), gzip(css().as_bytes())).unwrap();
    std::fs::write(root.join("site.css.br"), brotli(css().as_bytes())).unwrap();
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: plain, match: {{ path_prefix: /site.css }}, upstream: php, compression: false }}\n",
        common::free_addr(),
        root.display()
    );
    let proxy = Proxy::start(&yaml).await;
    let r = get(&proxy, "/site.css", &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-encoding"),
        None,
        "no sibling, no on-the-fly coding"
    );
    assert_eq!(r.body, css().as_bytes());
    assert_eq!(
        r.header("vary"),
        None,
        "the answer does not vary by Accept-Encoding"
    );
    assert!(
        !r.header("etag").unwrap().starts_with("W/"),
        "the file's own strong tag"
    );
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
}

#[tokio::test]
async fn a_static_text_file_is_compressed_on_the_fly_and_revalidates_with_its_weak_tag() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start(dir.path(), "").await;
    let r = get(&proxy, "/site.css", &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(
        r.header("accept-ranges"),
        None,
        "no ranges of compressed bytes"
    );
    let weak = r.header("etag").unwrap().to_string();
    assert!(weak.starts_with("W/\""), "{weak}");
    let r = get(
        &proxy,
        "/site.css",
        &[("accept-encoding", "gzip"), ("if-none-match", &weak)],
    )
    .await;
    assert_eq!(r.status, 304);

    // Never an image.
    let r = get(&proxy, "/logo.png", &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(r.header("content-encoding"), None);
    let r = get(
        &proxy,
        "/clip.webm",
        &[("accept-encoding", "gzip"), ("range", "bytes=0-")],
    )
    .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-encoding"), None);
}
