//! Load benchmark: how much latency and throughput compactor costs in front of a fast upstream.
//!
//! `cargo bench --bench load` (or `scripts/bench-load`) starts an in-process upstream stub that
//! answers every POST with a small fixed chat completion, starts the real compactor binary pointed
//! at it, and drives the same load twice: directly at the stub, then through compactor.
//!
//! - Open loop (no coordinated omission): request `i` is due at `start + i / rate`; a pacer thread
//!   dispatches each request at its due time whatever the earlier ones are doing, and latency runs
//!   from the *due* time to the last byte of the response body. 1 s of warm-up is not recorded.
//! - Closed loop: 32 workers send back to back for half the duration; reports the ceiling in req/s.
//!
//! Settings (environment, or arguments after `--`, which win):
//!
//! | env                 | argument        | default                          |
//! |---------------------|-----------------|----------------------------------|
//! | `LOAD_RATE`         | `--rate N`      | 500 (requests per second)        |
//! | `LOAD_SECONDS`      | `--seconds N`   | 10 (measured open-loop seconds)  |
//! | `LOAD_BODY`         | `--body FILE`   | a ~300-byte chat completions body |
//! | `LOAD_PATH`         | `--path P`      | `/v1/chat/completions`           |
//! | `LOAD_CONFIG_EXTRA` | `--extra TOML`  | none: TOML merged into compactor's config (e.g. `[session]` `store = "redis"`) |
//! | `LOAD_CONCURRENCY`  | `--concurrency N` | 32 (closed-loop workers)       |
//!
//! Inherited `COMPACTOR_*` variables are removed from compactor's environment so runs are
//! reproducible; configure it through `LOAD_CONFIG_EXTRA`. The bench always sets `listen`, both
//! upstreams and `log.level` (warnings only, plus the `listening on` line) over whatever it says.
//!
//! `cargo test --all-targets` also runs this binary (without `--bench`): it then does nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::runtime::Runtime;

/// A request that has not completed after this long counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Open-loop warm-up before each measured run (not recorded).
const WARMUP: Duration = Duration::from_secs(1);

const DEFAULT_BODY: &str = concat!(
    r#"{"model":"gpt-4o","messages":["#,
    r#"{"role":"system","content":"You are terse. Answer in one short sentence."},"#,
    r#"{"role":"user","content":"Say hello to the load benchmark."},"#,
    r#"{"role":"assistant","content":"Hello, load benchmark."},"#,
    r#"{"role":"user","content":"Say hello"}],"#,
    r#""temperature":0,"max_tokens":16,"stream":false,"user":"load-bench"}"#
);

const STUB_RESPONSE: &str = concat!(
    r#"{"id":"chatcmpl-loadbench","object":"chat.completion","created":1700000000,"#,
    r#""model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","#,
    r#""content":"Hello.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"#,
    r#""usage":{"prompt_tokens":42,"completion_tokens":2,"total_tokens":44},"#,
    r#""system_fingerprint":"fp_loadbench"}"#
);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Settings {
    rate: f64,
    seconds: f64,
    body: Bytes,
    body_source: String,
    path: String,
    extra: String,
    concurrency: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench targets without it.
    if !args.iter().any(|a| a == "--bench") {
        println!("load bench: skipped (run with cargo bench --bench load)");
        return;
    }
    let settings = match Settings::load(&args) {
        Ok(Some(settings)) => settings,
        Ok(None) => {
            println!("load bench: skipped (filtered out)");
            return;
        }
        Err(message) => {
            eprintln!("load bench: {message}");
            std::process::exit(2);
        }
    };
    run(&settings);
}

