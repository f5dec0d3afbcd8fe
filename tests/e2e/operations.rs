//! Running compactor: configuration layering and errors, health and metrics endpoints, graceful
//! shutdown, the healthcheck subcommand.

use std::time::Duration;

use crate::common::*;

/// A configuration file with `toml` in a temporary directory (kept while the first value lives).
fn config_file(toml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, toml).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn check_config_prints_defaults_file_values_and_environment_overrides() {
    let (_dir, path) = config_file("[upstream]\nopenai = \"http://file:1\"\nanthropic = \"http://file:2\"\n");
    let (code, out, err) = run_binary(
        &["--config", &path, "--check-config"],
        &[("COMPACTOR_UPSTREAM__ANTHROPIC", "http://env:3"), ("COMPACTOR_LIMITS__MAX_BODY_BYTES", "77")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("openai = \"http://file:1\""), "{out}");
    assert!(out.contains("anthropic = \"http://env:3\""), "{out}");
    assert!(out.contains("max_body_bytes = 77"), "{out}");
    assert!(out.contains("listen = \"127.0.0.1:8787\""), "{out}");
}

#[test]
fn the_config_file_can_come_from_the_environment() {
    let (_dir, path) = config_file("listen = \"0.0.0.0:9999\"\n");
    let (code, out, _) = run_binary(&["--check-config"], &[("COMPACTOR_CONFIG", &path)]);
    assert_eq!(code, Some(0));
    assert!(out.contains("listen = \"0.0.0.0:9999\""), "{out}");
}

#[test]
fn bad_values_and_unknown_keys_stop_the_start_naming_each_key() {
    let (_dir, path) = config_file("[upstream]\nconnect_timeout_ms = \"soon\"\ntypo_key = 1\n");
    let (code, _, err) = run_binary(&["--config", &path], &[("COMPACTOR_LIMITS__MAX_BODY_BYTES", "lots")]);
    assert_eq!(code, Some(2));
    assert!(err.contains("`upstream.connect_timeout_ms`"), "{err}");
    assert!(err.contains("`upstream.typo_key`"), "{err}");
    assert!(err.contains("unknown key"), "{err}");
    assert!(err.contains("`limits.max_body_bytes`"), "{err}");
    assert!(err.contains("COMPACTOR_LIMITS__MAX_BODY_BYTES"), "the environment variable is named: {err}");
}

#[test]
fn an_explicit_config_file_that_does_not_exist_is_an_error() {
    let (code, _, err) = run_binary(&["--config", "/nonexistent/compactor.toml", "--check-config"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("nonexistent"), "{err}");
}

#[test]
fn the_shipped_config_file_is_valid_and_matches_the_defaults() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/compactor.toml");
    let (code, from_file, err) = run_binary(&["--config", shipped, "--check-config"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let (_, defaults, _) = run_binary(&["--check-config"], &[]);
    assert_eq!(from_file, defaults, "config/compactor.toml must document the built-in defaults");
}

/// A named pipe in a temporary directory: compactor's tokenizer load at start opens it for reading
/// (`COMPACTOR_TEST_TOKENIZER_GATE`) and waits there until the test opens it for writing.
#[cfg(unix)]
struct TokenizerGate {
    _dir: tempfile::TempDir,
    path: String,
}

#[cfg(unix)]
impl TokenizerGate {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer-gate").to_str().unwrap().to_string();
        let made = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(made.success(), "mkfifo {path}");
        Self { _dir: dir, path }
    }

    /// compactor in front of a fake upstream, with its tokenizer load held at a new gate.
    async fn proxy() -> (Self, FakeUpstream, ProxyProcess) {
        let (gate, fake) = (Self::new(), FakeUpstream::start().await);
        let toml = format!("[upstream]\nopenai = \"{}\"\n", fake.url());
        let proxy = ProxyProcess::start_listening(&toml, &[("COMPACTOR_TEST_TOKENIZER_GATE", &gate.path)]);
        assert!(!proxy.logs().iter().any(|line| line.contains("tokenizer tables loaded")));
        (gate, fake, proxy)
    }

    /// Lets the load go: opening the pipe's writing end releases its reader.
    async fn open(&self) {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || std::fs::OpenOptions::new().write(true).open(path).unwrap()).await.unwrap();
    }
}

#[cfg(unix)]
#[tokio::test]
async fn readiness_says_starting_until_the_tokenizer_tables_are_loaded_and_ready_after() {
    let (gate, _fake, proxy) = TokenizerGate::proxy().await;
    proxy.wait_for_log("tokenizer tables wait for their gate").await;
    // Listening and alive, and certainly without the tables: not ready, however often asked.
    for _ in 0..3 {
        let early = send(request("GET", &proxy.url("/readyz"), &[], "")).await;
        assert_eq!(early.status, 503, "before the tables");
        assert_eq!(early.json()["status"], "starting");
        assert_eq!(send(request("GET", &proxy.url("/healthz"), &[], "")).await.status, 200, "alive while starting");
    }
    gate.open().await;
    proxy.wait_for_log("tokenizer tables loaded").await;
    let ready = send(request("GET", &proxy.url("/readyz"), &[], "")).await;
    assert_eq!(ready.status, 200, "once they are loaded");
    assert_eq!(ready.json()["status"], "ready");
}

#[cfg(unix)]
#[tokio::test]
async fn the_first_request_while_the_tables_load_is_answered_and_counted() {
    let (_gate, _fake, proxy) = TokenizerGate::proxy().await;
    assert_eq!(send(request("GET", &proxy.url("/readyz"), &[], "")).await.status, 503);
    // The load at start is held; a request that arrives now loads the tables itself (off the
    // async workers) rather than wait for it, and is counted.
    let answer =
        send(request("POST", &proxy.url("/v1/chat/completions"), &[("authorization", "Bearer k")], chat_body(false)))
            .await;
    assert_eq!(answer.status, 200);
    assert!(answer.header("x-compactor-tokens-before").is_some_and(|t| t.parse::<u32>().unwrap() > 0));
    // Readiness follows the tables, not the thread that was to load them.
    let ready = send(request("GET", &proxy.url("/readyz"), &[], "")).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["status"], "ready");
}

