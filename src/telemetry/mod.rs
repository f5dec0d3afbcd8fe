//! Logs and metrics: tracing set up from `[log]`, a Prometheus recorder for `GET /metrics`, the
//! per-request log line, and a limit on repeated warnings.

pub mod metric;
pub mod request;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use crate::config::{LogConfig, LogFormat};

/// Installs the global tracing subscriber. Logs go to stdout; they never carry headers or bodies.
pub fn init_logging(config: &LogConfig) {
    let filter = config.level.env_filter();
    // Colour only on a terminal: piped logs are read by machines.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let result = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests, embedding) keeps the first subscriber.
    drop(result);
}

/// Installs the global Prometheus recorder and describes every metric compactor emits.
pub fn init_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new().set_buckets(&metric::SECONDS_BUCKETS)?.install_recorder()?;
    metric::describe();
    metric::present_at_start();
    Ok(handle)
}

/// Lets a warning through at most once per interval, so a down dependency cannot flood the logs.
pub struct RateLimited {
    interval_ms: u64,
    next_ms: AtomicU64,
    epoch: Instant,
}

impl RateLimited {
    pub fn new(interval: Duration) -> Self {
        Self { interval_ms: interval.as_millis() as u64, next_ms: AtomicU64::new(0), epoch: Instant::now() }
    }

    /// True when this warning may be written now.
    pub fn ready(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self.next_ms.compare_exchange(next, now + self.interval_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}
