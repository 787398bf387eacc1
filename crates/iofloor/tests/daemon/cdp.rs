//! Just enough of the Chrome DevTools Protocol to drive headless Chromium in
//! a test: open a page, evaluate JavaScript, take a screenshot. Hand-written
//! over `tungstenite` because the full CDP client crates pull in far more
//! than three commands need.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    page: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Browser {
    /// Starts headless Chromium on `url` with the flags this machine needs.
    pub fn open(url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
            ])
            .args(["--remote-debugging-port=0", "--window-size=1400,1000"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium is installed by scripts/deps.sh");
        // Chromium prints its DevTools endpoint on stderr.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(ws.to_string());
                }
            }
        });
        let browser_ws = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium printed its DevTools endpoint");
        let port = browser_ws
            .split(':')
            .nth(2)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let targets: Value = {
            let agent = super::harness::agent();
            agent
                .get(&format!("http://127.0.0.1:{port}/json/list"))
                .call()
                .unwrap()
                .body_mut()
                .read_json()
                .unwrap()
        };
        let page_ws = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (page, _) = tungstenite::connect(page_ws).unwrap();
        let mut b = Browser {
            child,
            _profile: profile,
            page,
            next_id: 1,
        };
        b.call("Page.enable", json!({}));
        b.call("Page.navigate", json!({ "url": url }));
        b
    }

    /// Sends a command and returns its result, skipping events.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.page
            .send(Message::text(
                json!({ "id": id, "method": method, "params": params }).to_string(),
            ))
            .unwrap();
        loop {
            let msg = self.page.read().unwrap();
            let Message::Text(text) = msg else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates an expression (promises awaited) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.try_eval(expression);
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    fn try_eval(&mut self, expression: &str) -> Value {
        self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
        )
    }

    /// Polls an expression until it is true (an exception, as while the
    /// page is still loading, counts as not yet).
    pub fn wait_until(&mut self, what: &str, expression: &str, timeout: Duration) {
        let started = Instant::now();
        while self.try_eval(expression)["result"]["value"] != Value::Bool(true) {
            assert!(
                started.elapsed() < timeout,
                "page: timed out waiting for {what} ({expression})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn screenshot(&mut self, path: &std::path::Path) {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
