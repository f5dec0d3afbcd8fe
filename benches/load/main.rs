//! Load benchmark: what compactor costs in front of a fast upstream, next to nginx measured in
//! the same run, so every figure can be read as a ratio to a reference proxy.
//!
//! `scripts/bench-load` (or `cargo bench --bench load`) starts an in-process upstream stub, a
//! private nginx reverse proxy (see `proxies.rs` for its configuration) and the release compactor
//! binary, both proxies pointed at the stub, and drives the same load at three targets in turn,
//! phase by phase: `direct` (the stub itself), `nginx`, `compactor`.
//!
//! - Cores: the bench process (generator, pacer and stub) is pinned to one CPU, each proxy to
//!   another (`taskset`); compactor gets `TOKIO_WORKER_THREADS=1`, nginx one worker. By default
//!   the bench takes the first CPU it may use and the proxies the last.
//! - Priority: on a machine shared with builds, the bench and both proxies (which inherit it)
//!   run at nice -20 when the bench may raise its priority, so a proxy woken by a request runs
//!   at once instead of after a neighbour's time slice. With scheduler autogroups (Linux's
//!   default), nice only counts inside a session's group, so `scripts/bench-load` starts the
//!   bench in a session of its own and the bench gives that session's group the same nice
//!   (never the caller's: run directly, the bench leaves its group alone). Neighbours then get
//!   almost no CPU during the closed-loop seconds; `LOAD_NICE=0` is the gentle choice. The
//!   report says how much CPU other processes still took in each phase.
//! - Rounds: the low-rate phases (`small`, `stream`) run `LOAD_ROUNDS` times, direct first and
//!   the two proxies taking turns to go second, so each round measures both in the same host
//!   state. At 50 req/s a proxy's added latency moves by 0.05 ms or more with what the host's other
//!   work left in the caches, between runs tens of seconds apart: the report gives compactor's
//!   distance to nginx round by round and judges the median of those paired differences (as
//!   `scripts/latency-rig` does); the table's absolute figures are all rounds together.
//! - Open loop (no coordinated omission): request `i` is due at `start + i / rate`; a pacer
//!   thread dispatches each request at its due time whatever the earlier ones are doing, and
//!   latency runs from the *due* time to the last byte (and, for streams, the first byte) of the
//!   response. One second of warm-up before each measured run is not recorded.
//! - Closed loop: `LOAD_CONCURRENCY` workers send back to back for half of `LOAD_SECONDS`.
//! - CPU per request: utime + stime of the proxy's process tree over the measured window
//!   (per-thread schedstat nanoseconds, or /proc/PID/stat ticks if a thread exited), divided by
//!   the requests completed in it.
//! - Start: each proxy's first request is sent the moment it is ready (compactor: its `/readyz`
//!   answers 200; nginx: it listens), then 99 more one by one.
//! - Memory: VmRSS and VmHWM of each proxy's process tree, after start, after 100 requests, at
//!   the end of each phase, and at the end.
//!
//! Phases (`LOAD_PHASES`, comma-separated; all by default):
//! - `small`: the small chat body (or `LOAD_BODY` at `LOAD_PATH`) at `LOAD_RATE`;
//! - `stream`: the same chat body with `"stream":true`, the stub answering with SSE and pausing
//!   10 ms after the first event; reports the time to the first byte;
//! - `closed`: the small body, closed loop, one core per proxy;
//! - `large`: per conversation of `LOAD_LARGE`, at `LOAD_LARGE_RATE`: the warm next turn of one
//!   session (the recorded conversation plus one new exchange, the same session id each time),
//!   then the cold first turn of a new session each time (a new session id and a marker in the
//!   first user message; the tool outputs stay the same texts, so token counts may be cached:
//!   the cold figure excludes tokenization, as issue 11's target does).
//!
//! Settings (environment, or arguments after `--`, which win):
//!
//! | env                 | argument          | default                                        |
//! |---------------------|-------------------|------------------------------------------------|
//! | `LOAD_SECONDS`      | `--seconds N`     | 10 (each measured open-loop phase; closed loop half) |
//! | `LOAD_RATE`         | `--rate N`        | 50 (requests per second, small bodies and streams) |
//! | `LOAD_LARGE_RATE`   | `--large-rate N`  | 20 (requests per second, 800 KB conversations) |
//! | `LOAD_LARGE`        | `--large LIST`    | `claude-code,chat` (also `codex`; `all`, `none`) |
//! | `LOAD_PHASES`       | `--phases LIST`   | `small,stream,closed,large`                    |
//! | `LOAD_ROUNDS`       | `--rounds N`      | 5 (rounds of the `small` and `stream` phases)  |
//! | `LOAD_CONCURRENCY`  | `--concurrency N` | 32 (closed-loop workers)                       |
//! | `LOAD_BODY`         | `--body FILE`     | a ~300-byte chat completions body              |
//! | `LOAD_PATH`         | `--path P`        | `/v1/chat/completions`                         |
//! | `LOAD_CONFIG_EXTRA` | `--extra TOML`    | none: TOML merged into compactor's config      |
//! | `LOAD_NGINX`        | `--nginx PATH`    | `nginx` on the PATH or in /usr/sbin; `off` for none |
//! | `LOAD_PIN`          | `--pin on/off`    | `on` when the bench may use two CPUs or more   |
//! | `LOAD_BENCH_CPU`    | `--bench-cpu N`   | the first CPU this process may use             |
//! | `LOAD_PROXY_CPU`    | `--proxy-cpu N`   | the last CPU this process may use              |
//! | `LOAD_NICE`         | `--nice N`        | -20 as root, else unchanged: the nice value of the bench and both proxies |
//!
//! Inherited `COMPACTOR_*` variables are removed from compactor's environment so runs are
//! reproducible; configure it through `LOAD_CONFIG_EXTRA`. The bench always sets `listen`, both
//! upstreams and `log.level` (warnings only, plus the `listening on` line) over whatever it says.
//!
//! `cargo test --all-targets` also runs this binary (without `--bench`): it then does nothing.

