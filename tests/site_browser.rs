//! A small PHP site (HTML from php-fpm; CSS, JS, an image and a video served by tollgate) in a real headless Chromium: compressed text, 304s on reload, the video's Range, and the same picture compressed or not.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::php_fpm::PhpFpm;
use common::{browser, Proxy};

/// The page: PHP writes it, so the HTML itself comes from php-fpm.
const INDEX: &str = r#"<?php header('Content-Type: text/html; charset=utf-8'); ?>
<!doctype html>
<html><head><title>first load</title><link rel="stylesheet" href="/style.css"></head>
<body>
<h1 id="title">A site behind tollgate</h1>
<?php for ($i = 0; $i < 40; $i++) echo "<p class=\"row\">Row $i of a page long enough to be worth compressing.</p>\n"; ?>
<img id="logo" src="/logo.png" width="40" height="40">
<video id="clip" src="/clip.webm" preload="auto" width="40" height="40"></video>
<pre id="result"></pre>
<script src="/app.js"></script>
</body></html>
"#;

/// First load: reloads the page once its load event fired (a browser's
/// reload). Second load: as soon as the image is decoded, writes what it
/// sees for `--dump-dom` (not at the load event: a video that cannot play
/// may hold that back for as long as the browser keeps trying).
const APP_JS: &str = r#"
// Padding so the script is worth compressing: the same comment, repeated.
PADDING
function report() {
  var logo = document.getElementById('logo');
  if (!logo.complete) { setTimeout(report, 20); return; }
  var style = getComputedStyle(document.getElementById('title'));
  document.title = 'reloaded';
  document.getElementById('result').textContent =
    'reloaded ' + 'color=' + style.color + ' logo=' + logo.naturalWidth + 'x' + logo.naturalHeight;
}
if (sessionStorage.getItem('loaded')) {
  report();
} else {
  window.addEventListener('load', function () {
    sessionStorage.setItem('loaded', '1');
    setTimeout(function () { location.reload(); }, 100);
  });
}
"#;

fn css() -> String {
    let mut s = String::from("h1 { color: rgb(200, 30, 40); font-family: sans-serif; }\n");
    for i in 0..60 {
        s.push_str(&format!(
            ".row:nth-child({i}) {{ margin: 0; padding: 1px; }}\n"
        ));
    }
    s
}

fn js() -> String {
    APP_JS.replace(
        "PADDING",
        &"// tollgate compresses scripts like this one for the browser.\n".repeat(30),
    )
}

/// A valid 2×2 RGB PNG (so the browser decodes it: `naturalWidth` is 2).
fn png() -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(data);
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc.sum().to_be_bytes());
    }
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&2u32.to_be_bytes());
    ihdr.extend_from_slice(&2u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    let raw = [0u8, 255, 0, 0, 0, 255, 0, 0u8, 0, 0, 255, 255, 255, 255];
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw).unwrap();
    let idat = z.finish().unwrap();
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("index.php"), INDEX).unwrap();
    std::fs::write(root.join("style.css"), css()).unwrap();
    std::fs::write(root.join("app.js"), js()).unwrap();
    std::fs::write(root.join("logo.png"), png()).unwrap();
    // Not a playable video: what matters here is how the browser fetches
    // it (its media loader always asks for a byte range first).
    std::fs::write(root.join("clip.webm"), vec![0x1a; 64 * 1024]).unwrap();
    root
}

fn yaml(fpm: &PhpFpm, root: &Path, compression: bool) -> String {
    format!(
        "server: {{ compression: {compression} }}\nlog: {{ format: json }}\nupstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.socket.display(),
        root.display()
    )
}

/// The access records for `path`, in order.
fn records_for<'a>(records: &'a [serde_json::Value], path: &str) -> Vec<&'a serde_json::Value> {
    records.iter().filter(|r| r["path"] == path).collect()
}

fn statuses(records: &[&serde_json::Value]) -> Vec<u64> {
    records
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_page_gets_compressed_text_304s_and_a_ranged_video_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let proxy = Proxy::start(&yaml(&fpm, &root, true)).await;

    let url = proxy.url("/");
    let dom = tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], 8_000))
        .await
        .unwrap();
    assert!(
        dom.contains("reloaded color=rgb(200, 30, 40) logo=2x2"),
        "the page rendered with its CSS, JS and image after a reload:\n{dom}"
    );

    let lines = proxy.access.lines();
    let records: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let all = || {
        lines
            .iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    };

    let pages = records_for(&records, "/");
    assert_eq!(statuses(&pages), [200, 200], "two loads:\n{}", all());
    for p in &pages {
        let sent = p["bytes_out"].as_u64().unwrap();
        assert!(sent < 1500, "the HTML went out compressed ({sent} bytes)");
    }
    for (path, size) in [("/style.css", css().len()), ("/app.js", js().len())] {
        let r = records_for(&records, path);
        assert_eq!(
            statuses(&r),
            [200, 304],
            "{path}: loaded, then revalidated:\n{}",
            all()
        );
        let sent = r[0]["bytes_out"].as_u64().unwrap();
        assert!(
            sent * 3 < size as u64,
            "{path} went out compressed: {sent} of {size} bytes"
        );
    }
    // Kept an hour by default: revalidated or not asked for at all.
    let logo = statuses(&records_for(&records, "/logo.png"));
    assert!(
        logo.first() == Some(&200) && logo[1..].iter().all(|s| *s == 304),
        "/logo.png: {logo:?}\n{}",
        all()
    );
    let video = statuses(&records_for(&records, "/clip.webm"));
    assert!(
        video.contains(&206),
        "the video was asked for by range: {video:?}\n{}",
        all()
    );
    assert!(!video.contains(&200), "never the whole video: {video:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_looks_the_same_compressed_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let compressing = Proxy::start(&yaml(&fpm, &root, true)).await;
    let plain = Proxy::start(&yaml(&fpm, &root, false)).await;
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/site");

    let shot = |proxy: &Proxy, name: &str| {
        let url = proxy.url("/");
        let path = shots.join(name);
        async move {
            let p = path.clone();
            tokio::task::spawn_blocking(move || browser::screenshot(&url, &p, (600, 900), 5_000))
                .await
                .unwrap();
            std::fs::read(path).unwrap()
        }
    };
    // On a loaded machine Chromium has once drawn a page whose last rows had
    // not arrived yet (34 of 40 rows, no logo): each pair gets three tries.
    // A page that compression broke differs in every one.
    let mut same = false;
    for _ in 0..3 {
        let a = shot(&compressing, "compressed.png").await;
        let b = shot(&plain, "plain.png").await;
        if a == b {
            same = true;
            break;
        }
    }
    let sent = compressing
        .metric("tollgate_compressed_responses_total{encoding=\"br\"}")
        .await;
    assert!(sent.is_some_and(|n| n >= 3.0), "brotli responses: {sent:?}");
    let none = plain
        .metric("tollgate_compressed_responses_total{encoding=\"br\"}")
        .await;
    assert!(none.is_none_or(|n| n == 0.0), "no compression: {none:?}");
    assert!(same, "the screenshots differ: see {}", shots.display());
}
