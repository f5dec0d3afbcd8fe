//! The real compactor binary, run as a process: started on port 0 with a temporary config, its
//! logs collected, stopped with it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Answer, request, send};
use super::fake::FakeUpstream;

/// A running compactor binary, started with a temporary TOML config on port 0. (Named for what
/// it is, a process: `compactor::compaction::Compactor` is the library's compaction engine.)
pub struct ProxyProcess {
    pub addr: SocketAddr,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// Starts compactor pointing both upstreams at `fake`, plus `extra` TOML.
    pub fn start(fake: &FakeUpstream, extra: &str) -> Self {
        Self::start_with(&format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n{extra}", fake.url()), &[])
    }

    /// A fresh fake upstream and a compactor in front of it, with `extra` TOML.
    pub async fn with_fake(extra: &str) -> (FakeUpstream, Self) {
        let fake = FakeUpstream::start().await;
        let proxy = Self::start(&fake, extra);
        (fake, proxy)
    }

    /// Two replicas in front of `fake` with the same configuration (a shared store, say).
    pub fn replicas(fake: &FakeUpstream, extra: &str) -> (Self, Self) {
        (Self::start(fake, extra), Self::start(fake, extra))
    }

    /// Starts compactor with exactly this TOML and these environment variables, and waits until
    /// it has started (its tokenizer tables loaded), as a load balancer waits for `/readyz`.
    pub fn start_with(toml: &str, env: &[(&str, &str)]) -> Self {
        let proxy = Self::start_listening(toml, env);
        proxy.wait_started();
        proxy
    }

    /// Starts compactor with `toml` as it is: an upstream on loopback without its `*_cache` key
    /// is priced as a local server and asked for its window, as a user's would be
    /// ([`ProxyProcess::start_with`] prices the fakes as the cloud providers they stand for).
    pub fn start_as_shipped(toml: &str, env: &[(&str, &str)]) -> Self {
        let proxy = Self::start_exactly(toml, env);
        proxy.wait_started();
        proxy
    }

    /// Waits until `/readyz` no longer says `starting` (ready, degraded, or shutting down).
    fn wait_started(&self) {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut answer = String::new();
            if let Ok(mut stream) = std::net::TcpStream::connect(self.addr) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = stream.write_all(b"GET /readyz HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
                let _ = stream.read_to_string(&mut answer);
            }
            if answer.starts_with("HTTP/1.1") && !answer.contains("\"starting\"") {
                return;
            }
            assert!(Instant::now() < deadline, "compactor did not finish starting: {:?}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts compactor with this TOML and these environment variables, and returns as soon as
    /// it listens (it may still be starting). The fakes and simulators listen on loopback and
    /// stand for cloud providers: each upstream whose `*_cache` key `toml` does not set is priced
    /// as the provider it stands for, not as the local server its address would make it.
    pub fn start_listening(toml: &str, env: &[(&str, &str)]) -> Self {
        Self::start_exactly(&priced_as_the_cloud(toml), env)
    }

    /// Starts compactor with exactly this TOML; see [`ProxyProcess::start_listening`].
    fn start_exactly(toml: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compactor.toml");
        let toml = format!("listen = \"127.0.0.1:0\"\n{toml}");
        std::fs::write(&path, toml).unwrap();
        let mut command = binary(env);
        command.arg("--config").arg(&path).stdout(Stdio::piped()).stderr(Stdio::piped());
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

    /// POSTs `body` as JSON to `path` with these headers, and reads the whole answer.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Answer {
        send(request("POST", &self.url(path), headers, serde_json::to_vec(body).unwrap())).await
    }

    /// GETs `path` with a bearer token (the admin API) and reads the whole answer.
    pub async fn get_with_token(&self, path: &str, token: &str) -> Answer {
        self.call_with_token("GET", path, token).await
    }

    /// Sends an empty `method` request to `path` with a bearer token (the admin API).
    pub async fn call_with_token(&self, method: &str, path: &str, token: &str) -> Answer {
        send(request(method, &self.url(path), &[("authorization", &format!("Bearer {token}"))], "")).await
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

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary with exactly these `COMPACTOR_` variables (none inherited from the test's own).
fn binary(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_compactor"));
    for (key, _) in std::env::vars() {
        if key.starts_with("COMPACTOR_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    command
}

/// Runs the binary with arguments to completion (for `--check-config` and friends).
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let output = binary(env).args(args).current_dir(dir.path()).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// User plus system CPU time the process has used so far (Linux `/proc`).
pub fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// `toml` with the cloud preset of each upstream whose address would make it local and whose
/// `*_cache` key is not set, and (unless the test says otherwise) no window asked of an upstream
/// a test prices `local`: the fakes answer model calls only. A document that does not parse (a
/// test of a refused file) as it is.
pub fn priced_as_the_cloud(toml: &str) -> String {
    let Ok(mut document) = toml.parse::<toml::Table>() else { return toml.to_string() };
    let Some(toml::Value::Table(upstream)) = document.get_mut("upstream") else { return toml.to_string() };
    for (url, key, preset) in [
        ("openai", "openai_cache", "openai"),
        ("anthropic", "anthropic_cache", "anthropic"),
        ("gemini", "gemini_cache", "gemini"),
        ("azure", "azure_cache", "openai"),
        ("openai", "azure_cache", "openai"),
    ] {
        if upstream.contains_key(url) && !upstream.contains_key(key) {
            upstream.insert(key.to_string(), toml::Value::String(preset.to_string()));
        }
    }
    upstream.entry("ask_local_window").or_insert(toml::Value::Boolean(false));
    document.to_string()
}
