//! A real Redis for tests: a private `redis-server` on a free port when one is installed, else
//! `REDIS_URL` with a unique key prefix. With `COMPACTOR_REQUIRE_REDIS_TESTS=1` (CI) a missing Redis
//! fails the test instead of skipping it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub url: String,
    pub prefix: String,
    port: Option<u16>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A running Redis, or `None` (test skipped) when there is none and CI does not require one.
    pub fn start() -> Option<Self> {
        let prefix = format!("test{}", std::process::id() as u64 * 1000 + rand_suffix());
        let dir = tempfile::tempdir().unwrap();
        if which("redis-server") {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut server =
                Self { url: format!("redis://127.0.0.1:{port}"), prefix, port: Some(port), child: None, dir };
            server.spawn();
            return Some(server);
        }
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Some(Self { url, prefix, port: None, child: None, dir });
        }
        assert!(
            std::env::var("COMPACTOR_REQUIRE_REDIS_TESTS").is_err(),
            "Redis tests are required here but neither redis-server nor REDIS_URL is available"
        );
        eprintln!("skipped: no redis-server installed and no REDIS_URL");
        None
    }

    fn spawn(&mut self) {
        let port = self.port.expect("own server");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut connection) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (only a server this test started).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn can_restart(&self) -> bool {
        self.port.is_some()
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str()).unwrap().get_connection().unwrap()
    }

    /// Every key under this test's prefix.
    pub fn keys(&self) -> Vec<String> {
        let mut connection = self.connection();
        redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection).unwrap()
    }

    /// The TOML that points compactor at this Redis.
    pub fn config(&self) -> String {
        format!("[session]\nstore = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"{}\"\n", self.url, self.prefix)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 % 1000)
        .unwrap_or(0)
}