/// Transparent huge pages are off for the process (each fault of freed-then-reused memory would
/// zero 2 MiB: a fifth of a large turn's CPU), whatever the host's setting.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_process_runs_without_transparent_huge_pages() {
    let fake = FakeUpstream::start().await;
    let proxy = ProxyProcess::start_listening(&format!("[upstream]\nopenai = \"{}\"\n", fake.url()), &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid())).unwrap();
    let thp = status.lines().find_map(|line| line.strip_prefix("THP_enabled:")).map(str::trim);
    assert_eq!(thp, Some("0"), "the kernel reports THP_enabled for every process (Linux 5.0+)");
    assert!(!proxy.logs().iter().any(|line| line.contains("transparent huge pages")), "no warning");
}

#[tokio::test]
async fn health_readiness_and_metrics_are_answered_locally() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    assert_eq!(send(request("GET", &proxy.url("/healthz"), &[], "")).await.status, 200);
    // Ready once the tokenizer tables are loaded, a moment after listening.
    assert!(eventually(async || send(request("GET", &proxy.url("/readyz"), &[], "")).await.status == 200).await);
    send(request("POST", &proxy.url("/v1/chat/completions"), &[("authorization", "Bearer k")], chat_body(false))).await;
    send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(true))).await;
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains(r#"compactor_requests_total{route="chat_completions",status="200"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"compactor_requests_total{route="messages",status="200"} 1"#), "{metrics}");
    for name in [
        "compactor_upstream_ttfb_seconds_bucket",
        "compactor_upstream_duration_seconds_bucket",
        "compactor_overhead_seconds_bucket",
        "compactor_request_bytes_total",
        "compactor_response_bytes_total",
        "compactor_active_streams",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    // The caches' sizes are read at the scrape: the credential's tenant hash is cached by now.
    let tenants = metrics.lines().find_map(|l| l.strip_prefix(r#"compactor_cache_entries{cache="tenants"} "#));
    assert!(tenants.is_some_and(|n| n.parse::<f64>().unwrap() >= 1.0), "{metrics}");
    assert!(
        fake.received().iter().all(|r| !r.path_and_query.contains("healthz") && !r.path_and_query.contains("metrics"))
    );
}

#[tokio::test]
async fn sigterm_lets_a_stream_in_flight_finish_and_refuses_new_connections() {
    let fake = FakeUpstream::builder().pacing(Pacing::Delay(Duration::from_millis(150))).start().await;
    let mut proxy = ProxyProcess::start(&fake, "[shutdown]\ndrain_timeout_ms = 10000\n");
    let response = client()
        .request(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(true)))
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = next_chunk(&mut body, Duration::from_secs(5)).await.unwrap();

    proxy.terminate();
    proxy.wait_for_log("shutting down").await;
    let refused = tokio::net::TcpStream::connect(proxy.addr).await;
    assert!(refused.is_err(), "new connections must be refused while draining");

    let mut rest = first.to_vec();
    while let Some(chunk) = next_chunk(&mut body, Duration::from_secs(5)).await {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(String::from_utf8(rest).unwrap(), fake::anthropic_stream(&["Hel", "lo"]).concat());
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
}

#[tokio::test]
async fn the_healthcheck_subcommand_reports_a_live_proxy() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let listen = proxy.addr.to_string();
    let (code, _, err) = run_binary(&["healthcheck"], &[("COMPACTOR_LISTEN", &listen)]);
    assert_eq!(code, Some(0), "{err}");
    drop(proxy);
    let (code, _, _) = run_binary(&["healthcheck"], &[("COMPACTOR_LISTEN", &listen)]);
    assert_eq!(code, Some(1));
}

#[tokio::test]
async fn secrets_set_by_environment_never_appear_in_check_config_or_logs() {
    const TOKEN: &str = "admin-tok-7f3a9c";
    const TENANT: &str = "tenant-sec-51b2e8";
    const REDIS_PASSWORD: &str = "redis-pw-0c4d1e";
    let redis_url = format!("redis://app:{REDIS_PASSWORD}@127.0.0.1:6379");
    let env = [
        ("COMPACTOR_ADMIN__TOKEN", TOKEN),
        ("COMPACTOR_SESSION__TENANT_SECRET", TENANT),
        ("COMPACTOR_SESSION__REDIS_URL", redis_url.as_str()),
    ];
    let (code, out, err) = run_binary(&["--check-config"], &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("token = \"[redacted]\""), "{out}");
    assert!(out.contains("tenant_secret = \"[redacted]\""), "{out}");
    assert!(out.contains("redis_url = \"redis://app:[redacted]@127.0.0.1:6379\""), "{out}");
    for secret in [TOKEN, TENANT, REDIS_PASSWORD] {
        assert!(!out.contains(secret) && !err.contains(secret), "{secret} printed by --check-config");
    }

    // Debug logging prints the effective configuration at start: still without the secrets.
    let fake = FakeUpstream::start().await;
    let toml = format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n[log]\nlevel = \"debug\"\n", fake.url());
    let proxy = ProxyProcess::start_with(&toml, &env);
    proxy.wait_for_log("effective configuration").await;
    send(request("POST", &proxy.url("/v1/chat/completions"), &[("authorization", "Bearer k")], chat_body(false))).await;
    // The token from the environment is the one in force.
    let admin =
        send(request("GET", &proxy.url("/admin/sessions/x"), &[("authorization", &format!("Bearer {TOKEN}"))], ""))
            .await;
    assert_eq!(admin.status, 404, "{}", admin.text());
    proxy.wait_for_log("route=chat_completions").await;
    let logs = proxy.logs().join("\n");
    assert!(logs.contains("[redacted]"), "the configuration was logged");
    for secret in [TOKEN, TENANT, REDIS_PASSWORD] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
    }
}