mod drive;
mod figures;
mod procfs;
mod proxies;
mod report;
mod scenario;
mod settings;
mod stub;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Runtime;

use drive::Target;
use procfs::{Machine, Memory, TreeCpu};
use proxies::Proxy;
use report::{LoadMemory, Outcome, Phase, PhaseKind, Report, RoundFigures, Run, StartProbe, fmt_rate};
use scenario::{Conversation, STREAM_PAUSE, Scenario};
use settings::Settings;

/// Open-loop warm-up before each measured run (not recorded).
const WARMUP: Duration = Duration::from_secs(1);
/// Requests one by one after a proxy starts.
const START_REQUESTS: u64 = 100;

/// How the run was set up, for the report.
struct Setup {
    load_before: String,
    /// What happened to the priority of the bench's scheduler group.
    autogroup: String,
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
    match run(&settings) {
        Ok(report) => report.print(),
        Err(message) => {
            eprintln!("load bench: {message}");
            std::process::exit(1);
        }
    }
}

/// What the phases share: the generator's runtime and the three targets.
struct Bench<'a> {
    settings: &'a Settings,
    runtime: Runtime,
    stub: SocketAddr,
    proxies: Vec<Proxy>,
    /// Each proxy's largest memory at a phase's end.
    under_load: Vec<Option<Memory>>,
}