impl Settings {
    /// `Ok(None)` when a positional filter (as in `cargo bench rewrite`) excludes this bench.
    fn load(args: &[String]) -> Result<Option<Self>, String> {
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let mut rate = env("LOAD_RATE");
        let mut seconds = env("LOAD_SECONDS");
        let mut body = env("LOAD_BODY");
        let mut path = env("LOAD_PATH");
        let mut extra = env("LOAD_CONFIG_EXTRA");
        let mut concurrency = env("LOAD_CONCURRENCY");
        let mut filtered_out = false;
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
                _ => (arg.as_str(), None),
            };
            let slot = match name {
                "--bench" => continue,
                "--rate" => &mut rate,
                "--seconds" => &mut seconds,
                "--body" => &mut body,
                "--path" => &mut path,
                "--extra" => &mut extra,
                "--concurrency" => &mut concurrency,
                other if other.starts_with('-') => {
                    return Err(format!(
                        "unknown argument {other:?} (known: --rate --seconds --body --path \
                         --extra --concurrency)"
                    ));
                }
                filter => {
                    filtered_out |= !"load".contains(filter);
                    continue;
                }
            };
            let value = match inline {
                Some(value) => value,
                None => rest.next().cloned().ok_or_else(|| format!("{name} needs a value"))?,
            };
            *slot = Some(value);
        }
        if filtered_out {
            return Ok(None);
        }
        let number = |name: &str, value: Option<String>, default: f64| -> Result<f64, String> {
            match value {
                None => Ok(default),
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
                    _ => Err(format!("{name} must be a positive number, got {v:?}")),
                },
            }
        };
        let rate = number("rate", rate, 500.0)?;
        let seconds = number("seconds", seconds, 10.0)?;
        let concurrency = number("concurrency", concurrency, 32.0)?.round().max(1.0) as usize;
        let (body, body_source) = match body {
            Some(file) => {
                let bytes = std::fs::read(&file).map_err(|e| format!("cannot read body {file:?}: {e}"))?;
                (Bytes::from(bytes), file)
            }
            None => (Bytes::from_static(DEFAULT_BODY.as_bytes()), "default".into()),
        };
        let path = path.unwrap_or_else(|| "/v1/chat/completions".into());
        if !path.starts_with('/') {
            return Err(format!("path must start with '/', got {path:?}"));
        }
        Ok(Some(Self { rate, seconds, body, body_source, path, extra: extra.unwrap_or_default(), concurrency }))
    }
}

fn run(settings: &Settings) {
    let stub = start_stub();
    let compactor = Compactor::start(stub, &settings.extra);
    // The load generator gets one thread, like the stub; compactor runs its own multi-thread runtime.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("load generator runtime");

    let total = (settings.rate * settings.seconds).round().max(1.0) as u64;
    let warmup = (settings.rate * WARMUP.as_secs_f64()).round().max(1.0) as u64;
    let closed_for = Duration::from_secs_f64(settings.seconds / 2.0);
    let targets = [("direct", stub), ("compactor", compactor.addr)];

    let mut open = Vec::new();
    for (name, addr) in targets {
        eprintln!(
            "load bench: {name}: open loop, {} req/s for {:.1} s (+{:.0} s warm-up)",
            fmt_rate(settings.rate),
            settings.seconds,
            WARMUP.as_secs_f64()
        );
        let target = Target::new(addr, settings);
        let _ = open_loop(&runtime, &target, settings.rate, warmup);
        let before = Cpu::now(compactor.child.id());
        let result = open_loop(&runtime, &target, settings.rate, total);
        open.push((name, result, cpu_since(before)));
    }
    let mut closed = Vec::new();
    for (name, addr) in targets {
        eprintln!(
            "load bench: {name}: closed loop, {} workers for {:.1} s",
            settings.concurrency,
            closed_for.as_secs_f64()
        );
        let target = Target::new(addr, settings);
        let before = Cpu::now(compactor.child.id());
        let result = closed_loop(&runtime, &target, settings.concurrency, closed_for);
        closed.push((name, result, cpu_since(before)));
    }
    drop(compactor);

    report(settings, total, closed_for, &open, &closed);
}

