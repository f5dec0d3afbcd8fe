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
        assert!(!required(), "Redis tests are required here but neither redis-server nor REDIS_URL is available");
        eprintln!("skipped: no redis-server installed and no REDIS_URL");
        None
    }

    /// A Redis this test can stop and start again (its own `redis-server`), or `None` (test
    /// skipped) when there is none; with `COMPACTOR_REQUIRE_REDIS_TESTS=1` a failure instead, as a
    /// shared `REDIS_URL` cannot be restarted.
    pub fn restartable() -> Option<Self> {
        let server = Self::start()?;
        if server.can_restart() {
            return Some(server);
        }
        assert!(!required(), "this Redis test restarts its server: it needs redis-server, REDIS_URL is not enough");
        eprintln!("skipped: this test restarts its Redis and only REDIS_URL is available");
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
    /// The sessions' keys. What compactor learned of each (upstream, model) is kept under the
    /// model's own key (`{model.…}`), no session's: left out here.
    pub fn keys(&self) -> Vec<String> {
        let mut connection = self.connection();
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection).unwrap();
        keys.into_iter().filter(|k| !k.contains("{model.")).collect()
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

/// Whether every Redis test must run (CI sets `COMPACTOR_REQUIRE_REDIS_TESTS=1`): a test that
/// cannot get the Redis it needs fails instead of skipping.
pub fn required() -> bool {
    std::env::var_os("COMPACTOR_REQUIRE_REDIS_TESTS").is_some()
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

/// A real three-node Redis Cluster on free ports (needs `redis-server` and `redis-cli`).
pub struct RedisCluster {
    pub urls: Vec<String>,
    pub prefix: String,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// `None` (skipped) when the binaries are missing and CI does not require Redis tests.
    pub fn start() -> Option<Self> {
        if !(which("redis-server") && which("redis-cli")) {
            assert!(!required(), "Redis Cluster tests are required here but redis-server/redis-cli are missing");
            eprintln!("skipped: no redis-server/redis-cli for a cluster");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut children = Vec::new();
        let mut urls = Vec::new();
        let mut nodes = Vec::new();
        for n in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let node_dir = dir.path().join(format!("n{n}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            children.push(child);
            urls.push(format!("redis://127.0.0.1:{port}"));
            nodes.push(format!("127.0.0.1:{port}"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for url in &urls {
            while redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).is_err() {
                assert!(Instant::now() < deadline, "cluster node did not come up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(status.success(), "cluster creation failed");
        // Wait until every slot is served.
        loop {
            let mut connection = redis::Client::open(urls[0].as_str()).unwrap().get_connection().unwrap();
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut connection).unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(Instant::now() < deadline + Duration::from_secs(10), "cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Self { urls, prefix: format!("cl{}", rand_suffix()), children, _dir: dir })
    }

    pub fn config(&self) -> String {
        format!(
            "[session]\nstore = \"redis\"\nredis_cluster = true\nredis_url = \"{}\"\nkey_prefix = \"{}\"\n",
            self.urls.join(","),
            self.prefix
        )
    }

    /// Which node holds a key of this prefix, as (node index, key), over every node.
    pub fn keys(&self) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        for (index, url) in self.urls.iter().enumerate() {
            let mut connection = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection).unwrap();
            // The models' learned values are no session's keys (see `RedisServer::keys`).
            found.extend(keys.into_iter().filter(|k| !k.contains("{model.")).map(|k| (index, k)));
        }
        found
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
