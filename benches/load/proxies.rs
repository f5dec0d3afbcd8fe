//! The proxies under test, each a child process pinned to the proxy core: compactor (the
//! release binary, one tokio worker) and a private nginx instance configured as an operator
//! would for an LLM API, both in front of the same stub.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a proxy may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Proxy {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// compactor's pid, or nginx's master's (its worker is a child).
    pub pid: u32,
    /// From spawning the process to its listening socket.
    pub start_to_listening: Duration,
    /// From spawning the process to its readiness (compactor: `/readyz` answers 200, once its
    /// tokenizer tables are loaded; nginx: listening).
    pub start_to_ready: Duration,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Runs `program` pinned to `cpu` (through `taskset`, which execs it: the pid stays the program's).
fn pinned(program: &Path, cpu: Option<usize>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpu.to_string()).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Echoes a child's output to our stderr with its name, line by line, for the whole run (so the
/// child never blocks on a full pipe), passing each line to `on_line` first.
fn drain(name: &'static str, stream: impl Read + Send + 'static, on_line: impl Fn(&str) -> bool + Send + 'static) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if !on_line(&line) {
                eprintln!("{name}: {line}");
            }
        }
    });
}

impl Proxy {
    /// Starts compactor with its configuration in a temp dir: `extra` (TOML) merged under the
    /// bench's own keys (listen, upstreams, log level).
    pub fn compactor(stub: SocketAddr, extra: &str, cpu: Option<usize>) -> Result<Self, String> {
        let upstream = format!("http://{stub}");
        let mut config: toml::Table =
            extra.parse().map_err(|error| format!("LOAD_CONFIG_EXTRA is not valid TOML: {error}"))?;
        config.insert("listen".into(), "127.0.0.1:0".into());
        for (table, key, value) in [
            ("upstream", "openai", upstream.as_str()),
            ("upstream", "anthropic", upstream.as_str()),
            // Per-request logs off (they cost; nginx's access log is off too), but keep the
            // `listening on` line.
            ("log", "level", "warn,compactor::server=info"),
        ] {
            let entry = config.entry(table).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let section =
                entry.as_table_mut().ok_or_else(|| format!("LOAD_CONFIG_EXTRA: `{table}` must be a table"))?;
            section.insert(key.into(), value.into());
        }
        let toml = toml::to_string(&config).map_err(|e| format!("serialize config: {e}"))?;
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let path = dir.path().join("compactor.toml");
        std::fs::write(&path, &toml).map_err(|e| format!("write config: {e}"))?;

        let mut command = pinned(Path::new(env!("CARGO_BIN_EXE_compactor")), cpu);
        command.arg("--config").arg(&path).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Inherited settings would make runs differ; configure compactor through LOAD_CONFIG_EXTRA.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("COMPACTOR_") {
                command.env_remove(key);
            }
        }
        if cpu.is_some() {
            // One core, one worker: compactor has no setting for it, tokio reads this.
            command.env("TOKIO_WORKER_THREADS", "1");
        } else {
            command.env_remove("TOKIO_WORKER_THREADS");
        }
        let spawned = Instant::now();
        let mut child = command.spawn().map_err(|e| format!("start compactor: {e}"))?;
        let (tx, rx) = mpsc::channel::<(Instant, SocketAddr)>();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        for stream in [stdout.map(|s| Box::new(s) as Box<dyn Read + Send>), stderr.map(|s| Box::new(s) as _)]
            .into_iter()
            .flatten()
        {
            let tx = tx.clone();
            drain("compactor", stream, move |line| {
                // Text or JSON logs: the address runs to the next space or quote.
                let addr = line
                    .find("listening on ")
                    .and_then(|at| line[at + 13..].split(|c: char| c.is_whitespace() || c == '"').next()?.parse().ok());
                addr.is_some_and(|addr| tx.send((Instant::now(), addr)).is_ok())
            });
        }
        drop(tx);
        let (listening, addr) = match rx.recv_timeout(START_TIMEOUT) {
            Ok(ready) => ready,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("compactor did not start; config:\n{toml}"));
            }
        };
        let pid = child.id();
        let start_to_listening = listening.duration_since(spawned);
        // A load balancer sends traffic once the readiness probe passes; so does the bench.
        let deadline = spawned + START_TIMEOUT;
        while !ready(addr) {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("compactor did not become ready".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let start_to_ready = spawned.elapsed();
        Ok(Self { name: "compactor", addr, pid, start_to_listening, start_to_ready, child, _dir: dir })
    }

    /// Starts a private nginx: its own prefix, temp dirs and pid file in a temp dir, in the
    /// foreground, on a free loopback port.
    pub fn nginx(binary: &Path, stub: SocketAddr, cpu: Option<usize>) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        // Started as root, nginx's worker runs as `nobody` and must reach its temp dirs.
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
        }
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, nginx_config(dir.path(), addr, stub)).map_err(|e| format!("write nginx.conf: {e}"))?;

        let mut command = pinned(binary, cpu);
        command
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg("stderr")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let spawned = Instant::now();
        let mut child = command.spawn().map_err(|e| format!("start nginx ({}): {e}", binary.display()))?;
        if let Some(stderr) = child.stderr.take() {
            drain("nginx", stderr, |_| false);
        }
        // nginx says nothing when ready: it is once its socket accepts connections and its
        // worker, which serves them, exists.
        let deadline = spawned + START_TIMEOUT;
        let listening = loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
                && crate::procfs::process_tree(child.id()).len() > 1
            {
                break Instant::now();
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("nginx exited at start: {status} (its messages are above)"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("nginx did not start listening".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let pid = child.id();
        let start_to_listening = listening.duration_since(spawned);
        Ok(Self { name: "nginx", addr, pid, start_to_listening, start_to_ready: start_to_listening, child, _dir: dir })
    }

    /// Stops the process tree: SIGTERM to the root (nginx's master then stops its worker), and
    /// SIGKILL to whatever is left after a few seconds.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let tree = crate::procfs::process_tree(self.pid);
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in tree.iter().skip(1) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

/// Whether compactor's `/readyz` answers 200 (one plain HTTP/1.1 exchange on a new connection).
fn ready(addr: SocketAddr) -> bool {
    use std::io::Write;
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET /readyz HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// nginx in front of an LLM API as a careful operator would run it: bodies of agent
/// conversations accepted and kept in memory, responses streamed as they come (SSE), HTTP/1.1
/// keep-alive to the upstream, long read timeouts, Codex's `session_id` header passed on.
/// No access log: compactor's per-request log is off in this bench too.
fn nginx_config(dir: &Path, listen: SocketAddr, stub: SocketAddr) -> String {
    let temp = |name: &str| -> PathBuf { dir.join(name) };
    format!(
        r#"# Written by benches/load (compactor's load bench) for one run.
daemon off;
master_process on;
# The bench pins nginx to one core: one worker.
worker_processes 1;
pid {pid};
error_log stderr warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    server_tokens off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 10000;
    # Agents resend their whole conversation: bodies of megabytes.
    client_max_body_size 32m;
    # Read a conversation whole, in memory (as compactor does), never into a temp file.
    client_body_buffer_size 1m;
    # Codex sends `session_id`.
    underscores_in_headers on;
    client_body_temp_path {client_body};
    proxy_temp_path {proxy};
    fastcgi_temp_path {fastcgi};
    uwsgi_temp_path {uwsgi};
    scgi_temp_path {scgi};

    upstream llm_api {{
        server {stub};
        keepalive 64;
        keepalive_requests 10000;
        keepalive_timeout 60s;
    }}

    server {{
        listen {listen};

        location / {{
            proxy_pass http://llm_api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Stream responses (SSE) as they arrive.
            proxy_buffering off;
            proxy_cache off;
            proxy_connect_timeout 10s;
            # Long generations, and long pauses between events.
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
        }}
    }}
}}
"#,
        pid = temp("nginx.pid").display(),
        client_body = temp("client_body").display(),
        proxy = temp("proxy").display(),
        fastcgi = temp("fastcgi").display(),
        uwsgi = temp("uwsgi").display(),
        scgi = temp("scgi").display(),
    )
}

/// The nginx to run: `LOAD_NGINX` (a path, or `off`), else `nginx` on the PATH or in /usr/sbin.
pub fn find_nginx(setting: Option<&str>) -> Result<Option<PathBuf>, String> {
    match setting {
        Some("off") => return Ok(None),
        Some(path) => {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(Some(path))
            } else {
                Err(format!("LOAD_NGINX: no file {}", path.display()))
            };
        }
        None => {}
    }
    let path_dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    Ok(path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin"), PathBuf::from("/usr/local/nginx/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file()))
}

/// `nginx -v` says `nginx version: nginx/1.22.1` on stderr.
pub fn nginx_version(binary: &Path) -> String {
    Command::new(binary)
        .arg("-v")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stderr).trim().trim_start_matches("nginx version: ").to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "nginx (unknown version)".into())
}