fn report(
    settings: &Settings,
    total: u64,
    closed_for: Duration,
    open: &[(&str, OpenResult, Option<CpuUse>)],
    closed: &[(&str, ClosedResult, Option<CpuUse>)],
) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "compactor load bench: POST {} ({} B body, {}), {} CPUs, loopback",
        settings.path,
        settings.body.len(),
        settings.body_source,
        cpus
    );
    if !settings.extra.trim().is_empty() {
        println!("compactor config extra: {}", settings.extra.trim().replace('\n', " "));
    }
    println!(
        "open loop: {} req/s x {} s = {} requests, {} s warm-up not recorded; latency from scheduled \
         send to last body byte",
        fmt_rate(settings.rate),
        settings.seconds,
        total,
        WARMUP.as_secs_f64()
    );
    println!();
    println!(
        "{:<12}{:>10}{:>12}{:>10}{:>10}{:>10}{:>10}{:>8}",
        "", "rate", "achieved", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"
    );
    for (name, r, _) in open {
        println!(
            "{:<12}{:>10}{:>12.1}{:>10.3}{:>10.3}{:>10.3}{:>10.3}{:>8}",
            name,
            fmt_rate(settings.rate),
            r.throughput(),
            ms(r.hist.value_at_quantile(0.50)),
            ms(r.hist.value_at_quantile(0.90)),
            ms(r.hist.value_at_quantile(0.99)),
            ms(r.hist.max()),
            r.errors
        );
    }
    let (direct, through) = (&open[0].1, &open[1].1);
    let added = |q: f64| ms(through.hist.value_at_quantile(q)) - ms(direct.hist.value_at_quantile(q));
    let ratio = pct(through.throughput(), direct.throughput());
    println!("{:<12}{:>10}{:>12}{:>+10.3}{:>+10.3}{:>+10.3}", "added", "", "", added(0.50), added(0.90), added(0.99));
    println!("throughput compactor/direct: {ratio:.1} %");
    print_cpu(open.iter().map(|(name, _, cpu)| (*name, cpu)));
    println!(
        "generator dispatch lag (included above): direct p50 {:.3} / p99 {:.3} ms, compactor p50 \
         {:.3} / p99 {:.3} ms",
        ms(direct.lag.value_at_quantile(0.50)),
        ms(direct.lag.value_at_quantile(0.99)),
        ms(through.lag.value_at_quantile(0.50)),
        ms(through.lag.value_at_quantile(0.99)),
    );
    println!();
    println!("max throughput (closed loop, {} concurrent, {:.1} s):", settings.concurrency, closed_for.as_secs_f64());
    for (name, r, _) in closed {
        println!(
            "{:<12}{:>10.1} req/s   p50 {:.3} ms   p99 {:.3} ms   errors {}",
            name,
            r.throughput(),
            ms(r.hist.value_at_quantile(0.50)),
            ms(r.hist.value_at_quantile(0.99)),
            r.errors
        );
    }
    let closed_ratio = pct(closed[1].1.throughput(), closed[0].1.throughput());
    println!("compactor/direct: {closed_ratio:.1} %");
    print_cpu(closed.iter().map(|(name, _, cpu)| (*name, cpu)));
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "targets at {} req/s: added p50 {:.3} ms < 0.2 ms: {}; added p99 {:.3} ms < 1 ms: {}; \
         throughput {:.1} % >= 80 %: {}",
        fmt_rate(settings.rate),
        added(0.50),
        verdict(added(0.50) < 0.2),
        added(0.99),
        verdict(added(0.99) < 1.0),
        ratio,
        verdict(ratio >= 80.0)
    );
    for (name, r, _) in open {
        if let Some(first) = &r.first_error {
            println!("first error ({name}, open loop): {first}");
        }
    }
    for (name, r, _) in closed {
        if let Some(first) = &r.first_error {
            println!("first error ({name}, closed loop): {first}");
        }
    }
}

fn print_cpu<'a>(runs: impl Iterator<Item = (&'a str, &'a Option<CpuUse>)>) {
    for (name, cpu) in runs {
        let Some(c) = cpu else { continue };
        println!(
            "  CPU during {name:<10} (100 % = one core): bench {:>3.0} %, compactor {:>3.0} %, irq {:>3.0} %, \
             other processes {:>3.0} %{}",
            c.bench,
            c.compactor,
            c.irq,
            c.other,
            if c.other > 15.0 { "  <- machine busy: results disturbed" } else { "" }
        );
    }
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { 100.0 * part / whole } else { 0.0 }
}

fn fmt_rate(rate: f64) -> String {
    if rate.fract() == 0.0 { format!("{rate:.0}") } else { format!("{rate}") }
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

// ---------------------------------------------------------------------------------------------
// CPU accounting (Linux /proc; absent elsewhere): shows who used the CPUs during a run, so a run
// disturbed by other work on the machine can be told apart.

/// CPU time used during a run, in percent of one core.
struct CpuUse {
    /// This process: load generator, pacer and upstream stub.
    bench: f64,
    compactor: f64,
    /// Interrupt and softirq time: mostly loopback TCP processing, for all of the above (the
    /// kernel may also charge part of it to the process it interrupted).
    irq: f64,
    /// The rest of the busy time: other processes (a run next to a build is disturbed). A lower
    /// bound, since irq time already counted in a process's time is subtracted again.
    other: f64,
}

struct Cpu {
    at: Instant,
    busy: u64,
    irq: u64,
    bench: u64,
    compactor: u64,
    compactor_pid: u32,
}

impl Cpu {
    fn now(compactor_pid: u32) -> Option<Self> {
        let (busy, irq) = system_ticks()?;
        Some(Self {
            at: Instant::now(),
            busy,
            irq,
            bench: process_ticks("self")?,
            compactor: process_ticks(&compactor_pid.to_string())?,
            compactor_pid,
        })
    }
}

/// CPU use since `before` was taken.
fn cpu_since(before: Option<Cpu>) -> Option<CpuUse> {
    let before = before?;
    let after = Cpu::now(before.compactor_pid)?;
    // USER_HZ is 100 on every Linux that matters.
    let seconds = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let percent = |ticks: u64| ticks as f64 / 100.0 / seconds * 100.0;
    let bench = after.bench.saturating_sub(before.bench);
    let compactor = after.compactor.saturating_sub(before.compactor);
    let busy = after.busy.saturating_sub(before.busy);
    let irq = after.irq.saturating_sub(before.irq);
    Some(CpuUse {
        bench: percent(bench),
        compactor: percent(compactor),
        irq: percent(irq),
        other: percent(busy.saturating_sub(bench + compactor + irq)),
    })
}

/// Non-idle ticks of all CPUs and the irq + softirq part of them, from the first line of /proc/stat.
fn system_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8) // user nice system idle iowait irq softirq steal (guest is inside user)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let idle = fields.get(3)? + fields.get(4)?;
    let irq = fields.get(5)? + fields.get(6)?;
    Some((fields.iter().sum::<u64>() - idle, irq))
}

