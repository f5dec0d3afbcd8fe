//! The `compactor` binary: run the proxy, check its configuration, or probe its health.

// No function over 80 lines (`too-many-lines-threshold` in clippy.toml), as in the library.
#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use compactor::config::Config;
use compactor::server::{self, AppState};

// mimalloc: fewer instructions per allocation than glibc's malloc on the request path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for the process, before anything large is allocated. The
/// allocator gives freed memory back to the system and faults it in again on the next large
/// request; with huge pages each of those faults zeroes 2 MiB, and an 800 KB turn takes two or three
/// of them (`scripts/callgrind-turns BINARY claude-code warm|cold N native` shows the CPU per
/// turn either way). The error is logged once logging is up.
fn no_huge_pages() -> Option<std::io::Error> {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        return Some(error.into());
    }
    None
}

#[derive(Parser)]
#[command(
    version,
    about = "A context-managing reverse proxy for LLM agents",
    long_about = "A context-managing reverse proxy for LLM agents. Point an agent's base URL at it \
(Chat Completions, Anthropic Messages, OpenAI Responses): requests and responses pass through \
unchanged and streaming until compactor has a reason to touch them; old tool outputs are pruned, \
huge ones cut to head and tail, broken tool-call pairs repaired, and \"context length exceeded\" \
recovered by summarizing older history and retrying.",
    after_long_help = "Configuration, in layers: built-in defaults < the TOML file (--config PATH, \
else $COMPACTOR_CONFIG, else config/compactor.toml when present) < environment variables named \
COMPACTOR_ plus the key path with __ between levels (COMPACTOR_UPSTREAM__OPENAI=http://127.0.0.1:9000). \
config/compactor.toml documents every key with its default.\n\n\
The manual: docs/README.md in the source tree (getting started, configuration reference, \
operations, security); the README names the run and test commands."
)]
struct Cli {
    /// Configuration file (TOML). Default: config/compactor.toml when present.
    #[arg(long, env = "COMPACTOR_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Exit 0 when the compactor configured by `--config`/environment answers /healthz.
    Healthcheck,
}

fn main() -> ExitCode {
    let huge_pages = no_huge_pages();
    let cli = Cli::parse();
    let (config, warnings) = match Config::load(cli.config.as_deref()) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("compactor: {error}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        for warning in &warnings {
            eprintln!("compactor: warning: {warning}");
        }
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    compactor::allocator::set_purge_delay(config.limits.allocator_purge_delay.as_millis() as u64);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("compactor: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Some(Command::Healthcheck) => runtime.block_on(async {
            match compactor::healthcheck::check(config.listen, Duration::from_secs(3)).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(reason) => {
                    eprintln!("compactor: {reason}");
                    ExitCode::FAILURE
                }
            }
        }),
        None => {
            let result = runtime.block_on(run(config, warnings, huge_pages));
            // `run` returns by the drain deadline; work still running then (a request's rewrite
            // on a blocking thread, a stuck task) is abandoned, not waited for, as dropping the
            // runtime would.
            runtime.shutdown_background();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("compactor: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(config: Config, config_warnings: Vec<String>, huge_pages: Option<std::io::Error>) -> anyhow::Result<()> {
    // Only ring is compiled in, but rustls wants the choice made explicitly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let traces = compactor::telemetry::init_logging(&config.log, &config.trace);
    for warning in &config_warnings {
        tracing::warn!("{warning}");
    }
    if let Some(error) = huge_pages {
        tracing::warn!(%error, "cannot turn transparent huge pages off for this process");
    }
    for key in &config.upstream.local_presets {
        tracing::info!(
            key = %format!("upstream.{key}"),
            "an upstream on a loopback or private address: priced as a local inference server (the `local` cache \
             preset); set the key to choose another"
        );
    }
    // Secrets print as "[redacted]": the whole configuration is safe to log.
    tracing::debug!(config = ?config, "effective configuration");
    let metrics = compactor::telemetry::init_metrics()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let config = Arc::new(config);
    let state = Arc::new(AppState::new(config.clone(), Some(metrics))?);
    let listener = server::bind(config.listen).await?;
    let served = server::serve(listener, state, server::shutdown_signal()).await;
    if let Some(traces) = traces {
        // The exporter thread flushes what is queued (bounded by trace.export_timeout_ms).
        drop(tokio::task::spawn_blocking(move || traces.shutdown()).await);
    }
    served?;
    Ok(())
}