fn run(settings: &Settings) -> Result<Report, String> {
    let load_before = procfs::load_average();
    let mut autogroup = "unchanged".to_string();
    if let Some(nice) = settings.nice {
        procfs::renice_self(nice)?;
        autogroup = procfs::renice_own_autogroup(nice);
    }
    let setup = Setup { load_before, autogroup };
    if let Some((bench_cpu, _)) = settings.pins {
        procfs::pin_self(bench_cpu)?;
    }
    let stub = stub::start()?;
    // The generator gets one thread, like the stub: both on the bench's CPU.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("load generator runtime: {e}"))?;
    let proxy_cpu = settings.pins.map(|(_, proxy)| proxy);
    let small = Arc::new(Scenario::fixed(&settings.path, settings.body.clone(), Duration::ZERO));

    // Start each proxy and send its first requests right away, before any other load.
    let mut bench = Bench { settings, runtime, stub, proxies: Vec::new(), under_load: Vec::new() };
    let mut starts = Vec::new();
    if let Some(nginx) = &settings.nginx {
        eprintln!("load bench: starting nginx ({})", nginx.display());
        let proxy = Proxy::nginx(nginx, stub, proxy_cpu)?;
        starts.push(bench.start_probe(&proxy, &small));
        bench.proxies.push(proxy);
    }
    eprintln!("load bench: starting compactor");
    let proxy = Proxy::compactor(stub, &settings.extra, proxy_cpu)?;
    starts.push(bench.start_probe(&proxy, &small));
    bench.proxies.push(proxy);
    bench.under_load = vec![None; bench.proxies.len()];

    let mut phases = Vec::new();
    let small_title = format!("small chat body @{} req/s", fmt_rate(settings.rate));
    let small_title = if settings.body_source.starts_with("the small") {
        small_title
    } else {
        format!("{} ({})", small_title, settings.body_source)
    };
    if settings.has("small") {
        phases.push(bench.open_phase(PhaseKind::Small, small_title, None, &small, settings.rate, settings.rounds));
    }
    if settings.has("stream") {
        let stream = Arc::new(Scenario::fixed(
            "/v1/chat/completions",
            Bytes::from_static(scenario::SMALL_STREAM_BODY.as_bytes()),
            STREAM_PAUSE,
        ));
        let title = format!("streamed small chat body @{} req/s", fmt_rate(settings.rate));
        phases.push(bench.open_phase(PhaseKind::Stream, title, None, &stream, settings.rate, settings.rounds));
    }
    if settings.has("closed") {
        phases.push(bench.closed_phase(&small));
    }
    if settings.has("large") {
        for fixture in &settings.large {
            let conversation = Conversation::load(fixture)?;
            let rate = fmt_rate(settings.large_rate);
            let warm = Arc::new(Scenario::next_turn(fixture, &conversation));
            let title = format!("800 KB {}, warm next turn @{rate} req/s", fixture.label);
            phases.push(bench.open_phase(PhaseKind::Warm, title, Some(fixture.key), &warm, settings.large_rate, 1));
            drop(warm);
            let cold = Arc::new(Scenario::new_session(fixture, &conversation));
            let title = format!("800 KB {}, cold first turn of a new session @{rate} req/s", fixture.label);
            phases.push(bench.open_phase(PhaseKind::Cold, title, Some(fixture.key), &cold, settings.large_rate, 1));
        }
    }

    let memory = bench
        .proxies
        .iter()
        .zip(&bench.under_load)
        .map(|(proxy, under_load)| {
            // VmHWM is kept lazily by the kernel: never report a peak below an RSS we read.
            let largest_read = under_load.map_or(0, |m| m.rss_kib);
            let end = Memory::of_tree(proxy.pid).map(|m| Memory { peak_kib: m.peak_kib.max(largest_read), ..m });
            LoadMemory { target: proxy.name, under_load: *under_load, end }
        })
        .collect();
    let has_nginx = bench.proxies.iter().any(|p| p.name == "nginx");
    for proxy in &mut bench.proxies {
        proxy.stop();
    }
    let about = about(settings, &setup);
    Ok(Report { about, phases, starts, memory, has_nginx })
}

