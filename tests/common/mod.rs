//! Shared test harness: the fake upstream, the real compactor binary, and an HTTP client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod agents;
pub mod fake;
pub mod provider;
pub mod redis_server;
pub mod strict;
pub mod window;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[allow(unused_imports)]
pub use fake::{FakeUpstream, Pacing, Received, Reply};

/// A running compactor binary, started with a temporary TOML config on port 0.
pub struct Compactor {
    pub addr: SocketAddr,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Compactor {
    /// Starts compactor pointing both upstreams at `fake`, plus `extra` TOML.
    pub fn start(fake: &FakeUpstream, extra: &str) -> Self {
        Self::start_with(&format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n{extra}", fake.url()), &[])
    }

    /// Starts compactor with exactly this TOML and these environment variables.
    pub fn start_with(toml: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compactor.toml");
        let toml = format!("listen = \"127.0.0.1:0\"\n{toml}");
        std::fs::write(&path, toml).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_compactor"));
        command.arg("--config").arg(&path).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (key, _) in std::env::vars() {
            if key.starts_with("COMPACTOR_") {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("start compactor");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let logs = logs.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(at) = line.find("listening on ") {
                        let _ = tx.send(line[at + 13..].trim().to_string());
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(addr) => addr.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                panic!("compactor did not start: {:?}", logs.lock().unwrap());
            }
        };
        Self { addr, child, logs, _dir: dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits until a log line contains `needle`.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.logs().into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            assert!(Instant::now() < deadline, "no log line with {needle:?}: {:?}", self.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn terminate(&self) {
        // SAFETY-free: libc::kill only sends a signal to our own child.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with arguments to completion (for `--check-config` and friends).
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_compactor"));
    for (key, _) in std::env::vars() {
        if key.starts_with("COMPACTOR_") {
            command.env_remove(key);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let output = command.args(args).envs(env.iter().copied()).current_dir(dir.path()).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A request with headers and a body, ready to send.
pub fn request(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(body.into())).unwrap()
}

/// The response with its whole body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub async fn send(request: Request<Full<Bytes>>) -> Answer {
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("answer within 30 s")
        .expect("response");
    collect(response).await
}

pub async fn collect(response: Response<Incoming>) -> Answer {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("whole body").to_bytes();
    Answer { status: parts.status, headers: parts.headers, body }
}

/// Reads the next data frame of a streamed body, within `within`.
pub async fn next_chunk(body: &mut Incoming, within: Duration) -> Option<Bytes> {
    loop {
        let frame = tokio::time::timeout(within, body.frame()).await.expect("a chunk in time")?;
        if let Ok(data) = frame.expect("frame").into_data() {
            return Some(data);
        }
    }
}

/// A small chat completions body.
pub fn chat_body(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"Say hello"}}],"temperature":0.10000000000000001,"stream":{stream}}}"#
    )
}

/// A small Anthropic messages body.
pub fn messages_body(stream: bool) -> String {
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":32000,"system":[{{"type":"text","text":"You are terse.","cache_control":{{"type":"ephemeral"}}}}],"messages":[{{"role":"user","content":"Say hello"}}],"stream":{stream}}}"#
    )
}