/// The variables Kubernetes injects into every pod of a namespace holding a Service named
/// `compactor` (port 8787), and those of a Service named `compactor-redis`.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("COMPACTOR_PORT", "tcp://10.96.0.12:8787"),
    ("COMPACTOR_SERVICE_HOST", "10.96.0.12"),
    ("COMPACTOR_SERVICE_PORT", "8787"),
    ("COMPACTOR_SERVICE_PORT_HTTP", "8787"),
    ("COMPACTOR_PORT_8787_TCP", "tcp://10.96.0.12:8787"),
    ("COMPACTOR_PORT_8787_TCP_ADDR", "10.96.0.12"),
    ("COMPACTOR_PORT_8787_TCP_PORT", "8787"),
    ("COMPACTOR_PORT_8787_TCP_PROTO", "tcp"),
    ("COMPACTOR_REDIS_SERVICE_HOST", "10.96.0.13"),
    ("COMPACTOR_REDIS_SERVICE_PORT", "6379"),
    ("COMPACTOR_REDIS_PORT", "tcp://10.96.0.13:6379"),
    ("COMPACTOR_REDIS_PORT_6379_TCP", "tcp://10.96.0.13:6379"),
    ("COMPACTOR_REDIS_PORT_6379_TCP_ADDR", "10.96.0.13"),
    ("COMPACTOR_REDIS_PORT_6379_TCP_PORT", "6379"),
    ("COMPACTOR_REDIS_PORT_6379_TCP_PROTO", "tcp"),
];