impl Bench<'_> {
    /// The targets of every phase, in order: the stub itself, then each proxy.
    fn targets(&self) -> Vec<(&'static str, SocketAddr, Option<&Proxy>)> {
        std::iter::once(("direct", self.stub, None))
            .chain(self.proxies.iter().map(|p| (p.name, p.addr, Some(p))))
            .collect()
    }

    fn start_probe(&self, proxy: &Proxy, scenario: &Scenario) -> StartProbe {
        let idle = Memory::of_tree(proxy.pid);
        let latencies = drive::one_by_one(&self.runtime, &Target::new(proxy.addr), scenario, START_REQUESTS);
        let after_100 = Memory::of_tree(proxy.pid);
        let first = latencies.first().cloned().unwrap_or_else(|| Err("no request sent".into()));
        let mut tail: Vec<Duration> = latencies.iter().skip(90).filter_map(|r| r.as_ref().ok().copied()).collect();
        tail.sort();
        let hundredth = tail.get(tail.len() / 2).copied();
        StartProbe {
            target: proxy.name,
            start_to_listening: proxy.start_to_listening,
            start_to_ready: proxy.start_to_ready,
            first,
            hundredth,
            idle,
            after_100,
        }
    }

    /// Runs `work` against a target and measures the CPU the proxy and the machine used.
    fn measured(
        &self,
        proxy: Option<&Proxy>,
        work: impl FnOnce() -> Outcome,
    ) -> (Outcome, Option<(Duration, bool)>, Option<procfs::CpuShare>) {
        let cpu_before = proxy.map(|p| TreeCpu::now(p.pid));
        let machine_before = Machine::now();
        let outcome = work();
        let cpu_after = proxy.map(|p| TreeCpu::now(p.pid));
        let machine_after = Machine::now();
        let (proxy_cpu, proxy_ticks) = match (&cpu_before, &cpu_after) {
            (Some(before), Some(after)) => (Some(after.since(before)), after.ticks().saturating_sub(before.ticks())),
            _ => (None, 0),
        };
        let share = match (machine_before, machine_after) {
            (Some(before), Some(after)) => Some(after.share_since(&before, proxy_ticks)),
            _ => None,
        };
        (outcome, proxy_cpu, share)
    }

    fn after_phase(&mut self) {
        for (proxy, under_load) in self.proxies.iter().zip(self.under_load.iter_mut()) {
            if let Some(now) = Memory::of_tree(proxy.pid) {
                *under_load = Some(under_load.map_or(now, |m| m.max(now)));
            }
        }
    }

    /// Runs an open-loop phase `rounds` times: in each round the stub first, then the proxies,
    /// whose order turns round by round (whichever goes second meets the host a little later).
    fn open_phase(
        &mut self,
        kind: PhaseKind,
        title: String,
        fixture: Option<&'static str>,
        scenario: &Arc<Scenario>,
        rate: f64,
        rounds: usize,
    ) -> Phase {
        let total = (rate * self.settings.seconds).round().max(1.0) as u64;
        let warmup = (rate * WARMUP.as_secs_f64()).round().max(1.0) as u64;
        let mut runs: Vec<Run> = Vec::new();
        let mut by_round = Vec::new();
        for round in 0..rounds {
            let mut targets = self.targets();
            if round % 2 == 1 {
                targets[1..].reverse();
            }
            let mut this_round = Vec::new();
            for (name, addr, proxy) in targets {
                eprintln!(
                    "load bench: {title}: round {} of {rounds}: {name}: {total} requests in {:.1} s (+{:.0} s warm-up), {} B bodies",
                    round + 1,
                    self.settings.seconds,
                    WARMUP.as_secs_f64(),
                    scenario.body_len()
                );
                let target = Target::new(addr);
                let tag = format!("{name}-{}", fixture.unwrap_or("small"));
                let _ = drive::open_loop(&self.runtime, &target, scenario, &tag, rate, warmup);
                let (outcome, proxy_cpu, share) = self.measured(proxy, || {
                    Outcome::Open(drive::open_loop(&self.runtime, &target, scenario, &tag, rate, total))
                });
                let run = Run { target: name, outcome, proxy_cpu, share };
                this_round.push(RoundFigures::of(&run));
                // Kept in the first round's order, the one the table lists.
                match runs.iter_mut().find(|r| r.target == name) {
                    Some(all) => all.absorb(run, round),
                    None => runs.push(run),
                }
            }
            by_round.push(this_round);
        }
        self.after_phase();
        Phase { kind, title, fixture, runs, rounds: by_round }
    }

    fn closed_phase(&mut self, scenario: &Arc<Scenario>) -> Phase {
        let duration = Duration::from_secs_f64(self.settings.seconds / 2.0);
        let workers = self.settings.concurrency;
        let title = format!("one core, {workers} connections, closed loop ({:.1} s)", duration.as_secs_f64());
        let mut runs = Vec::new();
        for (name, addr, proxy) in self.targets() {
            eprintln!("load bench: {title}: {name}");
            let target = Target::new(addr);
            let (outcome, proxy_cpu, share) = self.measured(proxy, || {
                Outcome::Closed(drive::closed_loop(&self.runtime, &target, scenario, name, workers, duration))
            });
            runs.push(Run { target: name, outcome, proxy_cpu, share });
        }
        self.after_phase();
        Phase { kind: PhaseKind::Closed, title, fixture: None, runs, rounds: Vec::new() }
    }
}

