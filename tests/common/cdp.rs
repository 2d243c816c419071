//! A real headless Chromium driven over the DevTools protocol, for pages whose work happens after load (Web Workers, form posts, redirects).
//!
//! `--dump-dom` with a virtual-time budget suits a page that renders and
//! settles; a page that computes in a worker and then navigates needs real
//! time and someone watching: this opens one tab, navigates it, and reads
//! its text and cookies until a condition holds.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub struct Browser {
    child: Child,
    ws: WebSocketStream<TcpStream>,
    next_id: u64,
    /// The tab's session (flattened target attachment).
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium with `extra` flags and one blank tab.
    pub async fn launch(extra: &[&str]) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(super::browser::chromium())
            .args(super::browser::HEADLESS)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Chromium names its DevTools address on stderr; the rest is drained so it never blocks.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("ws://") {
                    let _ = tx.send(line[at..].trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("chromium printed its DevTools address");
        let host = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let stream = TcpStream::connect(&host).await.expect("DevTools port");
        let (ws, _) = tokio_tungstenite::client_async(url.as_str(), stream)
            .await
            .expect("DevTools handshake");
        let mut b = Browser {
            child,
            ws,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = b
            .call(
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .await;
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b
    }

    /// One command to the browser (`session` empty) or the tab; its result.
    async fn send(&mut self, session: Option<String>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .expect("DevTools send");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = tokio::time::timeout(left, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer within 60 s"))
                .expect("DevTools open")
                .expect("DevTools frame");
            let Ok(text) = frame.to_text() else { continue };
            let Ok(v) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(None, method, params).await
    }

    pub async fn tab(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(Some(s), method, params).await
    }

    pub async fn navigate(&mut self, url: &str) {
        self.tab("Page.navigate", json!({"url": url})).await;
    }

    /// The value of a JavaScript expression in the tab (`null` while it navigates).
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .tab(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    /// The tab's text once it contains `needle`, polling up to `limit`.
    pub async fn text_with(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut text = String::new();
        while Instant::now() < deadline {
            let v = self
                .eval("document.body ? document.body.innerText : ''")
                .await;
            text = v.as_str().unwrap_or_default().to_string();
            if text.contains(needle) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the page never showed {needle:?}; it shows:\n{text}");
    }

    /// Every cookie the browser holds.
    pub async fn cookies(&mut self) -> Vec<Value> {
        let r = self.call("Storage.getCookies", json!({})).await;
        r["cookies"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
