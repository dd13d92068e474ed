//! HTTP for the dashboard tests: a blocking HTTP/1.1 client of a few
//! lines (the tests make plain requests to two local servers: the node's
//! `--http` port and chromedriver), and a WebDriver session driving
//! Debian's headless Chromium through chromedriver.
//!
//! (A WebDriver crate, fantoccini, brought about forty crates, the URL
//! and Unicode stacks among them, for five REST calls.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// One request; returns the status and the body. `Connection: close`, so
/// the body is what comes until the server closes.
pub fn request(method: &str, addr: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    // Read the head, then the body by its length: chromedriver keeps the
    // connection open whatever `Connection: close` says.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).unwrap_or_else(|e| panic!("{method} {path} at {addr}: {e}"));
        assert!(n > 0, "{method} {path} at {addr}: closed before the head");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let header = |name: &str| {
        head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_owned()))
    };
    let mut body = raw.split_off(head_end);
    match header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) => {
            while body.len() < len {
                let n = s.read(&mut buf).unwrap_or_else(|e| panic!("{method} {path} at {addr}: {e}"));
                assert!(n > 0, "{method} {path} at {addr}: closed inside the body");
                body.extend_from_slice(&buf[..n]);
            }
        }
        None => {
            s.read_to_end(&mut body).unwrap_or_else(|e| panic!("{method} {path} at {addr}: {e}"));
        }
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    (status, if chunked { dechunk(&body) } else { body })
}

pub fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    request("GET", addr, path, headers, None)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// chromedriver and one browser session, both ended on drop.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
}

/// Says loudly that the browser test did not run, on stdout and stderr
/// through their handles (libtest captures `println!` of passing tests);
/// `scripts/test.sh` fails CI on this line.
pub fn skip(why: &str) {
    let line = format!("skipped: needs Chromium for the dashboard test: {why}");
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Why the browser cannot run here (no Chromium, no chromedriver, or it
/// would not start), for the test's `skipped:` line.
pub fn chromium_missing() -> Option<String> {
    ["/usr/bin/chromium", "/usr/bin/chromedriver"]
        .into_iter()
        .find(|p| !Path::new(p).exists())
        .map(|p| format!("{p} is missing (apt-get install chromium chromium-driver; scripts/setup.sh does)"))
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session
    /// of `width`×`height`; `Err` says why it could not.
    pub fn start(width: u32, height: u32) -> Result<Browser, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
        let driver = super::dies_with_test(&mut Command::new("/usr/bin/chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("chromedriver: {e}"))?;
        let addr = format!("127.0.0.1:{port}");
        let mut b = Browser { driver, addr, session: String::new() };
        let up = super::wait_for(Duration::from_secs(30), || TcpStream::connect(&b.addr).ok().map(|_| ()));
        up.ok_or("chromedriver did not listen within 30 s")?;
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            // As root (CI), Chromium needs --no-sandbox; /dev/shm may be small.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", format!("--window-size={width},{height}")],
        }}}});
        let (status, body) = request("POST", &b.addr, "/session", &[], Some(&caps.to_string()));
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("chromedriver answered {status} {body:?}: {e}"))?;
        match v["value"]["sessionId"].as_str() {
            Some(id) if status == 200 => b.session = id.to_owned(),
            _ => return Err(format!("Chromium did not start: {status} {}", v["value"]["message"])),
        }
        Ok(b)
    }

    fn call(&self, method: &str, what: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        let (status, text) = request(method, &self.addr, &path, &[], body.map(|b| b.to_string()).as_deref());
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("WebDriver {what}: {status} {text:?}: {e}"));
        assert_eq!(status, 200, "WebDriver {what}: {v}");
        v["value"].clone()
    }

    pub fn goto(&self, url: &str) {
        self.call("POST", "url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub fn eval(&self, script: &str) -> Value {
        self.call("POST", "execute/sync", Some(json!({ "script": script, "args": [] })))
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &Path) {
        let b64 = self.call("GET", "screenshot", None);
        std::fs::write(path, base64_decode(b64.as_str().expect("screenshot is base64"))).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request("DELETE", &self.addr, &format!("/session/{}", self.session), &[], None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

pub fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, &c| acc << 6 | u32::from(val(c))) << (6 * (4 - chunk.len()));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