/// utime + stime of a process (all its threads), from /proc/PID/stat.
fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

// ---------------------------------------------------------------------------------------------
// Upstream stub

/// Starts the stub on its own OS thread and single-threaded runtime; it lives until the process
/// exits.
fn start_stub() -> SocketAddr {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("upstream-stub".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("stub runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind stub");
                tx.send(listener.local_addr().expect("stub address")).expect("report stub address");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service_fn(stub_answer))
                            .await;
                    });
                }
            });
        })
        .expect("spawn stub thread");
    rx.recv_timeout(Duration::from_secs(10)).expect("stub did not start")
}

async fn stub_answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    // Read the whole request body first, as a real upstream would.
    let _ = request.into_body().collect().await?;
    let mut response = Response::new(Full::new(Bytes::from_static(STUB_RESPONSE.as_bytes())));
    response.headers_mut().insert(CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Ok(response)
}

// ---------------------------------------------------------------------------------------------
// compactor child process

struct Compactor {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Compactor {
    fn start(stub: SocketAddr, extra: &str) -> Self {
        let upstream = format!("http://{stub}");
        let mut config: toml::Table = extra.parse().unwrap_or_else(|error| {
            eprintln!("load bench: LOAD_CONFIG_EXTRA is not valid TOML: {error}");
            std::process::exit(2);
        });
        config.insert("listen".into(), "127.0.0.1:0".into());
        for (table, key, value) in [
            ("upstream", "openai", upstream.as_str()),
            ("upstream", "anthropic", upstream.as_str()),
            // Per-request logs off (they cost), but keep the `listening on` line.
            ("log", "level", "warn,compactor::server=info"),
        ] {
            let entry = config.entry(table).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(section) = entry.as_table_mut() else {
                eprintln!("load bench: LOAD_CONFIG_EXTRA: `{table}` must be a table");
                std::process::exit(2);
            };
            section.insert(key.into(), value.into());
        }
        let toml = toml::to_string(&config).expect("serialize config");

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("compactor.toml");
        std::fs::write(&path, &toml).expect("write config");
        let mut command = Command::new(env!("CARGO_BIN_EXE_compactor"));
        command.arg("--config").arg(&path).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("COMPACTOR_") {
                command.env_remove(key);
            }
        }
        let mut child = command.spawn().expect("start compactor");
        let (tx, rx) = mpsc::channel::<Result<SocketAddr, String>>();
        let streams: [Box<dyn std::io::Read + Send>; 2] =
            [Box::new(child.stdout.take().expect("stdout")), Box::new(child.stderr.take().expect("stderr"))];
        for stream in streams {
            let tx = tx.clone();
            // Drain for the whole run so compactor never blocks on a full pipe; echo what it
            // says (warnings and errors only, at this log level) to our stderr.
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    // Text or JSON logs: the address runs to the next space or quote.
                    let addr = line.find("listening on ").and_then(|at| {
                        line[at + 13..].split(|c: char| c.is_whitespace() || c == '"').next()?.parse().ok()
                    });
                    match addr {
                        Some(addr) => {
                            let _ = tx.send(Ok(addr));
                        }
                        None => {
                            eprintln!("compactor: {line}");
                            let _ = tx.send(Err(line));
                        }
                    }
                }
            });
        }
        drop(tx);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut said = Vec::new();
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(addr)) => break addr,
                Ok(Err(line)) => said.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("compactor did not start; config:\n{toml}\noutput: {said:?}");
                }
            }
        };
        Self { addr, child, _dir: dir }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Load generation

#[derive(Clone)]
struct Target {
    client: HttpClient,
    uri: Uri,
    body: Bytes,
}