#[tokio::test]
async fn it_starts_beside_a_kubernetes_service_named_compactor_and_still_reads_its_own_variables() {
    let fake = FakeUpstream::start().await;
    let mut env = SERVICE_LINKS.to_vec();
    env.push(("COMPACTOR_LIMITS__MAX_BODY_BYTES", "50"));
    env.push(("COMPACTOR_LIMITS_REWRITE_BUDGET_MS", "5"));
    let proxy =
        ProxyProcess::start_with(&format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n", fake.url()), &env);
    assert_eq!(send(request("GET", &proxy.url("/healthz"), &[], "")).await.status, 200);
    // The known key set by the environment applies: a chat body over 50 bytes is refused.
    let refused = send(request("POST", &proxy.url("/v1/chat/completions"), &[], chat_body(false))).await;
    assert_eq!(refused.status, 413, "{}", refused.text());

    let warning = proxy.wait_for_log("COMPACTOR_LIMITS_REWRITE_BUDGET_MS").await;
    assert!(warning.contains("COMPACTOR_LIMITS__REWRITE_BUDGET_MS"), "the meant variable is named: {warning}");
    let logs = proxy.logs();
    assert_eq!(logs.iter().filter(|l| l.contains("not a configuration key")).count(), 1, "{logs:?}");
    assert!(logs.iter().all(|l| !l.contains("COMPACTOR_PORT") && !l.contains("SERVICE_HOST")), "{logs:?}");
}

#[test]
fn check_config_ignores_service_links_and_warns_about_a_misspelt_key_on_stderr() {
    let mut env = SERVICE_LINKS.to_vec();
    env.push(("COMPACTOR_UPSTREAM__OPENIA", "http://typo:1"));
    let (code, out, err) = run_binary(&["--check-config"], &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("openai = \"https://api.openai.com\""), "{out}");
    assert!(!out.contains("10.96.0.12"), "{out}");
    assert!(err.contains("COMPACTOR_UPSTREAM__OPENIA") && err.contains("COMPACTOR_UPSTREAM__OPENAI"), "{err}");
    assert!(!err.contains("http://typo:1"), "values are never echoed: {err}");
}

/// Every metric family compactor describes, read from its source (`describe_*!("name", ...)`).
pub fn described_metric_families() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/telemetry");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for part in source.split("describe_").skip(1) {
            let Some(rest) = ["counter!(", "gauge!(", "histogram!("].iter().find_map(|m| part.strip_prefix(m)) else {
                continue;
            };
            let name = rest.trim_start().trim_start_matches('"').split('"').next().unwrap();
            names.push(name.to_string());
        }
    }
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn a_scrape_right_after_start_shows_every_family_with_its_series_at_zero() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let families = described_metric_families();
    assert!(families.len() >= 20, "{families:?}");
    for family in &families {
        assert!(metrics.contains(&format!("# HELP {family} ")), "no HELP for {family}:\n{metrics}");
        assert!(metrics.contains(&format!("# TYPE {family} ")), "no TYPE for {family}:\n{metrics}");
        let sample = metrics.lines().any(|line| {
            !line.starts_with('#')
                && line.strip_prefix(family.as_str()).is_some_and(|rest| {
                    rest.starts_with(['{', ' ']) || rest.starts_with("_bucket") || rest.starts_with("_count")
                })
        });
        assert!(sample, "no series for {family}:\n{metrics}");
    }
    assert!(metrics.contains(r#"compactor_requests_total{route="chat_completions",status="200"} 0"#), "{metrics}");
    assert!(metrics.contains(r#"compactor_compactions_total{trigger="overflow",outcome="summarized"} 0"#), "{metrics}");
    assert!(metrics.contains("compactor_session_store_breaker_open 0"), "{metrics}");
    for cache in ["tokens", "sessions", "tenants", "prefixes"] {
        assert!(metrics.contains(&format!("compactor_cache_bytes{{cache=\"{cache}\"}} 0")), "{metrics}");
        assert!(metrics.contains(&format!("compactor_cache_entries{{cache=\"{cache}\"}} 0")), "{metrics}");
    }
}

#[tokio::test]
async fn secrets_that_look_like_numbers_are_read_as_the_text_given_and_never_quoted() {
    // Leading zeros: read as a number, this token would lose them (and the message would quote it).
    const TOKEN: &str = "0031415926535";
    const TENANT: &str = "2.71828182845900";
    let env = [("COMPACTOR_ADMIN__TOKEN", TOKEN), ("COMPACTOR_SESSION__TENANT_SECRET", TENANT)];
    let (code, out, err) = run_binary(&["--check-config"], &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("token = \"[redacted]\"") && out.contains("tenant_secret = \"[redacted]\""), "{out}");
    for secret in ["31415926535", "2.718"] {
        assert!(!out.contains(secret) && !err.contains(secret), "{secret} printed: {out}\n{err}");
    }
    // The token in force is the text as written, leading zeros and all.
    let fake = FakeUpstream::start().await;
    let proxy =
        ProxyProcess::start_with(&format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\n", fake.url()), &env);
    assert_eq!(proxy.get_with_token("/admin/sessions/x", TOKEN).await.status, 404);
    assert_eq!(proxy.get_with_token("/admin/sessions/x", "31415926535").await.status, 401);

    // A header list that parses as a number or a boolean is refused naming the key, not the value.
    for value in ["8675309", "true"] {
        let (code, out, err) = run_binary(&["--check-config"], &[("COMPACTOR_TRACE__HEADERS", value)]);
        assert_ne!(code, Some(0), "{out}");
        assert!(err.contains("trace.headers"), "{err}");
        assert!(!err.contains(&format!("`{value}`")) && !err.contains("8675309"), "{err}");
    }
    // In a file, a secret must be a string: refused without its value.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compactor.toml");
    std::fs::write(&path, "[admin]\ntoken = 27182818284\n").unwrap();
    let (code, _, err) = run_binary(&["--config", path.to_str().unwrap(), "--check-config"], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("admin.token") && !err.contains("27182818284"), "{err}");
}

#[test]
fn every_redis_credential_form_is_redacted_and_a_trace_endpoint_with_credentials_is_refused() {
    for url in [
        "redis+unix:///run/redis.sock?pass=pw-unix-41",
        "redis+unix:///run/redis.sock?db=1&password=pw-unix-42&user=app",
        "unix:///run/redis.sock?user=app&pass=pw-unix-43",
        "redis://:pw-tcp-44@127.0.0.1:6379/0",
        "redis://app:pw-tcp-45@127.0.0.1:6379/0?password=pw-tcp-46",
    ] {
        let (code, out, err) = run_binary(&["--check-config"], &[("COMPACTOR_SESSION__REDIS_URL", url)]);
        assert_eq!(code, Some(0), "{url}: {err}");
        assert!(out.contains("[redacted]"), "{out}");
        assert!(!out.contains("pw-") && !err.contains("pw-"), "{url} printed its password:\n{out}\n{err}");
    }
    for endpoint in
        ["http://otlp:pw-otlp-47@127.0.0.1:4318/v1/traces", "https://collector.example/v1/traces?api_key=pw-otlp-48"]
    {
        let (code, out, err) = run_binary(&["--check-config"], &[("COMPACTOR_TRACE__ENDPOINT", endpoint)]);
        assert_ne!(code, Some(0), "{endpoint} accepted: {out}");
        assert!(err.contains("trace.endpoint") && err.contains("trace.headers"), "{err}");
        assert!(!out.contains("pw-otlp") && !err.contains("pw-otlp"), "{endpoint} printed:\n{out}\n{err}");
    }
}