/// The lines that say what ran where: commit, machine, pinning, versions, the command.
fn about(settings: &Settings, setup: &Setup) -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpus = settings.cpus;
    let pinning = match settings.pins {
        Some((bench, proxy)) => format!(
            "load generator and stub on CPU {bench}; each proxy on CPU {proxy} (compactor with TOKIO_WORKER_THREADS=1, nginx with one worker)"
        ),
        None => "nothing pinned".into(),
    };
    let nice = procfs::own_nice().map_or("unknown".into(), |n| n.to_string());
    let nginx = match &settings.nginx {
        Some(path) => format!("{} ({})", proxies::nginx_version(path), path.display()),
        None => "not run".into(),
    };
    let given: Vec<String> =
        settings.given.iter().map(|(env, value)| format!("{env}={}", shell_quote(value))).collect();
    let command = match std::env::var("LOAD_INVOKED_AS") {
        Ok(script) => script,
        Err(_) => "cargo bench --bench load".into(),
    };
    let command = if given.is_empty() { command } else { format!("{} {command}", given.join(" ")) };
    vec![
        format!(
            "compactor load bench, commit {commit}{}, {date}",
            if dirty { " (with uncommitted changes)" } else { "" }
        ),
        format!(
            "machine: {cpus} CPUs (nproc), {}, Linux {}; load average {} before, {} after",
            procfs::cpu_model(),
            procfs::kernel(),
            setup.load_before,
            procfs::load_average()
        ),
        format!("pinning: {pinning}"),
        format!("priority: nice {nice} (bench and proxies), {}", setup.autogroup),
        format!("reference: {nginx}"),
        format!("command: {command}"),
        format!(
            "open loop: {} s measured per target and phase after {} s warm-up, latency from the scheduled send; closed loop {} s",
            settings.seconds,
            WARMUP.as_secs_f64(),
            settings.seconds / 2.0
        ),
    ]
}

/// Quotes a value for a POSIX shell when it needs it.
fn shell_quote(value: &str) -> String {
    if value.chars().all(|c| c.is_ascii_alphanumeric() || "-_./,=:".contains(c)) {
        value.to_string()
    } else if !value.contains('\'') && !value.contains('\n') {
        format!("'{value}'")
    } else {
        format!("$'{}'", value.replace('\\', "\\\\").replace('\'', "\\'").replace('\n', "\\n"))
    }
}