impl Target {
    fn new(addr: SocketAddr, settings: &Settings) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).build(connector);
        let uri = format!("http://{addr}{}", settings.path).parse().expect("target uri");
        Self { client, uri, body: settings.body.clone() }
    }

    /// One request, to the last byte of the response body; `Err` for non-2xx, connection errors
    /// and anything slower than `REQUEST_TIMEOUT`.
    async fn send(&self) -> Result<(), String> {
        let request = Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(AUTHORIZATION, "Bearer sk-load-bench")
            .body(Full::new(self.body.clone()))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| format!("request: {e:?}"))?;
            let status = response.status();
            let body = response.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
            if status.is_success() { Ok(()) } else { Err(status_error(status, &body)) }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!("no complete response within {REQUEST_TIMEOUT:?}")),
        }
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    format!("status {status}: {text}")
}

struct OpenResult {
    hist: Histogram<u64>,
    /// How late the generator dispatched each request (scheduled -> task running).
    lag: Histogram<u64>,
    completed: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
}

impl OpenResult {
    fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct Outcome {
    scheduled: Instant,
    dispatched: Instant,
    done: Instant,
    result: Result<(), String>,
}

/// Sends `count` requests, request `i` due at `start + i / rate`, each on its own task whatever
/// the others are doing. A pacer OS thread does the timing (the tokio timer has 1 ms granularity,
/// too coarse for 2 ms spacing) and hands each request to the runtime at its due time.
fn open_loop(runtime: &Runtime, target: &Target, rate: f64, count: u64) -> OpenResult {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
    let handle = runtime.handle().clone();
    let start = Instant::now() + Duration::from_millis(20);
    let pacer = {
        let target = target.clone();
        std::thread::spawn(move || {
            for i in 0..count {
                let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
                let now = Instant::now();
                if scheduled > now {
                    std::thread::sleep(scheduled - now);
                }
                let tx = tx.clone();
                let target = target.clone();
                handle.spawn(async move {
                    let dispatched = Instant::now();
                    let result = target.send().await;
                    let _ = tx.send(Outcome { scheduled, dispatched, done: Instant::now(), result });
                });
            }
        })
    };
    let mut result = OpenResult {
        hist: new_histogram(),
        lag: new_histogram(),
        completed: 0,
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
    };
    let mut last = start;
    runtime.block_on(async {
        // Ends when the pacer has finished and every request task has reported.
        while let Some(outcome) = rx.recv().await {
            last = last.max(outcome.done);
            let _ = result.lag.record(micros(outcome.dispatched.saturating_duration_since(outcome.scheduled)));
            match outcome.result {
                Ok(()) => {
                    result.completed += 1;
                    result.hist.saturating_record(micros(outcome.done.saturating_duration_since(outcome.scheduled)));
                }
                Err(error) => {
                    result.errors += 1;
                    result.first_error.get_or_insert(error);
                }
            }
        }
    });
    pacer.join().expect("pacer thread");
    // The run covers `count` slots of 1/rate each, or longer if the last response came late.
    let slots = Duration::from_secs_f64(count as f64 / rate);
    result.elapsed = last.saturating_duration_since(start).max(slots);
    result
}

struct ClosedResult {
    hist: Histogram<u64>,
    completed: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
}

impl ClosedResult {
    fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `workers` tasks each send back to back until `duration` has passed.
fn closed_loop(runtime: &Runtime, target: &Target, workers: usize, duration: Duration) -> ClosedResult {
    runtime.block_on(async {
        let start = Instant::now();
        let deadline = start + duration;
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let target = target.clone();
                tokio::spawn(async move {
                    let mut hist = new_histogram();
                    let (mut completed, mut errors, mut first_error) = (0u64, 0u64, None);
                    while Instant::now() < deadline {
                        let sent = Instant::now();
                        match target.send().await {
                            Ok(()) => {
                                completed += 1;
                                hist.saturating_record(micros(sent.elapsed()));
                            }
                            Err(error) => {
                                errors += 1;
                                first_error.get_or_insert(error);
                                // Do not spin on a dead target.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                    (hist, completed, errors, first_error)
                })
            })
            .collect();
        let mut result =
            ClosedResult { hist: new_histogram(), completed: 0, errors: 0, first_error: None, elapsed: Duration::ZERO };
        for task in tasks {
            let (hist, completed, errors, first_error) = task.await.expect("worker task");
            result.hist.add(&hist).expect("merge histograms");
            result.completed += completed;
            result.errors += errors;
            if let Some(error) = first_error {
                result.first_error.get_or_insert(error);
            }
        }
        result.elapsed = start.elapsed();
        result
    })
}
